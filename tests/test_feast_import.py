"""`materialize import-feast` against Feast itself (0.67, its own venv: throwaway/feast_venv.py).

Feast's own example (`feast init`, once per module) and a repository written here for what the
example lacks (a SparkSource table, field_mapping, arrays, two entities in one view, stream and
push sources, a type with no mapping, a warehouse source, a path with no data yet) are imported
through the command, and the files compared with expectations written out below; importing
again gives the same bytes; each kind of bad input gives its one line and writes nothing.
"""

from __future__ import annotations

import copy
import datetime as dt
import io
import json
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from feature_defs import load_definitions
from feature_defs.feast_import import FeastImportError, command, import_dump, report
from fm_config import QualityConf, RunConf
from fm_config.redis import RedisSettings
from jobs.cli import main
from throwaway import feast_venv

pytestmark = pytest.mark.install  # Feast runs from a venv of its own: `make test-fast` leaves these out


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return self.stderr.splitlines()


def import_cli(*args: str) -> Run:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["import-feast", *map(str, args)])
    return Run(code, out.getvalue(), err.getvalue())


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time: what an import must not touch."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def left_out_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("left out ("))
    return [line[2:] for line in lines[start + 1 :] if line.startswith("  ")]


def assert_left_out(stdout: str, expected: dict[str, str]) -> None:
    """Exactly the ``expected`` objects are left out, each once, with a reason saying the keyword."""
    found = left_out_lines(stdout)
    assert len(found) == len(expected), found
    for what, keyword in expected.items():
        (line,) = [line for line in found if line.startswith(what + ": ")]
        assert keyword in line[len(what) + 2 :], line


def import_cli_keeping_dump(*args: str) -> tuple[Run, dict | None]:
    """``import_cli``, and what Feast printed for the repository (None if it never got that far)."""
    dumps = []
    with pytest.MonkeyPatch.context() as mp:
        real = command.read_repo
        mp.setattr(command, "read_repo", lambda *a: dumps.append(real(*a)) or dumps[-1])
        run = import_cli(*args)
    return run, (dumps[0] if dumps else None)


@pytest.fixture(scope="module")
def feast_python() -> Path:
    return feast_venv.python()  # made by scripts/setup.sh --test, never by the suite


# --- Feast's own example -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def init_repo(tmp_path_factory, feast_python) -> Path:
    root = tmp_path_factory.mktemp("feast-init")
    done = subprocess.run([str(feast_venv.feast()), "init", "my_project"], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "my_project" / "feature_repo"


@dataclass
class FirstImport:
    out: Path
    run: Run
    files: dict[str, bytes]
    repo_before: dict
    dump: dict


@pytest.fixture(scope="module")
def init_import(init_repo, tmp_path_factory, feast_python) -> FirstImport:
    out = tmp_path_factory.mktemp("init-import") / "defs"
    before = tree(init_repo)
    run, dump = import_cli_keeping_dump(init_repo, "--out", out, "--feast-python", feast_python)
    assert run.code == 0, run.stderr
    return FirstImport(out, run, files_of(out), before, dump)


INIT_FEATURES = [
    {"name": "conv_rate", "type": "float", "precision": "float32"},
    {"name": "acc_rate", "type": "float", "precision": "float32"},
    {"name": "avg_daily_trips", "type": "int"},
    {"name": "driver_metadata", "type": "json"},
    {"name": "driver_config", "type": "json"},
    {"name": "driver_profile", "type": "json"},
]
INIT_DESCRIPTIONS = {
    "avg_daily_trips": "Average daily trips",
    "driver_metadata": "Driver metadata as key-value pairs",
    "driver_config": "Driver configuration as JSON",
    "driver_profile": "Driver profile as a typed struct",
}
INIT_TYPES = {  # Feast's type -> what the import says it became
    "conv_rate": "Float32 -> float, precision float32",
    "acc_rate": "Float32 -> float, precision float32",
    "avg_daily_trips": "Int64 -> int",
    "driver_metadata": "Map -> json",
    "driver_config": "Json -> json",
    "driver_profile": "Struct({name: String, age: String}) -> json",
}
INIT_LEFT_OUT = {
    "on-demand feature view transformed_conv_rate": "at request time",
    "on-demand feature view transformed_conv_rate_fresh": "at request time",
    "label view driver_quality_labels": "never materializes a label view",
    "push source driver_quality_labels_push": "no feature view reads it",  # a label view's
    "request source vals_to_add": "data of a request",
    "feature service driver_activity_v1: references transformed_conv_rate:conv_rate_plus_val1, "
    "transformed_conv_rate:conv_rate_plus_val2": "on-demand feature view",
    "feature service driver_activity_v2: references transformed_conv_rate:conv_rate_plus_val1, "
    "transformed_conv_rate:conv_rate_plus_val2": "on-demand feature view",
    "feature service driver_activity_v3: references transformed_conv_rate_fresh:conv_rate_plus_val1, "
    "transformed_conv_rate_fresh:conv_rate_plus_val2": "on-demand feature view",
}


def init_source(name: str, entity: str, repo: Path, descriptions: dict, stored_suffix: str = "", push_source: str | None = None) -> dict:
    features = [
        {
            **f,
            **({"description": descriptions[f["name"]]} if f["name"] in descriptions else {}),
            **({"stored_as": f["name"] + stored_suffix} if stored_suffix else {}),
        }
        for f in INIT_FEATURES
    ]
    return {
        "source": {
            "name": name,
            "entity": entity,
            "location": str(repo / "data" / "driver_stats.parquet"),
            "format": "parquet",
            "layout": "wide",
            "select_by": "event_time",
            "timestamp_column": "event_timestamp",
            "created_column": "created",
            "on_tie": "keep_one",  # Feast writes one of an entity's tied rows: never a reason to stop
            **({"push_source": push_source} if push_source else {}),
            "feast_ttl_seconds": 86400,  # for the record: reads serve a value however old, as Feast's
            "features": features,
        }
    }


def test_feasts_example_is_imported_as_expected(init_import, init_repo):
    out, run = init_import.out, init_import.run
    assert set(init_import.files) == {
        "entities.yaml",
        "driver_hourly_stats.yaml",
        "driver_hourly_stats_fresh.yaml",
        "feature_services.yaml",
        "stored.lock",
        "IMPORTED.md",
    }
    load = {name: yaml.safe_load(text) for name, text in init_import.files.items() if name.endswith((".yaml", ".lock"))}
    driver_key = [{"name": "driver_id", "type": "int"}]  # Int64, which Feast infers from the Parquet file
    assert load["entities.yaml"] == {
        "entities": [
            # one entity type for both views: one hash per driver holds both, as Feast keeps one key per driver
            {"name": "driver", "prefix": "d", "keys": driver_key, "sql_table": "driver_features", "description": "Feast entity driver"},
        ]
    }
    assert load["driver_hourly_stats.yaml"] == init_source("driver_hourly_stats", "driver", init_repo, INIT_DESCRIPTIONS)
    # the push view has the same feature names as driver_hourly_stats: fresh stored names keep them apart in that hash;
    # pushes to its PushSource write it, the nightly run loads the PushSource's batch source
    assert load["driver_hourly_stats_fresh.yaml"] == init_source(
        "driver_hourly_stats_fresh", "driver", init_repo, {}, "@2", push_source="driver_stats_push_source"
    )
    every = [f["name"] for f in INIT_FEATURES]
    assert load["feature_services.yaml"] == {
        "feature_services": [
            {"name": "driver_activity_v1", "features": ["driver_hourly_stats:conv_rate"]},
            {"name": "driver_activity_v2", "features": [f"driver_hourly_stats:{f}" for f in every]},
            {"name": "driver_activity_v3", "features": [f"driver_hourly_stats_fresh:{f}" for f in every]},
        ]
    }
    encodings = {"conv_rate": "float/float32", "acc_rate": "float/float32", "avg_daily_trips": "int"} | dict.fromkeys(every[3:], "json")
    assert load["stored.lock"] == {
        "entities": {
            "driver": {
                f + suffix: {"source": source, "feature": f, "encoding": encodings[f]}
                for source, suffix in (("driver_hourly_stats", ""), ("driver_hourly_stats_fresh", "@2"))
                for f in every
            }
        }
    }
    # what every command loads: strict, with the lock
    defs = load_definitions(out)
    assert sorted(defs.sources) == ["driver_hourly_stats", "driver_hourly_stats_fresh"]

    # one line per choice, on the console and in IMPORTED.md; what is left out, with the reason
    summary = init_import.files["IMPORTED.md"].decode()
    for view in ("driver_hourly_stats", "driver_hourly_stats_fresh"):
        for feature, choice in INIT_TYPES.items():
            line, *stored = [x for x in run.stdout.splitlines() if x.startswith(f"  {view}:{feature}: ")]
            assert line.startswith(f"  {view}:{feature}: {choice}"), line
            if view == "driver_hourly_stats_fresh":  # and why it is stored under another name
                assert stored == [
                    f"  {view}:{feature}: stored as {feature}@2: '{feature}' is source driver_hourly_stats's, in the same hash "
                    "per entity (stored_as)"
                ]
            else:
                assert stored == []
            for each in (line, *stored):
                assert f"  - {each.strip()}\n" in summary
    # the push source: mapped, said on the source's line, under it and on a line of its own
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("source driver_hourly_stats_fresh (feature view): ")]
    assert line.endswith(
        ", no max age, as Feast reads (Feast's ttl 1 day, 0:00:00), push_source driver_stats_push_source, layout wide, on_tie keep_one"
    ), line
    carried = run.stdout.split("\nleft out (")[0].splitlines()
    assert [x for x in carried if "push" in x and not x.startswith("  ")] == [
        line,
        "push source driver_stats_push_source: pushes write driver_hourly_stats_fresh",
    ]
    note = (
        "  note: pushes to its PushSource driver_stats_push_source write it (push_source, taken by `materialize serve` with "
        "server.push); runs load its batch source driver_hourly_stats_source, which is what `feast materialize` loads for it"
    )
    assert run.stdout.splitlines()[run.stdout.splitlines().index(line) + 1] == note
    assert "- push source driver_stats_push_source: pushes write driver_hourly_stats_fresh\n" in summary.split("## Left out")[0]
    assert_left_out(run.stdout, INIT_LEFT_OUT)
    assert (
        "push source driver_quality_labels_push: no feature view reads it: a push here writes the sources of the feature views "
        "that read its push source"
    ) in left_out_lines(run.stdout)
    for line in left_out_lines(run.stdout):
        assert f"- {line}\n" in summary
    assert load_definitions(out).sources["driver_hourly_stats_fresh"].push_source == "driver_stats_push_source"
    assert load_definitions(out).sources["driver_hourly_stats"].push_source is None
    assert f"definitions_dir: {out}" in run.stdout and f"definitions_dir: {out}" in summary
    assert tree(init_repo) == init_import.repo_before  # Feast read the repository: nothing applied, nothing written


def test_importing_again_writes_the_same_bytes(init_import, init_repo, feast_python, monkeypatch):
    out = init_import.out
    times = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    # the interpreter named relative to the working folder (Feast runs from the repository's)
    monkeypatch.chdir(feast_python.parent.parent)
    run = import_cli(init_repo, "--out", out, "--feast-python", Path("bin") / feast_python.name)
    assert run.code == 0, run.stderr
    assert files_of(out) == init_import.files
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == times  # not even rewritten
    assert f"{out}: nothing changed" in run.stdout


def conv_rate(dump: dict, view: str = "driver_hourly_stats") -> dict:
    (fv,) = [v for v in dump["feature_views"] if v["name"] == view]
    return next(f for f in fv["features"] if f["name"] == "conv_rate")


def test_an_output_imported_before_push_sources_gains_push_source_and_nothing_else(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    fresh = out / "driver_hourly_stats_fresh.yaml"
    fresh.write_text(fresh.read_text().replace("  push_source: driver_stats_push_source\n", ""))
    load_definitions(out)
    done = import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    assert done.written.written == ["IMPORTED.md", "driver_hourly_stats_fresh.yaml"]  # IMPORTED.md names the folder
    assert done.written.lock_changes == []
    assert files_of(out) == {
        **init_import.files,
        "IMPORTED.md": init_import.files["IMPORTED.md"].replace(str(init_import.out).encode(), str(out).encode()),
    }


def test_views_sharing_a_push_source_and_a_push_source_name_that_does_not_fit(init_import, init_repo, tmp_path):
    dump = copy.deepcopy(init_import.dump)
    (fresh,) = [v for v in dump["feature_views"] if v["name"] == "driver_hourly_stats_fresh"]
    dump["feature_views"].append({**copy.deepcopy(fresh), "name": "driver_pushed_too"})
    dump["feature_views"].append({**copy.deepcopy(fresh), "name": "driver_disabled", "enabled": False})  # left out: said
    done = import_dump(dump, init_repo, tmp_path / "shared", "my_project")
    assert {s.name: s.push_source for s in done.plan.sources} == {
        "driver_hourly_stats": None,
        "driver_hourly_stats_fresh": "driver_stats_push_source",
        "driver_pushed_too": "driver_stats_push_source",
    }
    assert [x for x in done.plan.lines if x.startswith("push source ")] == [
        "push source driver_stats_push_source: pushes write driver_hourly_stats_fresh, driver_pushed_too "
        "(driver_disabled: not imported, see left out)"
    ]
    assert "feature view driver_disabled: enabled=False: Feast does not materialize it" in done.plan.left_out
    assert not [x for x in done.plan.left_out if x.startswith("push source driver_stats_push_source")]
    defs = load_definitions(tmp_path / "shared")
    assert defs.sources["driver_pushed_too"].push_source == "driver_stats_push_source"

    # a PushSource named as no source field here can be: the view imported from its batch source, the push source left out
    dump = copy.deepcopy(init_import.dump)
    (fresh,) = [v for v in dump["feature_views"] if v["name"] == "driver_hourly_stats_fresh"]
    fresh["stream_source"]["name"] = "driver-stats-push"
    for source in dump["data_sources"]:
        if source["name"] == "driver_stats_push_source":
            source["name"] = "driver-stats-push"
    done = import_dump(dump, init_repo, tmp_path / "bad_name", "my_project")
    assert {s.name: s.push_source for s in done.plan.sources} == {"driver_hourly_stats": None, "driver_hourly_stats_fresh": None}
    assert [x for x in done.plan.lines if "push" in x and not x.startswith("  ")] == []
    assert (
        "  note: its PushSource driver-stats-push is not carried over: imported from its batch source driver_hourly_stats_source, "
        "which is what `feast materialize` loads for it"
    ) in done.plan.lines
    assert (
        "push source driver-stats-push: the name does not fit: a name here is [A-Za-z_][A-Za-z0-9_]{0,62} "
        "(driver_hourly_stats_fresh: imported from its batch source, no push_source)"
    ) in done.plan.left_out
    assert "push_source" not in (tmp_path / "bad_name" / "driver_hourly_stats_fresh.yaml").read_text()


def test_a_type_change_needs_stored_as(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    dump = copy.deepcopy(init_import.dump)
    conv_rate(dump).update(dtype="String", value_type="STRING")  # as if the repository said dtype=String

    with pytest.raises(FeastImportError) as refused:
        import_dump(dump, init_repo, out, "my_project")
    (line,) = refused.value.problems
    path = out / "driver_hourly_stats.yaml"
    at = path.read_text().splitlines().index("    - {name: conv_rate, type: float, precision: float32}") + 1
    assert line.startswith(f"{path}:{at}: source 'driver_hourly_stats': feature 'conv_rate': float/float32 -> string")
    # (conv_rate@2 is driver_hourly_stats_fresh's conv_rate, in the same hash per driver)
    assert "`stored_as: conv_rate@3`" in line and "on the feature in that file (the next import keeps it)" in line
    assert files_of(out) == init_import.files  # nothing written

    # the way forward the line names: stored_as on the imported feature, kept by the next import
    text = path.read_text()
    path.write_text(
        text.replace("{name: conv_rate, type: float, precision: float32}", "{name: conv_rate, type: float, stored_as: conv_rate@3}")
    )
    done = import_dump(dump, init_repo, out, "my_project")
    assert yaml.safe_load(path.read_text())["source"]["features"][0] == {"name": "conv_rate", "type": "string", "stored_as": "conv_rate@3"}
    lock = yaml.safe_load((out / "stored.lock").read_text())["entities"]["driver"]
    assert lock["conv_rate@3"] == {"source": "driver_hourly_stats", "feature": "conv_rate", "encoding": "string"}
    assert lock["conv_rate"] == {
        "source": "driver_hourly_stats",
        "feature": "conv_rate",
        "encoding": "float/float32",
        "retired": dt.datetime.now(dt.UTC).date().isoformat(),
    }
    assert sorted(done.written.written) == ["IMPORTED.md", "driver_hourly_stats.yaml", "stored.lock"]
    assert files_of(out)["entities.yaml"] == init_import.files["entities.yaml"]
    load_definitions(out)


def test_a_view_removed_in_feast_is_removed_and_its_stored_names_retired(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    dump = copy.deepcopy(init_import.dump)
    dump["feature_views"] = [v for v in dump["feature_views"] if v["name"] != "driver_hourly_stats_fresh"]
    done = import_dump(dump, init_repo, out, "my_project")
    assert done.written.removed == ["driver_hourly_stats_fresh.yaml"]
    assert "driver_hourly_stats.yaml" in done.written.unchanged
    entities = yaml.safe_load((out / "entities.yaml").read_text())["entities"]
    assert [e["name"] for e in entities] == ["driver"]
    # the lock keeps what the drivers' hashes hold under the gone view's names, retired (never served)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    before = yaml.safe_load(init_import.files["stored.lock"])["entities"]["driver"]
    expected = {n: e | ({"retired": today} if n.endswith("@2") else {}) for n, e in before.items()}
    assert yaml.safe_load((out / "stored.lock").read_text()) == {"entities": {"driver": expected}}
    services = yaml.safe_load((out / "feature_services.yaml").read_text())["feature_services"]
    assert [s["name"] for s in services] == ["driver_activity_v1", "driver_activity_v2"]  # v3 read only the removed view
    load_definitions(out)

    # back in Feast: its names are past the retired ones (their old values may still be stored)
    done = import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    back = yaml.safe_load((out / "driver_hourly_stats_fresh.yaml").read_text())["source"]["features"]
    assert [f["stored_as"] for f in back] == [f["name"] + "@3" for f in INIT_FEATURES]
    lock = yaml.safe_load((out / "stored.lock").read_text())["entities"]["driver"]
    assert {n: e for n, e in lock.items() if n.endswith("@2")} == {n: e for n, e in expected.items() if n.endswith("@2")}
    assert {n: e["source"] for n, e in lock.items() if n.endswith("@3")} == {
        f["name"] + "@3": "driver_hourly_stats_fresh" for f in INIT_FEATURES
    }
    load_definitions(out)


def test_an_earlier_output_with_the_push_view_on_its_own_entity_type_keeps_it(init_import, init_repo, tmp_path):
    """Imports before one hash per entity held every view gave the push view an entity type of
    its own: its keys are written, so a later import keeps it there, and says when it goes."""
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    fresh, own = out / "driver_hourly_stats_fresh.yaml", "driver__driver_hourly_stats_fresh"
    fresh.write_text(re.sub(r", stored_as: \w+@2", "", fresh.read_text()).replace("entity: driver\n", f"entity: {own}\n"))
    entities = out / "entities.yaml"
    entities.write_text(
        entities.read_text() + f"  - name: {own}\n    prefix: ddhsf\n    keys:\n      - {{name: driver_id, type: int}}\n"
        f"    sql_table: {own}_features\n    description: Feast entity driver, for driver_hourly_stats_fresh\n"
    )
    lock = yaml.safe_load(init_import.files["stored.lock"])["entities"]["driver"]
    earlier = {
        "driver": {n: e for n, e in lock.items() if "@" not in n},
        own: {n.removesuffix("@2"): e for n, e in lock.items() if "@" in n},
    }
    (out / "stored.lock").write_text(yaml.safe_dump({"entities": earlier}))
    load_definitions(out)

    done = import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    assert yaml.safe_load(fresh.read_text())["source"]["entity"] == own
    assert "stored_as" not in fresh.read_text()
    assert [e["name"] for e in yaml.safe_load(entities.read_text())["entities"]] == ["driver", own]
    (line,) = [x for x in done.plan.lines if x.startswith("source driver_hourly_stats_fresh ")]
    assert f", entity type {own} (as in the earlier output), " in line
    assert yaml.safe_load((out / "stored.lock").read_text()) == {"entities": earlier}

    dump = copy.deepcopy(init_import.dump)
    dump["feature_views"] = [v for v in dump["feature_views"] if v["name"] != "driver_hourly_stats_fresh"]
    done = import_dump(dump, init_repo, out, "my_project")
    assert [e["name"] for e in yaml.safe_load(entities.read_text())["entities"]] == ["driver"]
    # the lock still says what the stores hold under the gone entity type's keys (they stay until their TTL)
    assert yaml.safe_load((out / "stored.lock").read_text()) == {"entities": earlier}
    assert f"entity type {own} (prefix ddhsf) is no longer imported" in "\n".join(done.plan.warnings)
    load_definitions(out)


def test_a_view_back_in_feast_after_its_names_were_retired_gets_fresh_storage(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    with_extra = copy.deepcopy(init_import.dump)
    extra = copy.deepcopy(next(v for v in with_extra["feature_views"] if v["name"] == "driver_hourly_stats"))
    extra.update(name="driver_extra", features=[dict(conv_rate(with_extra), name="extra_rate")])
    with_extra["feature_views"].append(extra)
    import_dump(copy.deepcopy(with_extra), init_repo, out, "my_project")  # on entity type driver, beside driver_hourly_stats
    import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")  # gone from Feast: its file removed, its name retired
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert yaml.safe_load((out / "stored.lock").read_text())["entities"]["driver"]["extra_rate"]["retired"] == today
    assert not (out / "driver_extra.yaml").exists()

    import_dump(copy.deepcopy(with_extra), init_repo, out, "my_project")  # back: no file to set a stored_as in
    features = yaml.safe_load((out / "driver_extra.yaml").read_text())["source"]["features"]
    assert features == [{"name": "extra_rate", "type": "float", "precision": "float32", "stored_as": "extra_rate@2"}]
    line = f"driver_extra:extra_rate: stored as extra_rate@2: stored.lock has 'extra_rate' retired on {today} (fresh storage)"
    mapped = "driver_extra:extra_rate: Float32 -> float, precision float32 (written in its shortest float32 form)"
    assert f"  - {mapped}\n  - {line}\n" in (out / "IMPORTED.md").read_text()  # under the feature's own line
    lock = yaml.safe_load((out / "stored.lock").read_text())["entities"]["driver"]
    assert lock["extra_rate@2"] == {"source": "driver_extra", "feature": "extra_rate", "encoding": "float/float32"}
    load_definitions(out)


def test_a_stored_as_edited_into_no_stored_name_is_one_line(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    view = out / "driver_hourly_stats.yaml"
    view.write_text(view.read_text().replace("{name: conv_rate,", "{name: conv_rate, stored_as: Conv Rate,"))
    before = tree(out)
    with pytest.raises(FeastImportError) as refused:
        import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    (line,) = refused.value.problems
    assert line.startswith("feature driver_hourly_stats:conv_rate: stored_as 'Conv Rate' in the earlier output: "), line
    assert line.endswith(": fix it in the view's file"), line
    assert tree(out) == before  # nothing written


def test_imported_views_keep_one_of_tied_rows_as_feast_and_a_hand_set_on_tie_is_kept(init_import, init_repo, tmp_path):
    # Feast writes one of an entity's rows tied at one event time and never stops a view on them
    for view in ("driver_hourly_stats", "driver_hourly_stats_fresh"):
        assert yaml.safe_load(init_import.files[f"{view}.yaml"])["source"]["on_tie"] == "keep_one"
        assert load_definitions(init_import.out).sources[view].on_tie == "keep_one"
        (line,) = [x for x in init_import.files["IMPORTED.md"].decode().splitlines() if x.startswith(f"- source {view} (feature view): ")]
        assert line.endswith(", layout wide, on_tie keep_one"), line
    # blocking chosen by hand in the output: the next import keeps it (the default, still written out)
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    view = out / "driver_hourly_stats.yaml"
    view.write_text(view.read_text().replace("on_tie: keep_one", "on_tie: fail"))
    import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    assert yaml.safe_load(view.read_text())["source"]["on_tie"] == "fail"
    assert load_definitions(out).sources["driver_hourly_stats"].on_tie == "fail"
    assert load_definitions(out).sources["driver_hourly_stats_fresh"].on_tie == "keep_one"


def notes_under(summary: str, source: str) -> list[str]:
    lines = summary.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"- source {source} (feature view): "))
    notes = []
    for line in lines[start + 1 :]:
        if not line.startswith("  - note: "):
            break
        notes.append(line[len("  - note: ") :])
    return notes


def test_imported_views_read_as_feast_and_a_max_age_set_by_hand_is_kept(init_import, init_repo, tmp_path):
    # Feast 0.67 serves a value however old: an imported view has no max age, its ttl recorded
    summary = init_import.files["IMPORTED.md"].decode()
    for view in ("driver_hourly_stats", "driver_hourly_stats_fresh"):
        source = load_definitions(init_import.out).sources[view]
        assert (source.max_age_seconds, source.feast_ttl_seconds) == (None, 86400)
        assert (
            "read as Feast reads: Feast 0.67's online reads serve a value however old (its ttl bounds historical retrieval and "
            "the first incremental window); `max_age_seconds: 86400` on the source (kept by the next import) would withhold a "
            "value older than its ttl (status OUTSIDE_MAX_AGE)"
        ) in notes_under(summary, view)
    # the stricter read set by hand: kept, and the report says what Feast would do instead
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    view = out / "driver_hourly_stats.yaml"
    view.write_text(view.read_text().replace("  feast_ttl_seconds: 86400\n", "  feast_ttl_seconds: 86400\n  max_age_seconds: 3600\n"))
    import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    assert load_definitions(out).sources["driver_hourly_stats"].max_age_seconds == 3600
    assert load_definitions(out).sources["driver_hourly_stats_fresh"].max_age_seconds is None
    summary = (out / "IMPORTED.md").read_text()
    (line,) = [x for x in summary.splitlines() if x.startswith("- source driver_hourly_stats (feature view): ")]
    assert ", max_age_seconds 3600 (set in the output, kept; Feast's ttl 1 day, 0:00:00), " in line, line
    assert notes_under(summary, "driver_hourly_stats")[-1].startswith("a reader withholds a value older than max_age_seconds")


def test_an_output_imported_when_ttl_was_a_max_age_reads_as_feast_after_the_next_import(init_import, init_repo, tmp_path):
    # before feast_ttl_seconds, the import wrote max_age_seconds from Feast's ttl: not the operator's, so not kept
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    for name in ("driver_hourly_stats", "driver_hourly_stats_fresh"):
        view = out / f"{name}.yaml"
        view.write_text(view.read_text().replace("  feast_ttl_seconds: 86400\n", "  max_age_seconds: 86400\n"))
        assert load_definitions(out).sources[name].max_age_seconds == 86400
    import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    assert files_of(out) == {
        **init_import.files,
        "IMPORTED.md": (out / "IMPORTED.md").read_bytes(),
    }
    for name in ("driver_hourly_stats", "driver_hourly_stats_fresh"):
        assert notes_under((out / "IMPORTED.md").read_text(), name)[-1] == (
            "max_age_seconds 86400, which an earlier import wrote from Feast's ttl, is removed: a value older than that is now "
            "served, as Feast serves it; set it again on the source to keep withholding it"
        )


def test_an_output_imported_when_ttl_was_a_max_age_keeps_one_set_by_hand(init_import, init_repo, tmp_path):
    # an old output's max_age_seconds other than the ttl was not the import's: kept, as set by hand
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    view = out / "driver_hourly_stats.yaml"
    view.write_text(view.read_text().replace("  feast_ttl_seconds: 86400\n", "  max_age_seconds: 3600\n"))
    import_dump(copy.deepcopy(init_import.dump), init_repo, out, "my_project")
    source = load_definitions(out).sources["driver_hourly_stats"]
    assert (source.max_age_seconds, source.feast_ttl_seconds) == (3600, 86400)
    assert not any("is removed" in note for note in notes_under((out / "IMPORTED.md").read_text(), "driver_hourly_stats"))


def test_a_max_age_set_to_the_ttl_is_kept_when_feasts_ttl_changes_and_the_report_says_so(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    shutil.copytree(init_import.out, out)
    view = out / "driver_hourly_stats.yaml"
    view.write_text(view.read_text().replace("  feast_ttl_seconds: 86400\n", "  feast_ttl_seconds: 86400\n  max_age_seconds: 86400\n"))
    dump = copy.deepcopy(init_import.dump)
    (fv,) = [v for v in dump["feature_views"] if v["name"] == "driver_hourly_stats"]
    fv["ttl_seconds"] = 7200.0
    import_dump(dump, init_repo, out, "my_project")
    source = load_definitions(out).sources["driver_hourly_stats"]
    assert (source.max_age_seconds, source.feast_ttl_seconds) == (86400, 7200)
    assert notes_under((out / "IMPORTED.md").read_text(), "driver_hourly_stats")[-1] == (
        "Feast's ttl changed from 86400 to 7200 seconds since the last import: max_age_seconds stays 86400, the former ttl; "
        "set it to 7200 to follow"
    )


def test_what_feast_printed_but_cannot_be_imported(init_import, init_repo, tmp_path):
    out = tmp_path / "defs"
    twice = copy.deepcopy(init_import.dump)  # parse_repo keeps two objects of one name; Feast's apply refuses them
    twice["feature_views"].append(copy.deepcopy(twice["feature_views"][0]))
    with pytest.raises(FeastImportError) as refused:
        import_dump(twice, init_repo, out, "my_project")
    name = twice["feature_views"][0]["name"]
    assert refused.value.problems == [f"{init_repo}: two feature views named {name!r} (Feast's apply refuses that too)"]
    assert not out.exists()

    # a view without a schema whose source Feast could not read: left out, saying why; the rest imported
    no_schema = copy.deepcopy(init_import.dump)
    (fresh,) = [v for v in no_schema["feature_views"] if v["name"] == "driver_hourly_stats_fresh"]
    fresh.update(features=[], inference_error="FileNotFoundError: data/driver_stats.parquet")
    done = import_dump(no_schema, init_repo, out, "my_project")
    assert (
        "feature view driver_hourly_stats_fresh: it declares no schema and Feast could not infer its features from the source "
        "(FileNotFoundError: data/driver_stats.parquet)" in done.plan.left_out
    )
    assert sorted(load_definitions(out).sources) == ["driver_hourly_stats"]


# --- a repository written here: what the example does not have -----------------------------------

HAND_STORE = """\
project: hand_made
registry: data/registry.db
provider: local
online_store:
  type: redis
  connection_string: "localhost:6379"
  key_ttl_seconds: 604800
entity_key_serialization_version: 3
"""
HAND_FEATURES = """\
from datetime import timedelta

from feast import BigQuerySource, Entity, FeatureService, FeatureView, Field, FileSource, KafkaSource, PushSource, StreamFeatureView
from feast import ValueType
from feast.data_format import DeltaFormat, JsonFormat
from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
from feast.types import Array, Bool, Bytes, Float32, Float64, Int32, Int64, Set, String, UnixTimestamp

driver = Entity(name="driver", join_keys=["driver_id"], value_type=ValueType.INT64, description="A driver.")
customer = Entity(name="customer", join_keys=["customer_id"], value_type=ValueType.STRING)

customer_profile = FeatureView(
    name="customer_profile",
    entities=[customer],
    ttl=timedelta(hours=6),
    schema=[
        Field(name="lifetime_orders", dtype=Int32),
        Field(name="segment", dtype=String),
        Field(name="is_vip", dtype=Bool),
        Field(name="last_order_at", dtype=UnixTimestamp),
        Field(name="raw_blob", dtype=Bytes),
        Field(name="ConvRate", dtype=Float64),
    ],
    source=SparkSource(name="customer_profile_table", table="analytics.customer_profile", timestamp_field="updated_at"),
)

trips_source = FileSource(
    name="trips_source",
    path="data/trips",
    timestamp_field="ts",
    created_timestamp_column="loaded_at",
    field_mapping={"trip_count_raw": "trip_count", "cust": "customer_id", "ts_raw": "ts"},
)
driver_customer_trips = FeatureView(
    name="driver_customer_trips",
    entities=[driver, customer],
    ttl=timedelta(0),
    schema=[
        Field(name="trip_count", dtype=Int64),
        Field(name="recent_trip_ids", dtype=Array(Int64)),
        Field(name="recent_zones", dtype=Array(String)),
        Field(name="route_embedding", dtype=Array(Float32), vector_length=4),
        Field(name="fares", dtype=Array(Float64)),
        Field(name="fare_ratios", dtype=Array(Float32)),
        Field(name="fare_set", dtype=Set(Float64)),
        Field(name="flags", dtype=Array(Bool)),
    ],
    source=trips_source,
)

driver_delta = FileSource(name="driver_delta", path="data/driver_stats.delta", file_format=DeltaFormat(), timestamp_field="event_timestamp")
driver_stream = KafkaSource(
    name="driver_stream",
    kafka_bootstrap_servers="localhost:9092",
    topic="driver_stats",
    timestamp_field="event_timestamp",
    batch_source=driver_delta,
    message_format=JsonFormat(schema_json="rating double"),
)
driver_ratings = FeatureView(
    name="driver_ratings", entities=[driver], ttl=timedelta(days=7), schema=[Field(name="rating", dtype=Float64)], source=driver_stream
)

driver_rating_stream = StreamFeatureView(
    name="driver_rating_stream",
    entities=[driver],
    ttl=timedelta(days=1),
    schema=[Field(name="rating_now", dtype=Float64)],
    source=driver_stream,
)
driver_snapshots = FeatureView(
    name="driver_snapshots",
    entities=[driver],
    schema=[Field(name="active", dtype=Bool)],
    source=SparkSource(name="snapshot_files", path="data/snapshots", file_format="parquet", timestamp_field="ts"),
)
driver_queried = FeatureView(
    name="driver_queried",
    entities=[driver],
    schema=[Field(name="n", dtype=Int64)],
    source=SparkSource(name="snapshot_query", query="SELECT * FROM x", timestamp_field="ts"),
)

orders_push = PushSource(name="orders_push", batch_source=FileSource(name="orders_file", path="data/orders.parquet", timestamp_field="ts"))
driver_orders = FeatureView(name="driver_orders", entities=[driver], schema=[Field(name="orders_today", dtype=Int64)], source=orders_push)
warehouse_push = PushSource(
    name="warehouse_push", batch_source=BigQuerySource(name="bq_pushed", table="project.dataset.pushed", timestamp_field="ts")
)
warehouse_pushed = FeatureView(
    name="warehouse_pushed", entities=[driver], schema=[Field(name="pushed_score", dtype=Float64)], source=warehouse_push
)

driver_history = FeatureView(
    name="driver_history",
    entities=[driver],
    schema=[Field(name="lifetime_trips", dtype=Int64)],
    source=FileSource(name="history_file", path="data/not_yet.parquet", timestamp_field="ts"),
)
warehouse_stats = FeatureView(
    name="warehouse_stats",
    entities=[driver],
    schema=[Field(name="score", dtype=Float64)],
    source=BigQuerySource(name="bq", table="project.dataset.stats", timestamp_field="ts"),
)
offline_only = FeatureView(
    name="offline_only", entities=[driver], online=False, schema=[Field(name="hist", dtype=Float64)], source=driver_delta
)

scoring = FeatureService(
    name="scoring",
    features=[customer_profile[["segment", "raw_blob"]], driver_customer_trips, warehouse_stats],
    description="What the scoring model reads.",
)
"""


@dataclass
class HandImport:
    repo: Path
    out: Path
    refused: Run
    dump: dict


@pytest.fixture(scope="module")
def hand_import(tmp_path_factory, feast_python) -> HandImport:
    """The repository imported without --allow-missing-data: refused (one of its paths has no
    data yet); what Feast printed for it, for the import with the flag (one Feast process for both)."""
    repo = hand_repo(tmp_path_factory)
    out = tmp_path_factory.mktemp("hand-import") / "defs"
    run, dump = import_cli_keeping_dump(repo, "--out", out, "--feast-python", feast_python)
    return HandImport(repo, out, run, dump)


def hand_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("hand") / "repo"
    (repo / "data" / "trips").mkdir(parents=True)
    (repo / "data" / "driver_stats.delta").mkdir()
    (repo / "data" / "snapshots").mkdir()
    (repo / "data" / "trips" / "part-0.parquet").touch()  # the import only looks that the paths are there
    (repo / "data" / "orders.parquet").touch()
    (repo / "feature_store.yaml").write_text(HAND_STORE)
    (repo / "features.py").write_text(HAND_FEATURES)
    return repo


def test_float_arrays_become_float_lists_and_embeddings_with_a_vector_length():
    from feature_defs import FeatureDef
    from feature_defs.feast_import.value_types import feature_type

    # Feast's ValueType names: Array(Float32) is FLOAT_LIST, Set(Float64) is DOUBLE_SET
    expected = {
        ("FLOAT_LIST", 0): ("float_list", {"precision": "float32"}, "float_list/float32"),
        ("FLOAT_SET", 0): ("float_list", {"precision": "float32"}, "float_list/float32"),
        ("DOUBLE_LIST", 0): ("float_list", {}, "float_list"),
        ("DOUBLE_SET", 0): ("float_list", {}, "float_list"),
        ("DOUBLE_SET", 4): ("float_list", {}, "float_list"),  # a set is no vector
        ("FLOAT_LIST", 4): ("embedding", {"dimension": 4}, "embedding/4"),
        ("DOUBLE_LIST", 4): ("embedding", {"dimension": 4}, "embedding/4"),
    }
    for (value_type, vector_length), (kind, options, encoding) in expected.items():
        choice = feature_type(value_type, vector_length)
        assert (choice.type, choice.options) == (kind, options), value_type
        assert FeatureDef(name="x", type=choice.type, **choice.options).encoding == encoding


HAND_LEFT_OUT = {
    "feature customer_profile:raw_blob (Bytes)": "no type here holds raw bytes",
    "feature customer_profile:ConvRate": "a feature name here is [a-z][a-z0-9_]{0,127}",
    "feature view offline_only": "online=False",
    "stream feature view driver_rating_stream": "from a stream with its transformation",
    "feature view driver_queried": "reads a query; the job reads tables and paths",
    "feature view warehouse_stats": "is a BigQuerySource, which no Spark reader here reads",
    "stream source driver_stream (KafkaSource)": "driver_ratings: imported from its batch source",
    "feature view warehouse_pushed": "is a BigQuerySource, which no Spark reader here reads",
    "push source warehouse_push": "no view that reads it is imported: warehouse_pushed (its batch source bq_pushed",
    "feature service scoring: reference customer_profile:raw_blob": "the feature is not carried over",
    "feature service scoring: reference warehouse_stats:score": "its view is not carried over",
}
HAND_TYPES = {
    "customer_profile:lifetime_orders": "Int32 -> int",
    "customer_profile:segment": "String -> string",
    "customer_profile:is_vip": "Bool -> bool",
    "customer_profile:last_order_at": "UnixTimestamp -> int: epoch seconds",
    "driver_customer_trips:trip_count": "Int64 -> int",
    "driver_customer_trips:recent_trip_ids": "Array(Int64) -> int_list",
    "driver_customer_trips:recent_zones": "Array(String) -> string_list",
    "driver_customer_trips:route_embedding": "Array(Float32) -> embedding, dimension 4",
    "driver_customer_trips:fares": "Array(Float64) -> float_list (an embedding needs Feast's vector_length)",
    "driver_customer_trips:fare_ratios": "Array(Float32) -> float_list, precision float32",
    "driver_customer_trips:fare_set": "Set(Float64) -> float_list",
    "driver_customer_trips:flags": "Array(Bool) -> json",
    "driver_ratings:rating": "Float64 -> float",
}


def test_a_path_with_no_data_stops_the_import_unless_allowed(hand_import):
    run, hand_repo, out = hand_import.refused, hand_import.repo, hand_import.out
    assert run.code == 2
    assert run.errors == [
        f"error: feature view driver_history: source path {hand_repo / 'data' / 'not_yet.parquet'} does not exist "
        "(FileSource history_file): nothing imported (--allow-missing-data imports before the data exists)"
    ]
    assert not out.exists()


def test_what_the_example_lacks_is_imported_as_expected(hand_import):
    # as `--allow-missing-data` goes on, from what Feast printed in the refused run
    hand_repo, out = hand_import.repo, hand_import.out
    done = import_dump(hand_import.dump, hand_repo, out, "hand_made", key_ttl_seconds=604800, allow_missing_data=True)
    run = Run(0, "\n".join(report(done)), "")
    load = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    assert sorted(load) == [
        "customer_profile.yaml",
        "driver_customer_trips.yaml",
        "driver_history.yaml",
        "driver_orders.yaml",
        "driver_ratings.yaml",
        "driver_snapshots.yaml",
        "entities.yaml",
        "feature_services.yaml",
    ]
    week = 604800  # Feast's Redis key_ttl_seconds
    assert load["entities.yaml"]["entities"] == [
        {
            "name": "customer",
            "prefix": "c",
            "keys": [{"name": "customer_id", "type": "string"}],
            "ttl_seconds": week,
            "sql_table": "customer_features",
            "description": "Feast entity customer",
        },
        {  # a view of two entities: an entity type keyed by both join keys, entities in name order
            "name": "customer_driver",
            "prefix": "cd",
            "keys": [{"name": "customer_id", "type": "string"}, {"name": "driver_id", "type": "int"}],
            "ttl_seconds": week,
            "sql_table": "customer_driver_features",
            "description": "Feast entities customer, driver, together",
        },
        {
            "name": "driver",
            "prefix": "d",
            "keys": [{"name": "driver_id", "type": "int"}],
            "ttl_seconds": week,
            "sql_table": "driver_features",
            "description": "A driver.",
        },
    ]
    event_time = {"layout": "wide", "select_by": "event_time", "on_tie": "keep_one", "feast_ttl_seconds": 0}  # Feast's ttl: none
    assert load["customer_profile.yaml"]["source"] == {
        "name": "customer_profile",
        "entity": "customer",
        "table": "analytics.customer_profile",
        **event_time,
        "timestamp_column": "updated_at",
        "feast_ttl_seconds": 6 * 3600,
        "features": [
            {"name": "lifetime_orders", "type": "int"},
            {"name": "segment", "type": "string"},
            {"name": "is_vip", "type": "bool"},
            {"name": "last_order_at", "type": "int"},
        ],
    }
    assert load["driver_customer_trips.yaml"]["source"] == {
        "name": "driver_customer_trips",
        "entity": "customer_driver",
        "location": str(hand_repo / "data" / "trips"),
        "format": "parquet",
        **event_time,
        "timestamp_column": "ts_raw",  # field_mapping renames the event time, a key and a feature
        "created_column": "loaded_at",
        "key_columns": ["cust", "driver_id"],
        "features": [
            {"name": "trip_count", "type": "int", "column": "trip_count_raw"},
            {"name": "recent_trip_ids", "type": "int_list"},
            {"name": "recent_zones", "type": "string_list"},
            {"name": "route_embedding", "type": "embedding", "dimension": 4},
            {"name": "fares", "type": "float_list"},
            {"name": "fare_ratios", "type": "float_list", "precision": "float32"},
            {"name": "fare_set", "type": "float_list"},
            {"name": "flags", "type": "json"},
        ],
    }
    assert load["driver_ratings.yaml"]["source"] == {
        "name": "driver_ratings",
        "entity": "driver",
        "location": str(hand_repo / "data" / "driver_stats.delta"),
        "format": "delta",
        **event_time,
        "timestamp_column": "event_timestamp",
        "feast_ttl_seconds": 7 * 86400,
        "features": [{"name": "rating", "type": "float"}],
    }
    for name, feature, path, kind, push in (
        ("driver_orders", "orders_today", "orders.parquet", "int", {"push_source": "orders_push"}),  # its PushSource's batch source
        ("driver_history", "lifetime_trips", "not_yet.parquet", "int", {}),
        ("driver_snapshots", "active", "snapshots", "bool", {}),  # a SparkSource's path
    ):
        assert load[f"{name}.yaml"]["source"] == {
            "name": name,
            "entity": "driver",
            "location": str(hand_repo / "data" / path),
            "format": "parquet",
            **event_time,
            "timestamp_column": "ts",
            **push,
            "features": [{"name": feature, "type": kind}],
        }
    trips = [
        f"driver_customer_trips:{f}"
        for f in ("trip_count", "recent_trip_ids", "recent_zones", "route_embedding", "fares", "fare_ratios", "fare_set", "flags")
    ]
    assert load["feature_services.yaml"]["feature_services"] == [
        {"name": "scoring", "features": ["customer_profile:segment", *trips], "description": "What the scoring model reads."}
    ]
    for ref, choice in HAND_TYPES.items():
        (line,) = [x for x in run.stdout.splitlines() if x.startswith(f"  {ref}: ")]
        assert line.startswith(f"  {ref}: {choice}"), line
    assert_left_out(run.stdout, HAND_LEFT_OUT)
    # a PushSource: pushes write the views that read it; a KafkaSource stays left out; a PushSource whose views are all
    # left out (their batch source cannot be read here) stays left out, with their reason
    assert [x for x in run.stdout.splitlines() if x.startswith(("push source ", "  push source ", "  stream source "))] == [
        "push source orders_push: pushes write driver_orders",
        "  stream source driver_stream (KafkaSource): the job reads tables, not streams (driver_ratings: imported from its batch source)",
        "  push source warehouse_push: no view that reads it is imported: warehouse_pushed (its batch source bq_pushed is a "
        "BigQuerySource, which no Spark reader here reads (the job reads Parquet, Delta and Spark catalog tables): export it to "
        "one of those and point a FileSource or SparkSource at it)",
    ]
    (ratings,) = [x for x in run.stdout.splitlines() if x.startswith("source driver_ratings (feature view): ")]
    assert "push_source" not in ratings and "push_source" not in (out / "driver_ratings.yaml").read_text()
    assert (
        "  note: its KafkaSource driver_stream is not carried over: imported from its batch source driver_delta, which is what "
        "`feast materialize` loads for it" in run.stdout.splitlines()
    )
    assert load_definitions(out).sources["driver_orders"].push_source == "orders_push"
    assert f"warning: feature view driver_history: source path {hand_repo / 'data' / 'not_yet.parquet'} does not exist" in run.stdout
    assert sorted(load_definitions(out).sources) == sorted(n.removesuffix(".yaml") for n in load if n.startswith(("customer_", "driver_")))


# --- a UnixTimestamp feature over a time column, imported and run -------------------------------

TIMES_FEATURES = """\
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource
from feast.types import Int64, UnixTimestamp

customer = Entity(name="customer", join_keys=["customer_id"])
customer_times = FeatureView(
    name="customer_times",
    entities=[customer],
    ttl=timedelta(0),
    schema=[
        Field(name="last_order_at", dtype=UnixTimestamp),
        Field(name="signed_up_at", dtype=UnixTimestamp),
        Field(name="birth_day", dtype=UnixTimestamp),
        Field(name="last_login", dtype=UnixTimestamp),
        Field(name="orders", dtype=Int64),
    ],
    source=FileSource(name="customer_times_file", path="data/customer_times.parquet", timestamp_field="event_timestamp"),
)
"""
UTC = dt.UTC
TIMES = ("last_order_at", "signed_up_at", "birth_day", "last_login")
TIMES_ROWS = [  # customer_id, last_order_at (UTC instants), signed_up_at (naive), birth_day (date), last_login (epoch s), orders
    (1, dt.datetime(2026, 11, 20, 8, 30, 15, 750000, UTC), dt.datetime(2021, 3, 4, 5, 6, 7, 999999), dt.date(1990, 5, 17), 1795000000, 3),
    # before 1970, with sub-seconds: floored, as Feast does (-0.5 s is -1)
    (2, dt.datetime(1969, 12, 31, 23, 59, 59, 500000, UTC), dt.datetime(1960, 1, 1, 0, 0, 0, 250000), dt.date(1960, 2, 29), 0, 0),
    (3, None, None, None, 17, 5),  # no time: no value (the field is not written)
]
TIMES_EVENT = dt.datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def epoch_seconds(value) -> int | None:
    """Whole UTC epoch seconds, floored, of a time (naive: UTC) or date; an int as it is."""
    if value is None or isinstance(value, int):
        return value
    if not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time())
    return (value.replace(tzinfo=value.tzinfo or UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(seconds=1)


def write_times_repo(root: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = root / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text("project: times\nregistry: data/registry.db\nprovider: local\n")
    (repo / "features.py").write_text(TIMES_FEATURES)
    columns = list(zip(*TIMES_ROWS))
    table = pa.table(
        {
            "customer_id": pa.array(columns[0], pa.int64()),
            "last_order_at": pa.array(columns[1], pa.timestamp("us", tz="UTC")),
            "signed_up_at": pa.array(columns[2], pa.timestamp("us")),
            "birth_day": pa.array(columns[3], pa.date32()),
            "last_login": pa.array(columns[4], pa.int64()),
            "orders": pa.array(columns[5], pa.int64()),
            "event_timestamp": pa.array([TIMES_EVENT] * len(TIMES_ROWS), pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, repo / "data" / "customer_times.parquet")
    return repo


FEAST_STORES = """\
import json, sys
import pyarrow.parquet as pq
from feast.type_map import NULL_TIMESTAMP_INT_VALUE, python_values_to_proto_values
from feast.value_type import ValueType

table = pq.read_table(sys.argv[1])
out = {}
for name in sys.argv[2:]:  # as feast materialize converts a column (feast.utils._columns_to_proto_values)
    values = python_values_to_proto_values(table.column(name).to_numpy(zero_copy_only=False), ValueType.UNIX_TIMESTAMP)
    out[name] = [None if v.unix_timestamp_val == NULL_TIMESTAMP_INT_VALUE else v.unix_timestamp_val for v in values]
print(json.dumps(out))
"""


def test_a_unix_timestamp_over_a_time_column_is_stored_as_its_epoch_seconds(tmp_path, feast_python, spark, redis_server, redis_db):
    from jobs.pipeline.run import run_source
    from serializers import field_id, freshness_field_name

    from .expected import expected_hash

    repo = write_times_repo(tmp_path)
    parquet = repo / "data" / "customer_times.parquet"
    found = {f.name: f.dataType.simpleString() for f in spark.read.parquet(str(parquet)).schema.fields}
    assert [found[c] for c in TIMES] == ["timestamp", "timestamp_ntz", "date", "bigint"]  # each kind of column the rule takes

    out = tmp_path / "defs"
    run = import_cli(repo, "--out", out, "--feast-python", feast_python)
    assert run.code == 0, run.stderr
    source = yaml.safe_load((out / "customer_times.yaml").read_text())["source"]
    assert source["features"] == [{"name": name, "type": "int"} for name in (*TIMES, "orders")]
    for name in TIMES:
        (line,) = [x for x in run.stdout.splitlines() if x.startswith(f"  customer_times:{name}: ")]
        assert line == (
            f"  customer_times:{name}: UnixTimestamp -> int: epoch seconds, as Feast's feature server returns it "
            "(of a timestamp or date column: its UTC seconds, floored)"
        )

    defs = load_definitions(out)
    conf = RunConf(
        env="test", data_root=str(tmp_path), reports_dir=str(tmp_path / "reports"), definitions_dir=str(out), sinks=["redis"],
        redis=RedisSettings(url=redis_server.url, password_env=None), quality=QualityConf(expectations=False, verify_sample=10),
    )  # fmt: skip
    summary = run_source(spark, conf, defs, "customer_times", TIMES_EVENT.date())
    assert summary.status == "succeeded", summary.error

    # what Feast's own materialization stores for the same file: its unix_timestamp_val, per row
    done = subprocess.run(
        [str(feast_python), "-c", FEAST_STORES, str(parquet), *TIMES], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    by_feast = json.loads(done.stdout)
    features = defs.sources["customer_times"].features
    fresh = field_id(freshness_field_name("customer_times"))
    for i, row in enumerate(TIMES_ROWS):
        values = dict(zip((*TIMES, "orders"), (*map(epoch_seconds, row[1:5]), row[5])))
        assert {name: by_feast[name][i] for name in TIMES} == {name: values[name] for name in TIMES}
        assert redis_db.hgetall(f"c:{row[0]}") == expected_hash(features, values, fresh, epoch_seconds(TIMES_EVENT))
    assert redis_db.hget("c:1", field_id("last_order_at")) == b"1795163415"  # 2026-11-20T08:30:15.75Z
    assert redis_db.hget("c:2", field_id("last_order_at")) == b"-1"  # 1969-12-31T23:59:59.5Z


# --- bad input: one line each, nothing written ----------------------------------------------------


def test_a_folder_without_feature_store_yaml(tmp_path, feast_python):
    (tmp_path / "repo").mkdir()
    run = import_cli(tmp_path / "repo", "--out", tmp_path / "defs", "--feast-python", feast_python)
    assert run.code == 2
    assert run.errors == [
        f"error: {tmp_path / 'repo'}: no feature_store.yaml: REPO is the folder of a Feast repository's feature_store.yaml "
        "(`feast init NAME` writes it in NAME/feature_repo)"
    ]
    assert not (tmp_path / "defs").exists()


def test_a_repository_that_does_not_load(tmp_path, feast_python):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text("project: broken\nregistry: data/registry.db\nprovider: local\n")
    (repo / "defs.py").write_text('from feast import Entity\n\nprint("top-level output goes to stderr")\n\nrate = Flaot32\n')
    run = import_cli(repo, "--out", tmp_path / "defs", "--feast-python", feast_python)
    assert run.code == 2
    assert run.errors == [f"error: {repo / 'defs.py'}:5: the Feast repository does not load: NameError: name 'Flaot32' is not defined"]
    assert not (tmp_path / "defs").exists()
    assert sorted(p.name for p in repo.iterdir()) == ["defs.py", "feature_store.yaml"]  # no __pycache__ left behind


def test_a_timeout_of_zero_is_refused_not_taken_for_the_default(tmp_path):
    run = import_cli(tmp_path, "--timeout", "0")
    assert (run.code, run.errors) == (2, ["error: --timeout 0: give Feast more than 0 seconds"])


def test_no_feast_interpreter(tmp_path, monkeypatch, feast_python):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text("project: p\n")
    out = tmp_path / "defs"
    how = "pass the Python of your Feast environment with --feast-python (e.g. --feast-python ~/venvs/feast/bin/python)"

    run = import_cli(repo, "--out", out, "--feast-python", tmp_path / "nowhere" / "python")
    assert (run.code, run.errors) == (2, [f"error: --feast-python {tmp_path / 'nowhere' / 'python'}: no such executable"])

    run = import_cli(repo, "--out", out, "--feast-python", sys.executable)  # this project's venv: no Feast in it
    assert (run.code, run.errors) == (2, [f"error: {sys.executable} cannot import Feast: No module named 'feast': {how}"])

    monkeypatch.setenv("PATH", str(tmp_path))  # no `feast` command to find the interpreter by
    run = import_cli(repo, "--out", out)
    assert (run.code, run.errors) == (2, [f"error: no `feast` command on PATH to find Feast's Python by: {how}"])

    # the `feast` command on PATH names its interpreter in its first line, as pip writes it
    (tmp_path / "feast").write_text(f"#!{feast_python}\nimport sys\n")
    (tmp_path / "feast").chmod(0o755)
    assert command.find_python() == feast_python
    assert not out.exists()

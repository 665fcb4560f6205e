"""Public Feast repositories that nobody here wrote, carried over with README "Coming from
Feast"'s commands alone: `materialize import-feast`, `materialize run --incremental` (its first
run loads every row up to now), `materialize serve`. Beside them Feast 0.67 (its own venv) runs
the repository's documented `feast apply` and `feast materialize 1990-01-01T00:00:00 NOW` into
a Redis database of its own. Feast's SDK then reads Feast's store, and Feast's remote client
reads `materialize serve`: every value, status and event time of every entity of the data (and
one entity that is not there) must be Feast's, however old the rows (from 2017 to 2021 here:
Feast serves them, and so must an imported view).

The snapshots are in tests/public_feast_repos (their README says from which commit, what is
left out and what is regenerated); only `feature_store.yaml` is pointed at local files here.
"""

from __future__ import annotations

import datetime as dt
import io
import shutil
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
import pyarrow.parquet as pq
import pytest

from jobs.cli import main
from throwaway import feast_venv

from .support.feast_example import feast
from .support.feast_reading import feast_reads, remote_client, run_as_readme_says, served_reads
from .support.serving import serve

pytestmark = pytest.mark.install  # Feast runs from a venv of its own

SNAPSHOTS = Path(__file__).with_name("public_feast_repos")
FEAST_DB, OUR_DB = 15, 10
CHUNK = 1000  # entities per read: the server's reader.max_entities


def credit_history_from_its_sample(repo: Path) -> None:
    """The tutorial's data/credit_history.parquet, which the snapshot lacks (a large file),
    made from the repository's own data/credit_history_sample.csv (its columns, 1,000 rows),
    typed as the tutorial's other table is: times UTC microseconds, integers int64."""
    ints = [
        "credit_card_due", "mortgage_due", "student_loan_due", "vehicle_loan_due", "hard_pulls",
        "missed_payments_2y", "missed_payments_1y", "missed_payments_6m", "bankruptcies",
    ]  # fmt: skip
    times = ["event_timestamp", "created_timestamp"]
    types = {**dict.fromkeys(times, pa.timestamp("us")), "dob_ssn": pa.string(), **dict.fromkeys(ints, pa.int64())}
    table = pv.read_csv(repo / "data" / "credit_history_sample.csv", convert_options=pv.ConvertOptions(column_types=types))
    for name in times:  # the CSV's times have no offset: UTC, as Feast takes a naive time
        table = table.set_column(table.schema.get_field_index(name), name, pc.assume_timezone(table[name], "UTC"))
    pq.write_table(table, repo / "data" / "credit_history.parquet")


def keys_of(repo: Path, file: str, column: str) -> list:
    return sorted(set(pq.read_table(repo / "data" / file, columns=[column]).column(column).to_pylist()))


MISSING = {"dob_ssn": "00000000_0000", "zipcode": 99999999, "driver_id": 9999}
"""Per join key, an entity with no row: each view's reads end with it."""


def reads_of(view: str, features: list[str], key: str, keys: list) -> list[dict]:
    """Feast's get_online_features requests for every key (in chunks), the last ending with one that has no row."""
    keys = [*keys, MISSING[key]]
    return [
        {"features": [f"{view}:{f}" for f in features], "entity_rows": [{key: k} for k in keys[i : i + CHUNK]]}
        for i in range(0, len(keys), CHUNK)
    ]


CREDIT_FEATURES = [
    "credit_card_due", "mortgage_due", "student_loan_due", "vehicle_loan_due", "hard_pulls",
    "missed_payments_2y", "missed_payments_1y", "missed_payments_6m", "bankruptcies",
]  # fmt: skip
ZIPCODE_FEATURES = ["city", "state", "location_type", "tax_returns_filed", "population", "total_wages"]
JAVA_FEATURES = ["conv_rate", "acc_rate", "avg_daily_trips", "string_feature"]


@dataclass(frozen=True)
class Public:
    folder: str
    """Under tests/public_feast_repos: the repository's feature_repo, as its commit has it."""
    project: str
    reads: Callable[[Path], list[dict]]
    left_out: dict[str, str]
    """Each object the import leaves out -> what its reason says."""
    float32: frozenset[str] = frozenset()
    regenerate: Callable[[Path], None] = lambda repo: None


REPOSITORIES = {
    "credit_score_local_tutorial": Public(
        folder="credit_score_local_tutorial/feature_repo",
        project="credit_scoring_local",
        reads=lambda repo: [
            *reads_of("credit_history", CREDIT_FEATURES, "dob_ssn", keys_of(repo, "credit_history.parquet", "dob_ssn")),
            *reads_of("zipcode_features", ZIPCODE_FEATURES, "zipcode", keys_of(repo, "zipcode_table.parquet", "zipcode")),
        ],
        left_out={"on-demand feature view total_debt_calc": "request time", "request source application_data": "request"},
        regenerate=credit_history_from_its_sample,
    ),
    "java_demo": Public(
        folder="java_demo/feature_repo",
        project="feast_java_demo",
        reads=lambda repo: reads_of(
            "driver_hourly_stats", JAVA_FEATURES, "driver_id", keys_of(repo, "driver_stats_with_string.parquet", "driver_id")
        ),
        left_out={"on-demand feature view transformed_conv_rate": "request time", "request source vals_to_add": "request"},
        float32=frozenset({"driver_hourly_stats__conv_rate", "driver_hourly_stats__acc_rate"}),
    ),
}


def local_settings(project: str, port: str) -> str:
    """The only change to a repository: its feature_store.yaml, pointed at this machine (its
    registry a local file, its online store a Redis database of Feast's own)."""
    return (
        f"project: {project}\nregistry: data/registry.db\nprovider: local\n"
        f'online_store:\n    type: redis\n    connection_string: "127.0.0.1:{port},db={FEAST_DB}"\n'
        "offline_store:\n    type: file\nentity_key_serialization_version: 3\n"
    )


@dataclass
class Carried:
    public: Public
    repo: Path
    imported: str
    """What `materialize import-feast` printed."""
    server: object
    conf_dir: Path


@pytest.fixture(scope="module", params=sorted(REPOSITORIES))
def carried(request, tmp_path_factory, spark, redis_server):
    public = REPOSITORIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    repo = root / "feature_repo"
    shutil.copytree(SNAPSHOTS / public.folder, repo)
    public.regenerate(repo)
    base = redis_server.url.rsplit("/", 1)[0]
    (repo / "feature_store.yaml").write_text(local_settings(public.project, base.rsplit(":", 1)[1]))
    for db in (FEAST_DB, OUR_DB):
        redis_server.client(db).flushdb()

    # README's commands, as a newcomer copies them
    defs = root / "defs"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["import-feast", str(repo), "--out", str(defs), "--feast-python", str(feast_venv.python())]) == 0
    settings = {"definitions_dir": str(defs), "sinks": ["redis"], "redis": {"url": f"{base}/{OUR_DB}", "password_env": None}}
    folder = run_as_readme_says(root, defs, f"{base}/{OUR_DB}")

    # Feast, as the repository's README says
    feast(repo, "apply")
    feast(repo, "materialize", "1990-01-01T00:00:00", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    server = serve(root / "serve", "t", settings)
    yield Carried(public, repo, printed.getvalue(), server, folder)
    server.stop()


def as_compared(public: Public, name: str, values: list) -> list:
    """Float32 features as the float32 they are (Feast's store hands back its float64)."""
    if name not in public.float32:
        return values
    return [None if v is None else float(np.float32(v)) for v in values]


def mismatched(public: Public, reads: list[dict], from_feast: list[dict], from_ours: list[dict], columns: tuple[str, ...]) -> dict:
    """Per column (``columns``: suffixes of each feature's name): the cells that differ from Feast's."""
    differ = {}
    for read, feasts, ours in zip(reads, from_feast, from_ours, strict=True):
        keys = list(read["entity_rows"][0])
        assert {k: ours[k] for k in keys} == {k: feasts[k] for k in keys}
        for ref in read["features"]:
            for column in (ref.replace(":", "__") + suffix for suffix in columns):
                pairs = zip(as_compared(public, column, ours[column]), as_compared(public, column, feasts[column]), strict=True)
                differ.setdefault(column, 0)
                differ[column] += sum(mine != theirs for mine, theirs in pairs)
    return {column: count for column, count in differ.items() if count}


def withheld(reads: list[dict], answers: list[dict]) -> list[tuple]:
    """(feature, entity row) of every None in ``answers`` but those of the entities with no row (MISSING)."""
    return [
        (ref, row)
        for read, answer in zip(reads, answers, strict=True)
        for ref in read["features"]
        for row, (value, keys) in enumerate(zip(answer[ref.replace(":", "__")], read["entity_rows"], strict=True))
        if value is None and not is_missing(keys)
    ]


def is_missing(entity_row: dict) -> bool:
    return all(MISSING[k] == v for k, v in entity_row.items())


def test_every_value_read_through_feasts_remote_client_is_feasts(carried, tmp_path):
    public = carried.public
    reads = public.reads(carried.repo)
    from_feast = feast_reads(carried.repo, reads)
    from_ours = feast_reads(remote_client(carried.repo, carried.server.port, tmp_path / "client"), reads)
    assert mismatched(public, reads, from_feast, from_ours, ("",)) == {}
    # every entity of the data has its values, however old (the data have no nulls); those with no row have none
    assert withheld(reads, from_ours) == []
    ends = [(read, ours) for read, ours in zip(reads, from_ours, strict=True) if is_missing(read["entity_rows"][-1])]
    assert len(ends) == len({tuple(read["features"]) for read in reads})  # one per view
    assert all(ours[ref.replace(":", "__")][-1] is None for read, ours in ends for ref in read["features"])


def test_every_event_time_and_status_served_to_feasts_client_is_feasts(carried):
    """Feast 0.67's remote client gives every row of a response the first row's event time (its
    `_get_event_ts`): the event times are compared in the body it reads, `materialize serve`'s."""
    public = carried.public
    reads = public.reads(carried.repo)
    from_feast = feast_reads(carried.repo, reads)
    from_ours = served_reads(carried.server, reads)
    assert mismatched(public, reads, from_feast, from_ours, ("",)) == {}
    for read, feasts, ours in zip(reads, from_feast, from_ours, strict=True):
        last = is_missing(read["entity_rows"][-1])  # an entity with no row: Feast's time 0, its status NULL_VALUE
        for ref in read["features"]:
            name = ref.replace(":", "__")
            times = feasts[f"{name}__ts"]
            assert ours[f"{name}__ts"][: len(times) - last] == times[: len(times) - last], name
            statuses = ["NULL_VALUE" if v is None else "PRESENT" for v in feasts[name]]
            assert ours[f"{name}__status"] == (statuses[:-1] + ["NOT_FOUND"] if last else statuses), name


def test_what_the_import_leaves_out_is_listed_with_its_reason(carried):
    lines = carried.imported.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("left out ("))
    found = [line[2:] for line in lines[start + 1 :] if line.startswith("  ")]
    assert len(found) == len(carried.public.left_out), found
    for what, reason in carried.public.left_out.items():
        (line,) = [line for line in found if line.startswith(what + ": ")]
        assert reason in line[len(what) + 2 :], line


def test_a_date_without_rows_of_its_own_is_not_ready_and_names_the_command_that_loads_them(carried, monkeypatch, capsys):
    # the data are years old: no day of late has rows of its own, which a nightly run of a date waits for
    monkeypatch.setenv("FM_CONF_DIR", str(carried.conf_dir))
    today = dt.datetime.now(dt.UTC).date()
    assert main(["run", "--env", "moved", "--date", str(today)]) == 3
    err = capsys.readouterr().err
    assert f"from {today.isoformat()}T00:00:00Z" in err and "not ready; nothing was written or recorded" in err, err
    assert "`materialize run --incremental` loads every row up to now whatever its date" in err, err

"""Reading beside Feast: what Feast's SDK answers (in Feast's own venv), a Feast client whose
online store is `materialize serve`, and `materialize serve`'s answers in the columns of
Feast's `to_dict()`. Shared by the tests of Feast repositories (test_feast_repositories,
test_feast_public_repositories)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from jobs.cli import main
from throwaway import feast_venv

from .confs import env_conf

SCRIPT = Path(__file__).resolve().parent.parent / "feast_reads.py"


def run_as_readme_says(root: Path, defs: Path, redis_url: str, more: str = "") -> Path:
    """README's load of an imported repository, `materialize run --env moved --incremental` (its
    first run loads every row up to now), into Redis at ``redis_url``, its files under ``root``;
    ``more``: further settings (YAML). The env's config folder."""
    folder = env_conf(
        root / "conf", "moved",
        f"data_root: {root}\ndefinitions_dir: {defs}\nledger_root: {root / 'ledger'}\nquarantine_root: {root / 'q'}\n"
        f"reports_dir: {root / 'reports'}\nsinks: [redis]\nredis:\n  url: {redis_url}\n{more}",
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FM_CONF_DIR", str(folder))
        assert main(["run", "--env", "moved", "--incremental"]) == 0  # every source succeeded
    return folder


def feast_reads(client_dir: Path, reads: list[dict]) -> list[dict]:
    """What Feast's SDK returns for each request, through the feature_store.yaml in ``client_dir``."""
    done = subprocess.run(
        [str(feast_venv.python()), str(SCRIPT)], input=json.dumps(reads), cwd=client_dir, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def remote_client(feast_repo: Path, port: int, folder: Path) -> Path:
    """A Feast client of the repository's registry whose online store is `materialize serve`."""
    folder.mkdir()
    project = next(
        line.split(":", 1)[1].strip()
        for line in (feast_repo / "feature_store.yaml").read_text().splitlines()
        if line.startswith("project:")
    )
    (folder / "feature_store.yaml").write_text(
        f"project: {project}\nregistry: {feast_repo / 'data' / 'registry.db'}\nprovider: local\n"
        f"online_store:\n    type: remote\n    path: http://127.0.0.1:{port}\nentity_key_serialization_version: 3\n"
        "auth:\n    type: no_auth\n"
    )
    return folder


def served_reads(server, reads: list[dict]) -> list[dict]:
    """`materialize serve`'s answers, in the columns of Feast's `to_dict()` (with `__ts` and
    `__status`), from its get-online-features body."""
    out = []
    for read in reads:
        entities = {k: [row[k] for row in read["entity_rows"]] for k in read["entity_rows"][0]}
        status, body = server.post({"features": read["features"], "entities": entities, "full_feature_names": True})
        assert status == 200, body
        got = json.loads(body)
        columns = dict(entities)
        for name, result in zip(got["metadata"]["feature_names"], got["results"], strict=True):
            if name in entities:
                assert result["values"] == entities[name]
                continue
            columns[name] = result["values"]
            columns[f"{name}__status"] = result["statuses"]
            columns[f"{name}__ts"] = [
                int(dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()) for t in result["event_timestamps"]
            ]
        out.append(columns)
    return out

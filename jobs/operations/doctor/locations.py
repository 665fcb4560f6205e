"""The locations a run writes (ledger, leases, quarantine, reports): there or creatable, and
reachable with this host's credentials; the ledger's log store on S3. Also a Delta table's
latest version and schema, read from its log without Spark."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fm_config import RunConf
from fm_config.locations import Location
from jobs.operations.doctor.line import DoctorLine

_COMMIT = re.compile(r"^(\d{20})\.json$")


_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")


def delta_log(conf: RunConf, where: Location) -> tuple[int, dict | None] | None:
    """(latest version, schema as JSON) of the Delta table at ``where``; None: no table there.
    The schema is the newest ``metaData`` action: in a commit, else in the last checkpoint."""
    files = conf.files
    names = files.file_names(where / "_delta_log")
    commits = sorted((int(m.group(1)) for n in names if (m := _COMMIT.match(n))), reverse=True)
    checkpoints = sorted((int(m.group(1)) for n in names if (m := _CHECKPOINT.match(n))), reverse=True)
    if not commits and not checkpoints:
        return None
    latest = max(commits[:1] + checkpoints[:1])
    floor = checkpoints[0] if checkpoints else -1
    for version in commits:
        if version <= floor:
            break
        for line in files.read_bytes(where / "_delta_log" / f"{version:020d}.json").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                return latest, json.loads(action["metaData"]["schemaString"])
    if checkpoints:
        import io

        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(files.read_bytes(where / "_delta_log" / f"{floor:020d}.checkpoint.parquet")), columns=["metaData"])
        for row in table.column("metaData").to_pylist():
            if row and row.get("schemaString"):
                return latest, json.loads(row["schemaString"])
    return latest, None


def locations(conf: RunConf) -> list[tuple[str, Location]]:
    ledger = conf.ledger_path
    return [
        ("ledger", ledger),
        ("leases", Location(str(ledger).rstrip("/") + "_leases")),
        ("quarantine", conf.quarantine_path),
        ("reports", conf.reports_path),
    ]


def check_location(conf: RunConf, label: str, where: Location) -> DoctorLine:
    """A location the run writes: there already, or creatable (local: the nearest existing
    folder is writable; remote: its parent can be listed, so the credentials reach it)."""
    table = label in ("ledger", "leases")
    if where.is_local:
        path = Path(where.local_path())
        if table and (path / "_delta_log").is_dir() or not table and path.is_dir():
            ok = os.access(path, os.W_OK)
            return DoctorLine(
                "ok" if ok else "fail",
                label,
                f"{where}: exists, {'writable' if ok else 'not writable by this user'}",
                f"let this user write {path}",
            )
        parent = next(p for p in [path, *path.parents] if p.exists())
        ok = parent.is_dir() and os.access(parent, os.W_OK)
        what = (
            f"{where}: not there yet, created by the first run" if ok else f"{where}: cannot be created ({parent} is not a writable folder)"
        )
        return DoctorLine(
            "ok" if ok else "fail", label, what, f"let this user write {parent}, or set the location elsewhere (conf/README.md)"
        )
    try:
        if table:
            found = bool(conf.files.file_names(where / "_delta_log"))
        else:
            found = bool(conf.files.folders(where) or conf.files.file_names(where))
        if not found:
            conf.files.folders(where.parent)  # reaching the parent proves the credentials work
    except OSError as exc:
        return DoctorLine("fail", label, f"{where}: cannot reach: {exc}", "check the URI, storage.* and this host's credentials for it")
    kind = "Delta table" if table else "folder"
    return DoctorLine(
        "ok", label, f"{where}: {kind} found" if found else f"{where}: reachable, created by the first run (writes are not tried)"
    )


def check_log_store(conf: RunConf) -> list[DoctorLine]:
    """A ledger on S3 takes commits from every driver that runs here (nightly runs, backfills):
    Delta's default S3 log store is safe for one driver at a time only."""
    ledger = str(conf.ledger_path)
    scheme = ledger.split("://", 1)[0] if "://" in ledger else ""
    if scheme not in ("s3a", "s3", "s3n"):
        return []
    store = conf.spark.extra.get(f"spark.delta.logStore.{scheme}.impl", "")
    if "DynamoDB" in store:
        return [DoctorLine("ok", "ledger log store", f"{store}: concurrent commits from several drivers are safe")]
    return [DoctorLine(
        "warn", "ledger log store",
        f"the ledger is on S3 ({ledger}) with Delta's single-driver log store: "
        "a backfill and a nightly run on two drivers may overwrite each other's commit",
        f"set spark.extra spark.delta.logStore.{scheme}.impl: io.delta.storage.S3DynamoDBLogStore "
        "(conf/README.md 'Concurrent writers on S3'), or put ledger_root on abfss://, gs:// or hdfs://",
    )]  # fmt: skip

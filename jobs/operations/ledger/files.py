"""The run ledger read without Spark (for ``doctor``, which starts no Spark session): its
Delta log replayed from the last checkpoint, then the live data files read with pyarrow,
through the same filesystems as the reports (local paths and URIs).

The ledger is append-only and unpartitioned: a file's rows are live until the log removes
the file. Each event is a small file of its own; asked for one source, the reader skips the
files whose column statistics in the log exclude it (as Spark's data skipping does), and
reads the rest on a few threads (object storage answers each read in tens of ms). A table
using a feature this reader does not follow (deletion vectors, a v2 checkpoint) is refused
with an error naming it, rather than read wrongly.

Runs and backfill plans read the ledger this way too (Ledger.source_steps): a Spark query
of a small table costs seconds of planning and scheduling, this milliseconds.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

from fm_config.locations import Files, Location

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
TIMES = ("started_at", "ended_at", "recorded_at", "window_start", "window_end", "window_requested_end")


class LedgerReadError(OSError):
    pass


def read_events(files: Files, path: str, source: str | None = None) -> list[dict[str, Any]]:
    """Every event row of the ledger at ``path`` (none when there is no table there); with
    ``source``, at least those of that source (files that may hold it are read whole)."""
    import pyarrow.parquet as pq

    where = Location(path)
    log = where / "_delta_log"
    names = files.file_names(log)
    commits = sorted(int(m.group(1)) for n in names if (m := _COMMIT.match(n)))
    parts: dict[int, list[str]] = {}
    for n in names:
        if m := _CHECKPOINT.match(n):
            parts.setdefault(int(m.group(1)), []).append(n)
    complete = [v for v, ns in parts.items() if len(ns) == (int(_CHECKPOINT.match(ns[0]).group(3) or 1))]
    checkpoint = max(complete, default=-1)
    live: dict[str, dict] = {}
    for name in sorted(parts.get(checkpoint, [])):
        table = pq.read_table(io.BytesIO(files.read_bytes(log / name)), columns=["add"])
        for add in table.column("add").to_pylist():
            if add:
                live[add["path"]] = add
    if checkpoint < 0 and commits and commits[0] != 0:
        raise LedgerReadError(f"{log}: commits before version {commits[0]} are gone and no checkpoint covers them")
    for version in (v for v in commits if v > checkpoint):
        for line in files.read_bytes(log / f"{version:020d}.json").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                live[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    wanted = []
    for file, add in live.items():
        if add.get("deletionVector"):
            raise LedgerReadError(f"{where}: {file} has a deletion vector, which this reader does not follow: read the ledger with Spark")
        if source is None or _may_hold(add, source):
            wanted.append(unquote(file) if "://" in file else where / unquote(file))
    with ThreadPoolExecutor(max_workers=8) as pool:
        tables = list(pool.map(lambda full: pq.read_table(io.BytesIO(files.read_bytes(full))).to_pylist(), wanted))
    rows = [row for table in tables for row in table]
    for row in rows:
        for name in TIMES:
            if isinstance(row.get(name), dt.datetime) and row[name].tzinfo is None:
                row[name] = row[name].replace(tzinfo=dt.UTC)  # Spark wrote UTC instants
    return rows


def _may_hold(add: dict, source: str) -> bool:
    """Whether a data file may hold rows of ``source``, by its column statistics in the log."""
    try:
        stats = json.loads(add.get("stats") or "{}")
    except ValueError:
        return True
    low, high = (stats.get(k, {}).get("source") for k in ("minValues", "maxValues"))
    records = stats.get("numRecords")
    if records is not None and stats.get("nullCount", {}).get("source") == records:
        return False  # cleanups only: no source
    return low is None or high is None or low <= source <= high


def latest_steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step in its latest state, as Ledger.steps(): a finished event outranks 'running'."""
    best: dict[str, dict[str, Any]] = {}
    for e in events:
        rank = (e["status"] != "running", e["recorded_at"])
        held = best.get(e["run_id"])
        if held is None or rank > (held["status"] != "running", held["recorded_at"]):
            best[e["run_id"]] = e
    return list(best.values())


def read_steps(files: Files, path: str, columns: tuple[str, ...], source: str | None = None) -> list[dict[str, Any]]:
    """latest_steps of read_events (with ``source``: that source's only), every one of
    ``columns`` present (None when an older version wrote the row)."""
    steps = latest_steps(read_events(files, path, source))
    return [{c: s.get(c) for c in columns} for s in steps if source is None or s.get("source") == source]

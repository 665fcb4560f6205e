"""``materialize doctor``: does each store still hold what the ledger says was written to it?

One check per source and store the ledger recorded a write of (``redis data SOURCE``,
``sql data SOURCE``), comparing the store now with what the last write left, as a run does
before writing (ledger/store_state.py): a store that lost data fails, naming the dates and the
command that restores them (a backfill; for a source selected by event time, a run of the
last date), until it has run. The ledger is read without
Spark (ledger/files.py); the stores with read-only commands (INFO, CONFIG GET, HMGET of a
few keys; SELECTs in the SQL store).
"""

from __future__ import annotations

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine
from jobs.operations.ledger.files import read_steps

LABELS = {"redis": "redis data", "sql": "sql data"}
COLUMNS = ("run_id", "kind", "source", "status", "start_date", "dates", "targets", "started_at", "ended_at", "stores")


def check_stored_data(conf: RunConf, defs: Definitions, sources: list[str], sinks: list[str]) -> list[DoctorLine]:
    steps = read_steps(conf.files, str(conf.ledger_path), COLUMNS)
    if not steps:
        return []  # no ledger yet: nothing was written to compare with
    from jobs.operations.ledger.store_state import check_stores, date_ranges, restore_command

    checks = []
    for name in sources:
        mine = [s for s in steps if s["source"] == name]
        if not mine:
            continue
        try:
            findings = [f for f in check_stores(conf, defs, name, mine) if f.sink in sinks]
        except Exception as exc:  # noqa: BLE001 (one source's stores that do not answer hide no other's)
            checks.append(DoctorLine("fail", f"stored data {name}", f"could not compare with the ledger: {type(exc).__name__}: {exc}"))
            continue
        lost = [f for f in findings if f.lost]
        by_event_time = defs.source(name).by_event_time
        dates, stores = [d for f in lost for d in f.lost], [f.sink for f in lost]
        command = restore_command(conf.env, name, dates, stores, list(conf.sinks), by_event_time=by_event_time) if lost else ""
        writes = (
            "each entity's latest row up to that date's end" if by_event_time else "those dates again; nightly runs write only their own"
        )
        for f in findings:
            label = f"{LABELS[f.sink]} {name}"
            if f.seen is None and not f.lost:
                continue  # no write of it recorded what the store held
            if f.lost:
                checks.append(
                    DoctorLine(
                        "fail",
                        label,
                        f"{f.target} lost {name}'s data of {date_ranges(f.lost)}: {f.evidence}",
                        f"run `{command}` (writes {writes})",
                    )
                )
            elif f.warning:
                fix = "find out what deleted them; `materialize backfill ... --force` writes them again"
                checks.append(DoctorLine("warn", label, f.warning, fix))
            else:
                checks.append(DoctorLine("ok", label, f"{f.target}: {f.evidence}"))
    return checks

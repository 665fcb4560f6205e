"""A process that races others for leases and ledger appends (tests/test_leases.py).

``python -m tests.lease_racer LEDGER BARRIER NAME RACERS ROUNDS`` starts one JVM, then plays
ROUNDS rounds with the other RACERS processes. In each round every racer meets the others at
a file barrier and then, at the same moment, claims the lease of the round's source; they meet
again and each appends one event to the ledger; they meet a last time and the winner releases
the lease (its release races the next round's claims, of another source). One JSON line per
round on stdout: the claim's outcome (``won``, ``held: <message>`` or ``error: <exception>``)
and the append's (``ok`` or ``error: ...``). An error does not stop the racer: the test counts them.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

from fm_config import SparkConf
from jobs.operations.ledger.events import Entry, Ledger
from jobs.operations.ledger.lease import LeaseHeld, Leases
from jobs.spark import build_spark

TARGET = ["redis://h:6379/0"]
BARRIER_TIMEOUT = 600.0  # the others start their JVMs on a shared machine: generous


def source_of(round_: int) -> str:
    return f"race_{round_:02d}"


def meet(barrier: Path, phase: str, me: str, racers: int) -> None:
    """Wait until every racer has reached ``phase``."""
    Path(barrier, f"{phase}.{me}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT
    while len(list(barrier.glob(f"{phase}.*"))) < racers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"racer {me}: the others did not reach {phase}")
        time.sleep(0.002)


def outcome(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {str(exc)[:400]}"


def main(ledger_path: str, barrier: str, me: str, racers: int, rounds: int) -> None:
    spark = build_spark(SparkConf(master="local[1]", shuffle_partitions=1, driver_memory="512m", app_name=f"lease-racer-{me}"))
    leases = Leases(spark, ledger_path, seconds=3600)  # no renewal here: it outlasts any wait for the lock
    ledger = Ledger(spark, ledger_path)
    leases.holders("warm-up")  # Delta's classes loaded before the race
    folder = Path(barrier)
    for r in range(rounds):
        source = source_of(r)
        meet(folder, f"claim-{r}", me, racers)
        started = time.monotonic()
        try:
            leases.take(source, TARGET, f"run by {me}")
            claim = "won"
        except LeaseHeld as exc:
            claim = f"held: {exc}"
        except Exception as exc:  # noqa: BLE001 (the test reports it)
            claim = outcome(exc)
        claimed = time.monotonic() - started
        meet(folder, f"append-{r}", me, racers)
        started = time.monotonic()
        day = dt.date(2026, 1, 1) + dt.timedelta(days=r)
        entry = Entry("run", source, "consumer", day, day, ["redis"], "defs", "conf", run_id=f"{me}-{r}", status="succeeded")
        try:
            ledger.record(entry)
            append = "ok"
        except Exception as exc:  # noqa: BLE001
            append = outcome(exc)
        seconds = {"claim_s": round(claimed, 2), "append_s": round(time.monotonic() - started, 2)}
        print(json.dumps({"round": r, "racer": me, "claim": claim, "append": append, **seconds}), flush=True)
        meet(folder, f"end-{r}", me, racers)
        if claim == "won":
            try:
                leases.release(source, TARGET)
            except Exception as exc:  # noqa: BLE001
                print(json.dumps({"round": r, "racer": me, "release": outcome(exc)}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))

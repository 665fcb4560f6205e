"""A process that races another for a lease (tests/test_leases.py): both start their JVMs,
meet at a file barrier, then claim the same (source, store) at once; the winner holds it
until the loser has been refused (at most ``hold`` seconds)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fm_config import SparkConf
from jobs.operations.lease import LeaseHeld, Leases
from jobs.spark import build_spark


def main(ledger: str, barrier: str, me: str, hold: float) -> None:
    spark = build_spark(SparkConf(master="local[1]", shuffle_partitions=1, app_name=f"lease-racer-{me}"))
    leases = Leases(spark, ledger, seconds=60)
    leases.holders("consumer_daily")  # Delta's classes loaded before the race
    Path(barrier, me).touch()
    while len(list(Path(barrier).iterdir())) < 2:
        time.sleep(0.01)
    try:
        leases.take("consumer_daily", ["redis://h:6379/0"], f"run by {me}")
    except LeaseHeld as exc:
        print(f"held: {exc}", flush=True)
        Path(barrier, "lost").touch()
        return
    print("won", flush=True)
    deadline = time.monotonic() + hold
    while not Path(barrier, "lost").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # held until the loser's claim has ended
    leases.release("consumer_daily", ["redis://h:6379/0"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))

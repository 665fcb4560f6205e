"""The soak (bench/soak, `make bench-soak`) in short: `materialize serve` over the values the
real job wrote into a persistent Redis and PostgreSQL, under steady open-loop load (1 x 50
and 100 x 50, hot and cold keys), while Redis is paused, Redis is restarted and 200 slow
clients hold connections, one at a time with quiet periods between. Every 200 answer is
checked, entity by entity, against the values read from the table's Parquet files.

No timing is asserted but recovery, with an allowance generous enough for a busy machine:
no 500s, no wrong values, errors only inside a fault's window (+ the allowance), every
fault recovered within the allowance once its store was back, and no error at all while
the slow clients hold their connections (they must cost only themselves)."""

from __future__ import annotations

import json

from bench.soak.analysis import analyse
from bench.soak.run import Plan, soak

ALLOWANCE = 8.0
"""Seconds after a store is back in which errors still count as its fault's (the bench's goal is 2)."""


def test_the_server_recovers_from_store_faults_and_slow_clients_and_never_answers_wrong(spark, tmp_path):
    plan = Plan(
        entities=500,
        rates={(1, "hot"): 20, (1, "cold"): 20, (100, "hot"): 2, (100, "cold"): 2},
        warm_up=5.0,
        quiet=ALLOWANCE + 4,
        faults=("redis_paused", "redis_restarted", "slow_clients"),
        pause_seconds=3.0,
        down_seconds=3.0,
        slow_seconds=5.0,
        # time is not the subject here: a read may take a busy machine's while; in flight at
        # most 64 (default 256), so the 67 clients that send half a body would fill it if counted
        server={"reader": {"timeout_ms": 1000}, "server": {"deadline_ms": 5000, "max_in_flight": 64}},
    )
    report = analyse(soak(tmp_path / "soak", plan, spark=spark), ALLOWANCE)
    summary = json.dumps({k: report[k] for k in ("faults", "errors_outside_windows_first", "wrong_detail", "error_samples")})[:3000]
    assert report["answers_200"] > 500 and report["entities_checked"] > 5000, summary  # the load ran and was checked
    assert report["wrong_entities"] == 0 and report["new_values_before_the_nightly_run"] == 0, summary
    assert report["status_500"] == 0, summary
    assert report["errors_outside_windows"] == 0, summary
    restarted = next(f for f in report["faults"] if f["fault"] == "redis restarted")
    assert restarted["keys_after_restart"] == restarted["keys_before"] > 0  # persistence: the data came back
    for fault in report["faults"]:
        assert fault["recovery_seconds"] is not None and fault["recovery_seconds"] <= ALLOWANCE, summary
    slow = next(f for f in report["faults"] if f["fault"] == "200 slow clients")
    assert slow["errors"] == 0, summary  # slow clients cost only themselves
    assert all(s is not None for s in report["shutdown_seconds"].values()), report["shutdown_seconds"]

"""One writer per (source, store): two real processes racing for a lease, a run refused
while another holds it (the holder named), a wait that ends when the holder releases, a
backfill holding it across its steps, and an expired lease taken over."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading
import time

import pytest

from feature_defs import load_definitions
from fm_config import PROJECT_ROOT
from jobs.cli import EXIT_LEASE_HELD, main
from jobs.operations.backfill import plan_backfill, recorded_run, run_backfill
from jobs.operations.lease import LeaseHeld, Leases
from jobs.operations.ledger import Ledger, sink_targets

from .conftest import SAMPLE_DATES, env_conf, short_lived_jvm_options

DEFS = load_definitions()
SOURCE = "consumer_daily"
TARGET = ["redis://h:6379/0"]


@pytest.mark.slow
def test_two_processes_claiming_at_once_get_one_lease(tmp_path):
    """Two Python processes with their own JVMs meet at a barrier and claim the same lease:
    exactly one wins; the other is told who holds it."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    ledger = str(tmp_path / "ledger")
    env = {**os.environ, "SPARK_SUBMIT_OPTS": short_lived_jvm_options()}
    racers = [
        subprocess.Popen([sys.executable, "-m", "tests.lease_racer", ledger, str(barrier), name, "60"], cwd=PROJECT_ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]  # fmt: skip
    outs = [r.communicate(timeout=240) for r in racers]
    assert [r.returncode for r in racers] == [0, 0], [e[-2000:] for _, e in outs]
    lines = sorted(o.strip().splitlines()[-1] for o, _ in outs)
    assert lines[1] == "won", lines
    winner = "a" if outs[0][0].strip().endswith("won") else "b"
    assert lines[0].startswith(f"held: source '{SOURCE}' is being written to {TARGET[0]} by run by {winner} on "), lines


@pytest.fixture
def conf(run_conf, tmp_path):
    return run_conf.model_copy(update={"ledger_root": str(tmp_path / "ledger")})


def _other_holds(spark, conf, seconds: float = 60) -> Leases:
    """The lease held by another (simulated) process: its own holder name in the table."""
    other = Leases(spark, conf.ledger_path, seconds=seconds, holder="otherhost:4242:cafe0001")
    other.take(SOURCE, sorted(sink_targets(conf).values()), "backfill-replay")
    return other


def test_a_run_while_another_writes_the_source_stops_naming_the_holder(spark, conf, redis_db, tmp_path, monkeypatch, capsys):
    other = _other_holds(spark, conf)
    ledger = Ledger.of(spark, conf)
    with pytest.raises(
        LeaseHeld,
        match=r"source 'consumer_daily' is being written to redis://127\.0\.0\.1:\d+/0 by backfill-replay on .* "
        r"\(pid \d+, since .* UTC, lease until .* UTC\)",
    ):
        recorded_run(spark, conf, DEFS, ledger, "run", SOURCE, SAMPLE_DATES[-1])
    assert redis_db.dbsize() == 0  # nothing written
    assert ledger.steps().count() == 0  # nor recorded

    # the CLI: exit code 5 and the same message
    folder = env_conf(tmp_path / "conf", "leased", (
        f"data_root: {conf.data_root}\nledger_root: {conf.ledger_root}\nreports_dir: {tmp_path / 'reports'}\nsinks: [redis]\n"
        f"redis: {{url: '{conf.redis.url}', password_env: null}}\nquality: {{expectations: false}}\n"
    ))  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    code = main(["run", "--env", "leased", "--date", SAMPLE_DATES[-1].isoformat(), "--source", SOURCE])
    assert code == EXIT_LEASE_HELD
    assert "is being written to redis://127.0.0.1" in capsys.readouterr().err

    # waiting: the holder ends while the run waits, and the run then writes
    threading.Timer(3, other.release, (SOURCE, sorted(sink_targets(conf).values()))).start()
    start = time.monotonic()
    summary = recorded_run(
        spark,
        conf.model_copy(update={"lease": conf.lease.model_copy(update={"wait_seconds": 120})}),
        DEFS,
        ledger,
        "run",
        SOURCE,
        SAMPLE_DATES[-1],
    )
    assert summary.status == "succeeded" and time.monotonic() - start >= 3
    assert redis_db.dbsize() == summary.sinks["redis"]["entities"] > 0
    assert Leases(spark, conf.ledger_path, seconds=60).holders(SOURCE) == {}  # released at the end


def test_an_expired_lease_is_taken_over_and_the_old_holder_finds_it_lost(spark, conf):
    other = Leases(spark, conf.ledger_path, seconds=5, holder="crashed:1:dead0001")
    other.take(SOURCE, TARGET, "run")
    mine = Leases(spark, conf.ledger_path, seconds=60)
    with pytest.raises(LeaseHeld, match="by run on"):
        mine.take(SOURCE, TARGET, "run")
    time.sleep(5.5)  # the crashed holder renews no more
    assert mine.take(SOURCE, TARGET, "backfill-latest", wait=0) is False
    assert mine.holders(SOURCE)[TARGET[0]].holder == mine.holder
    assert other.renew(SOURCE, TARGET, "run") is False  # the old holder, back, learns it lost the lease
    mine.release(SOURCE, TARGET)
    assert mine.holders(SOURCE) == {}


def test_a_backfill_holds_the_lease_across_its_steps(spark, conf, redis_db):
    ledger = Ledger.of(spark, conf)
    seen: list[dict] = []
    targets = sorted(sink_targets(conf).values())

    def between_steps(summary):  # after each step's write: the lease is still the backfill's
        seen.append({t: h.kind for t, h in Leases(spark, conf.ledger_path, seconds=60).holders(SOURCE).items()})
        with pytest.raises(LeaseHeld):
            Leases(spark, conf.ledger_path, seconds=60, holder="nightly:1:0000beef").take(SOURCE, targets, "run")

    plan = plan_backfill(spark, conf, DEFS, ledger, SOURCE, SAMPLE_DATES[0], SAMPLE_DATES[-1], "replay", force=False)
    run_backfill(spark, conf, DEFS, ledger, plan, after_write=between_steps)
    assert seen == [{targets[0]: "backfill-replay"}] * len(SAMPLE_DATES)
    assert Leases(spark, conf.ledger_path, seconds=60).holders(SOURCE) == {}


def test_the_leases_live_beside_the_ledger_at_a_uri(spark, tmp_path):
    leases = Leases(spark, f"file://{tmp_path}/lake/_ledger/", seconds=60)
    assert leases.path == f"file://{tmp_path}/lake/_ledger_leases"
    leases.take(SOURCE, TARGET, "run")
    assert (tmp_path / "lake" / "_ledger_leases" / "_delta_log").is_dir()
    leases.release(SOURCE, TARGET)


def test_claims_of_different_sources_at_once_do_not_conflict(spark, conf):
    """Sources run at once (parallel_sources) claim their leases at the same moment: one
    MERGE each, no retry (on an unpartitioned table the second one fails to commit)."""
    leases = Leases(spark, conf.ledger_path, seconds=60)
    leases._table()
    start, now = threading.Barrier(2), dt.datetime.now(dt.UTC).replace(microsecond=0)
    results: dict[str, object] = {}

    def claim(source: str) -> None:
        start.wait()
        try:
            results[source] = leases._merge(source, TARGET, "run", now, renew_only=False)  # no retry
        except Exception as exc:  # noqa: BLE001 (reported below)
            results[source] = f"{type(exc).__name__}: {exc}"[:300]

    threads = [threading.Thread(target=claim, args=(s,)) for s in ("consumer_daily", "store_features_long")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"consumer_daily": 1, "store_features_long": 1}
    assert spark.sql(f"DESCRIBE DETAIL delta.`{leases.path}`").first()["partitionColumns"] == ["source"]
    assert {s: list(leases.holders(s)) for s in results} == {s: TARGET for s in results}


def test_renewal_keeps_a_lease_past_its_first_expiry(spark, conf):
    leases = Leases(spark, conf.ledger_path, seconds=5)
    with leases.hold(SOURCE, TARGET, "run"):
        first = leases.holders(SOURCE)[TARGET[0]].expires_at
        time.sleep(6)  # past the first expiry: renewed every 1.7 s meanwhile
        later = leases.holders(SOURCE)[TARGET[0]]
        assert later.holder == leases.holder and later.expires_at > first
        with pytest.raises(LeaseHeld):
            Leases(spark, conf.ledger_path, seconds=5, holder="other:2:0000abcd").take(SOURCE, TARGET, "run")
    assert leases.holders(SOURCE) == {}

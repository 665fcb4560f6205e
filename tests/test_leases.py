"""One writer per (source, store): real processes racing for leases and ledger appends, a run refused
while another holds it (the holder named), a wait that ends when the holder releases, a
backfill holding it across its steps, and an expired lease taken over."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from feature_defs import load_definitions
from fm_config import PROJECT_ROOT
from jobs.cli import main
from jobs.exit_codes import EXIT_LEASE_HELD, EXIT_TERMINAL
from jobs.operations.backfill import plan_backfill, recorded_run, run_backfill
from jobs.operations.ledger.events import SCHEMA as LEDGER_SCHEMA
from jobs.operations.ledger.events import Entry, Ledger, sink_targets
from jobs.operations.ledger.lease import LeaseHeld, Leases
from jobs.operations.ledger.local_commits import DeltaLogError, commit_lock

from .expected import entity_count
from .lease_racer import source_of
from .support.confs import env_conf
from .support.jvm import short_lived_jvm_options
from .support.samples import SAMPLE_DATES

DEFS = load_definitions()
SOURCE = "consumer_daily"
TARGET = ["redis://h:6379/0"]


RACERS, ROUNDS = 3, 2


@pytest.mark.slow
def test_processes_claiming_and_appending_at_once_get_one_winner_each_round_and_lose_no_commit(spark, tmp_path):
    """RACERS processes, each with its own JVM, meet at a file barrier and at the same moment
    claim the round's lease, then meet again and each append a ledger event; ROUNDS rounds,
    the first of which makes both tables. Each round has exactly one winner and the others are
    told who holds it (LeaseHeld: exit 5 from the CLI); no commit is lost and the logs read
    whole afterwards (on a local disk two commits of one version both 'succeeded', and could
    leave a file beside the other's checksum)."""
    barrier, ledger = tmp_path / "barrier", tmp_path / "ledger"
    barrier.mkdir()
    names = [f"p{i}" for i in range(RACERS)]
    outs = _race(names, ledger, barrier)
    rounds = {r: {name: outs[name][r] for name in names} for r in range(ROUNDS)}
    for r, got in rounds.items():
        winners = [name for name, line in got.items() if line["claim"] == "won"]
        assert len(winners) == 1, (r, got)
        held = f"held: source '{source_of(r)}' is being written to redis://h:6379/0 by run by {winners[0]} on "
        assert all(line["claim"].startswith(held) for name, line in got.items() if name != winners[0]), (r, got)
        assert [line["append"] for line in got.values()] == ["ok"] * RACERS, (r, got)

    # read by this process, which has not read these tables before
    events = spark.read.format("delta").load(str(ledger)).select("run_id").collect()
    assert sorted(e["run_id"] for e in events) == sorted(f"{name}-{r}" for name in names for r in range(ROUNDS))
    leases = Leases(spark, str(ledger), seconds=60)
    assert {source_of(r): leases.holders(source_of(r)) for r in range(ROUNDS)} == {source_of(r): {} for r in range(ROUNDS)}
    # one log version per commit made (a commit overwritten by another of the same version is missing):
    # the ledger: one append per racer and round (the first makes the table); the leases: made once,
    # one MERGE per claim, one DELETE per release
    assert _versions(ledger) == list(range(RACERS * ROUNDS))
    assert _versions(Path(leases.path)) == list(range(1 + RACERS * ROUNDS + ROUNDS))
    for table in (ledger, Path(leases.path)):
        assert _checksums_not_matching(table) == []


def _race(names: list[str], ledger: Path, barrier: Path) -> dict[str, list[dict]]:
    """Run the racers (tests/lease_racer.py) to the end: their lines, by name. One that fails
    stops the others (they would wait at the barrier)."""
    env = {**os.environ, "SPARK_SUBMIT_OPTS": short_lived_jvm_options()}
    logs = {name: (barrier.parent / f"{name}.out", barrier.parent / f"{name}.err") for name in names}
    racers = {}
    for name, (out, err) in logs.items():
        with out.open("w") as stdout, err.open("w") as stderr:
            command = [sys.executable, "-m", "tests.lease_racer", str(ledger), str(barrier), name, str(RACERS), str(ROUNDS)]
            racers[name] = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=stdout, stderr=stderr)
    deadline = time.monotonic() + 900  # a shared machine: JVM starts and MERGEs can be slow
    try:
        while any(p.poll() is None for p in racers.values()) and time.monotonic() < deadline:
            failed = [name for name, p in racers.items() if p.poll() not in (None, 0)]
            assert not failed, {name: logs[name][1].read_text()[-3000:] for name in failed}
            time.sleep(0.5)
    finally:
        for p in racers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    assert {name: p.returncode for name, p in racers.items()} == dict.fromkeys(names, 0), {
        name: logs[name][1].read_text()[-3000:] for name in names
    }
    lines = {name: [json.loads(line) for line in logs[name][0].read_text().splitlines() if line.startswith("{")] for name in names}
    assert {name: [line["round"] for line in got] for name, got in lines.items()} == {name: list(range(ROUNDS)) for name in names}, lines
    return lines


def _checksums_not_matching(table: Path) -> list[str]:
    """The files of the table's log whose Hadoop checksum file (``.<name>.crc``: "crc\\0", the
    bytes per checksum, a CRC-32 per chunk) does not match them."""
    wrong = []
    for file in sorted((table / "_delta_log").iterdir()):
        sidecar = file.with_name(f".{file.name}.crc")
        if file.is_file() and sidecar.exists():
            raw, data = sidecar.read_bytes(), file.read_bytes()
            (chunk,) = struct.unpack(">i", raw[4:8])
            sums = [zlib.crc32(data[i : i + chunk]) for i in range(0, len(data), chunk)]
            if raw[:4] != b"crc\0" or raw[8:] != struct.pack(f">{len(sums)}I", *sums):
                wrong.append(file.name)
    return wrong


def _versions(table: Path) -> list[int]:
    return sorted(int(f.name[:20]) for f in (table / "_delta_log").iterdir() if re.fullmatch(r"\d{20}\.json", f.name))


@pytest.fixture
def conf(run_conf, tmp_path):
    return run_conf.model_copy(update={"ledger_root": str(tmp_path / "ledger")})


def _other_holds(spark, conf, seconds: float = 600) -> Leases:
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
    assert entity_count(redis_db) == summary.sinks["redis"]["entities"] > 0
    assert Leases(spark, conf.ledger_path, seconds=60).holders(SOURCE) == {}  # released at the end


def test_an_expired_lease_is_taken_over_and_the_old_holder_finds_it_lost(spark, conf):
    other = Leases(spark, conf.ledger_path, seconds=600, holder="crashed:1:dead0001")
    other.take(SOURCE, TARGET, "run")
    mine = Leases(spark, conf.ledger_path, seconds=60)
    with pytest.raises(LeaseHeld, match="by run on"):
        mine.take(SOURCE, TARGET, "run")
    # the crashed holder renews no more: its lease runs out (set in the past rather than waited
    # for, so a claim slower than the lease on a busy machine cannot find it expired too early)
    Leases(spark, conf.ledger_path, seconds=-1, holder=other.holder).take(SOURCE, TARGET, "run")
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


# -- the commit lock, and logs left damaged by older versions --------------------------------------

LOCKED_WRITER = """
import os, sys, time
from jobs.operations.ledger.local_commits import commit_lock
table, log, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(rounds):
    with commit_lock(table):
        with open(log, "a") as f:
            f.write(f"in {os.getpid()}\\n")
        time.sleep(0.02)
        with open(log, "a") as f:
            f.write(f"out {os.getpid()}\\n")
"""


def test_the_commit_lock_admits_one_process_at_a_time(tmp_path):
    table, log = tmp_path / "ledger", tmp_path / "log"
    writers = [
        subprocess.Popen([sys.executable, "-c", LOCKED_WRITER, str(table), str(log), "5"], cwd=PROJECT_ROOT, stderr=subprocess.PIPE)
        for _ in range(6)
    ]
    assert [w.wait(timeout=120) for w in writers] == [0] * 6, [w.stderr.read() for w in writers]
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 6 * 5 * 2
    # each entry is followed by the same process's exit: no one was inside with another
    assert all(a == ["in", pid] and b == ["out", pid] for (a, b), pid in zip(zip(lines[::2], lines[1::2]), (x[1] for x in lines[::2])))
    assert (table / "_commits.lock").is_file() and not (table / "_delta_log").exists()


def test_the_commit_lock_admits_one_thread_at_a_time_and_again_the_thread_that_holds_it(tmp_path):
    table, inside, seen = str(tmp_path / "ledger"), [], []

    def commit() -> None:
        for _ in range(20):
            with commit_lock(table), commit_lock(table):  # a claim that makes the table first takes it twice
                inside.append(1)
                seen.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=commit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen == [1] * 80


def test_a_stuck_holder_is_named_and_a_dead_one_lets_go(tmp_path):
    table = tmp_path / "ledger"
    code = "import sys, time\nfrom jobs.operations.ledger.local_commits import commit_lock\nwith commit_lock(sys.argv[1]):\n"
    code += "    print('held', flush=True)\n    time.sleep(600)\n"
    holder = subprocess.Popen([sys.executable, "-c", code, str(table)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            DeltaLogError, match=rf"the commit lock {table}/_commits.lock has been held for over 0.5 s \(held by .* pid {holder.pid} "
        ):
            with commit_lock(str(table), timeout=0.5):
                pass
    finally:
        holder.kill()
        holder.wait()
    with commit_lock(str(table), timeout=60):  # the kernel let go of the killed holder's lock
        pass


def _forget_logs(spark) -> None:
    """This JVM reads every Delta log afresh from disk, as a new process would."""
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def _swap_checksum(table: Path, version: int, other: int) -> Path:
    """Put commit ``other``'s checksum file beside commit ``version``: what two commits of one
    version at once left on a local disk (each renames its file, then its checksum file)."""
    logs = table / "_delta_log"
    shutil.copyfile(logs / f".{other:020d}.json.crc", logs / f".{version:020d}.json.crc")
    return logs / f"{version:020d}.json"


def _older_ledger(spark, path: Path, count: int) -> list[Entry]:
    """A ledger of ``count`` events appended as an older version did (no lock, no check)."""
    entries = [
        Entry("run", SOURCE, "consumer", SAMPLE_DATES[0], SAMPLE_DATES[0], ["redis"], "d", "c", status="succeeded") for _ in range(count)
    ]
    for e in entries:
        spark.createDataFrame([e.row()], LEDGER_SCHEMA).write.format("delta").mode("append").save(str(path))
    return entries


def test_a_ledger_commit_beside_another_commits_checksum_reads_whole_again(spark, tmp_path, caplog):
    """Left by an older version's race: every read of the ledger failed on the checksum until the
    file was deleted by hand. The first use of the ledger in a process finds and repairs it."""
    path = tmp_path / "ledger"
    entries = _older_ledger(spark, path, 2)
    damaged = _swap_checksum(path, 1, 0)
    _forget_logs(spark)
    with pytest.raises(Exception, match=rf"ChecksumException: Checksum error: file:{damaged} "):  # what runs met
        spark.read.format("delta").load(str(path)).count()
    _forget_logs(spark)

    ledger = Ledger(spark, path)
    with caplog.at_level(logging.WARNING, logger="jobs.operations.ledger.local_commits"):
        assert sorted(r["run_id"] for r in ledger.steps().collect()) == sorted(e.run_id for e in entries)
    assert f"{damaged}: its checksum file .{damaged.name}.crc was another process's commit" in caplog.text
    assert not damaged.with_name(f".{damaged.name}.crc").exists()
    later = Entry("run", SOURCE, "consumer", SAMPLE_DATES[1], SAMPLE_DATES[1], ["redis"], "d", "c", status="succeeded")
    ledger.record(later)  # and runs record again
    _forget_logs(spark)
    assert sorted(r["run_id"] for r in ledger.steps().collect()) == sorted(e.run_id for e in [*entries, later])
    assert _checksums_not_matching(path) == []


def test_a_leases_commit_beside_another_commits_checksum_is_repaired_when_a_claim_meets_it(spark, tmp_path, caplog):
    """The leases table damaged after this process first checked it: the claim's read fails on
    the checksum, the file is repaired and the claim made (not exit 1 with a Java trace)."""
    leases = Leases(spark, str(tmp_path / "ledger"), seconds=60)
    leases.take("other_source", TARGET, "run")  # versions 0 (made) and 1 (claimed)
    leases.release("other_source", TARGET)  # 2
    damaged = _swap_checksum(Path(leases.path), 2, 1)
    _forget_logs(spark)
    claimant = Leases(spark, str(tmp_path / "ledger"), seconds=60, holder="nightly:7:0000feed")
    with caplog.at_level(logging.WARNING, logger="jobs.operations.ledger.local_commits"):
        assert claimant.take(SOURCE, TARGET, "run") is False
    assert f"{damaged}: its checksum file" in caplog.text
    assert {t: h.holder for t, h in leases.holders(SOURCE).items()} == {TARGET[0]: "nightly:7:0000feed"}
    assert _checksums_not_matching(Path(leases.path)) == []


def test_a_torn_ledger_commit_stops_the_command_naming_the_file_and_the_fix(spark, tmp_path, monkeypatch, capsys):
    """A commit that is not whole cannot be repaired: the command says which file and what to do
    (exit 1, no Java trace), and so does the library (DeltaLogError)."""
    path = tmp_path / "ledger"
    _older_ledger(spark, path, 2)
    commit = path / "_delta_log" / f"{1:020d}.json"
    commit.write_bytes(commit.read_bytes()[:40])  # its checksum file no longer matches
    _forget_logs(spark)
    folder = env_conf(tmp_path / "conf", "torn", (
        f"data_root: {tmp_path}\nledger_root: {path}\nreports_dir: {tmp_path / 'reports'}\nsinks: [redis]\n"
        "redis: {url: 'redis://127.0.0.1:1/0', password_env: null}\nquality: {expectations: false}\n"
    ))  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    assert main(["runs", "--env", "torn"]) == EXIT_TERMINAL  # a person has to look at the file: not retried
    err = capsys.readouterr().err
    assert err.startswith(f"error: {commit} does not match its checksum file {commit.parent}/.{commit.name}.crc and cannot be repaired")
    assert f"move {path} aside to start the table afresh" in err and "Traceback" not in err and "at org.apache" not in err
    with pytest.raises(DeltaLogError, match=f"{commit} does not match"):
        Ledger(spark, path).steps()

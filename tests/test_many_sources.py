"""`materialize run` over several sources at once (parallel_sources): the stores end up
exactly as after the same sources run one after another, one failing source stops no
other, every source is in the ledger, and the exit code says a source failed."""

from __future__ import annotations

import re
import shutil

import pytest
from pyspark.sql import types as T

from feature_defs import DEFAULT_DIR, load_definitions
from feature_defs.stored_lock import locked, read_lock, write_lock
from jobs.cli import main
from jobs.exit_codes import EXIT_FAILED
from jobs.operations.ledger.events import Ledger

from .support.confs import env_conf
from .support.samples import DAY2_STR, SAMPLE_DATES, tiny_consumer_source

DAY2 = SAMPLE_DATES[1]

GOOD = ["consumer_daily", "store_features_long"]
MISSING = (
    "source:\n  name: missing\n  entity: consumer\n  location: no_such_table\n  layout: wide\n"
    "  features:\n    - {name: ghost_score, type: float}\n"
)


@pytest.fixture
def many(tmp_path, monkeypatch, sample_root, redis_server):
    """An env 'many': the sample sources and one whose table does not exist, into the session's Redis."""
    defs = tmp_path / "defs"
    shutil.copytree(DEFAULT_DIR, defs, ignore=shutil.ignore_patterns("*.py", "*.md", "__pycache__"))
    (defs / "missing.yaml").write_text(MISSING)
    write_lock(defs, locked(load_definitions(defs, check_lock=False), read_lock(defs)))  # as `materialize defs --lock` does
    conf = env_conf(tmp_path / "conf", "many",
        f"data_root: {sample_root}\nquarantine_root: {tmp_path / 'quarantine'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"reports_dir: {tmp_path / 'reports'}\ndefinitions_dir: {defs}\nsinks: [redis]\n"
        f"redis: {{url: '{redis_server.url}', password_env: null}}\n"
        "quality: {verify_sample: 50, max_bad_fraction: 0.05}\n"  # the gate and its data docs on: sources gate at once
    )  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    return tmp_path


def stored(client) -> dict:
    return {key: client.hgetall(key) for key in client.scan_iter()}


def test_sources_at_once_store_what_one_after_another_stores(many, redis_db, capfd, spark):
    run = ["run", "--env", "many", "--date", DAY2_STR]
    assert main([*run, "--parallel", "1"]) == EXIT_FAILED
    one_by_one = stored(redis_db)
    assert {k.split(b":")[0] for k in one_by_one} == {b"c", b"s"}  # both good sources wrote
    capfd.readouterr()

    redis_db.flushall()
    assert main([*run, "--parallel", "3"]) == EXIT_FAILED
    assert stored(redis_db) == one_by_one
    out = capfd.readouterr()
    for name in GOOD:
        assert f"== {name} {DAY2_STR} (env many)" in out.out
        assert f"report: {many / 'reports' / name / DAY2_STR / 'summary.json'}" in out.out
        docs = many / "reports" / name / DAY2_STR / "data_docs" / "index.html"
        assert re.search(rf"data docs +{re.escape(str(docs))}\n", out.out) and docs.is_file()
    assert "error: missing: SourceNotFound" in out.err and "failed: missing" in out.err

    steps = Ledger(spark, many / "ledger").list(last=10)
    assert sorted((s["source"], s["status"]) for s in steps) == sorted(
        [(name, "succeeded") for name in GOOD] * 2 + [("missing", "failed")] * 2
    )
    # the good sources' steps, oldest first: one after the other, then at the same time
    a1, b1, a2, b2 = sorted((s for s in steps if s["source"] in GOOD), key=lambda s: s["started_at"])
    assert b1["started_at"] >= a1["ended_at"]
    assert b2["started_at"] < a2["ended_at"]


def test_create_upgrades_an_older_ledger_so_appends_at_once_do_not_conflict(spark, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from jobs.operations.ledger.events import SCHEMA, Entry

    older = T.StructType([f for f in SCHEMA.fields if f.name != SCHEMA.fieldNames()[-1]])  # one column short
    spark.createDataFrame([], older).write.format("delta").save(str(tmp_path / "ledger"))
    ledger = Ledger(spark, tmp_path / "ledger")
    ledger.create()
    assert spark.read.format("delta").load(str(tmp_path / "ledger")).columns == SCHEMA.fieldNames()

    def entry(i: int) -> Entry:
        return Entry(
            kind="run", source=f"s{i}", entity="e", start_date=DAY2, end_date=DAY2, sinks=["redis"], definitions_hash="d", config_hash="c"
        )

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: ledger.start(entry(i)), range(4)))
    assert sorted(s["source"] for s in ledger.list()) == ["s0", "s1", "s2", "s3"]


def test_sources_over_one_table_share_one_cache_and_release_it_last(spark, run_conf, tmp_path):
    """Spark shares a cache entry among equal plans: sources preparing the same rows alike
    (a view and its push view) read one cached snapshot, and one source's release must not
    drop it under another; a source that prepares other rows keeps its own."""
    from jobs.pipeline import shared_cache
    from jobs.pipeline.context import RunContext
    from jobs.pipeline.prepare import prepare
    from jobs.pipeline.read import read

    features, schema = "    - {name: score, type: float}\n", "consumer_id long, score double, ds date"
    defs = tiny_consumer_source(spark, tmp_path, features, schema, [(1, 1.0, DAY2), (2, 2.0, DAY2)])
    tiny_yaml = (tmp_path / "defs" / "tiny.yaml").read_text()
    # twin: the same rows alike, its feature stored under another name; other: another column name
    (tmp_path / "defs" / "twin.yaml").write_text(
        tiny_yaml.replace("name: tiny", "name: twin").replace("{name: score,", "{name: score, stored_as: score@2,")
    )
    (tmp_path / "defs" / "other.yaml").write_text(
        tiny_yaml.replace("name: tiny", "name: other").replace("{name: score,", "{name: other_score, column: score,")
    )
    defs = load_definitions(tmp_path / "defs")
    conf = run_conf.model_copy(update={"data_root": str(tmp_path)})
    persisted = lambda: len(spark.sparkContext._jsc.getPersistentRDDs())  # noqa: E731
    prepared, added, jobs = {}, {}, {}
    for name in ("tiny", "twin", "other"):
        ctx = RunContext(spark, conf, defs.source(name), defs.entity_of(defs.source(name)), DAY2)
        start = persisted()
        spark.sparkContext.setJobGroup(f"share-{name}", name)
        try:
            prepared[name] = prepare(ctx, read(ctx))
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        added[name] = persisted() - start
        jobs[name] = len(spark.sparkContext.statusTracker().getJobIdsForGroup(f"share-{name}"))
    tiny, twin, other = prepared.values()
    assert tiny.share_key == twin.share_key != other.share_key
    assert added["twin"] == 0 and added["tiny"] > 0 and added["other"] > 0  # twin cached nothing of its own
    assert jobs["twin"] == 0 and jobs["tiny"] > 0 and jobs["other"] > 0  # nor counted again: tiny's counts are its
    assert twin.counts == tiny.counts and twin.counts.entities == 2
    assert shared_cache.holders(tiny.share_key) == 2
    tiny.release()
    assert [df.storageLevel.useMemory for df in twin.cached] == [True, True]  # twin still reads them
    assert twin.good.collect() == tiny.good.collect() and len(twin.good.collect()) == 2
    other.release()
    assert [df.storageLevel.useMemory for df in other.cached] == [False, False]
    assert [df.storageLevel.useMemory for df in twin.cached] == [True, True]
    twin.release()
    assert [df.storageLevel.useMemory for df in [*tiny.cached, *twin.cached]] == [False] * 4
    assert shared_cache.holders(tiny.share_key) == 0


def test_a_shared_count_runs_once_for_sources_asking_at_once():
    """The second source asking while the first counts waits for that count; a count that
    fails is not kept; the counts go with the key's last holder."""
    import threading

    from jobs.pipeline import shared_cache

    key, calls, started, go = "test-counted", [], threading.Event(), threading.Event()

    def slow():
        calls.append(1)
        started.set()
        go.wait(10)
        return {"rows": 3}

    shared_cache.hold(key)
    shared_cache.hold(key)
    got = []
    first = threading.Thread(target=lambda: got.append(shared_cache.counted(key, "read", slow)))
    first.start()
    started.wait(10)
    second = threading.Thread(target=lambda: got.append(shared_cache.counted(key, "read", slow)))
    second.start()
    go.set()
    first.join(10)
    second.join(10)
    assert got == [{"rows": 3}, {"rows": 3}] and len(calls) == 1

    def failing():
        raise RuntimeError("the count failed")

    with pytest.raises(RuntimeError, match="the count failed"):
        shared_cache.counted(key, "checked", failing)
    assert shared_cache.counted(key, "checked", lambda: 7) == 7  # counted again, not the failure kept
    shared_cache.release(key)
    shared_cache.release(key)
    assert shared_cache.counted(key, "read", lambda: {"rows": 4}) == {"rows": 4}  # released: counted anew

"""Cleanup of the fields of removed sources and features, planned from the run ledger, on a
real Redis, real Spark and real Delta tables. Every state is read back raw from Redis."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest
import redis
from pyspark.sql import types as T

from feature_defs import load_definitions
from fm_config.sql import SqlSettings
from jobs.cli import main
from jobs.operations.backfill import recorded_run
from jobs.operations.cleanup.redis import plan_cleanup, recorded_cleanup
from jobs.operations.ledger.events import SCHEMA, Ledger, redis_target
from serializers import field_id, freshness_field_name

from .support.confs import env_conf
from .support.samples import SAMPLE_DATES, tiny_consumer_source

DEFS = load_definitions()
DAY1, DAY2 = SAMPLE_DATES
TINY_FEATURES = "    - {name: tiny_score, type: float}\n    - {name: tiny_label, type: string}\n"
TINY_SCHEMA = "consumer_id long, ds date, tiny_score double, tiny_label string"
# Ids 1..9 are consumers of consumer_daily too; 5001..5006 only 'tiny' writes. DAY1 - 1 is never written.
TINY_ROWS = (
    [(i, DAY1, i / 3, f"d1-{i}") for i in [*range(1, 7), *range(5001, 5005)]]
    + [(i, DAY2, None if i == 5 else i / 7, f"d2-{i}") for i in [*range(4, 10), *range(5003, 5007)]]
    + [(None, DAY2, 1.0, "bad key"), *((i, DAY1 - dt.timedelta(days=1), 1.0, "never written") for i in range(7001, 7004))]
)
TINY_WRITTEN_IDS = {r[0] for r in TINY_ROWS if r[0] is not None and r[1] in (DAY1, DAY2)}
TINY_FIELDS = ["tiny_label", "tiny_score", freshness_field_name("tiny")]  # as the ledger lists them: features, then freshness


def raw(client: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    return {k: client.hgetall(k) for k in client.scan_iter()}


def without(state: dict, names: list[str], prefix: bytes = b"c:") -> dict:
    """``state`` with these fields gone from the keys of ``prefix``; a hash left empty is no key (Redis deletes it)."""
    ids = {field_id(n) for n in names}
    out = {k: {f: v for f, v in h.items() if not (k.startswith(prefix) and f in ids)} for k, h in state.items()}
    return {k: h for k, h in out.items() if h}


def fields_present(state: dict, names: list[str]) -> int:
    ids = {field_id(n) for n in names}
    return sum(f in ids for k, h in state.items() if k.startswith(b"c:") for f in h)


@pytest.fixture
def written(spark, run_conf, sample_root, redis_db, tmp_path, monkeypatch):
    """consumer_daily (DAY2) and a source 'tiny' (DAY1..DAY2, one latest-mode step) written
    to the session's Redis with a ledger; ``materialize cleanup --env ci`` sees the
    definitions in tmp_path/defs."""
    return write_sources(spark, run_conf, sample_root, tmp_path, monkeypatch)


def write_sources(spark, run_conf, sample_root, tmp_path, monkeypatch, sql_dsn: str | None = None):
    """consumer_daily and tiny written to Redis (and, with ``sql_dsn``, to that SQL store), and the env 'ci' that sees them."""
    defs = tiny_consumer_source(spark, tmp_path, TINY_FEATURES, TINY_SCHEMA, TINY_ROWS)
    (tmp_path / "defs" / "consumer_daily.yaml").write_text(DEFS.files["source:consumer_daily"].read_text())
    (tmp_path / "consumer_daily").symlink_to(sample_root / "consumer_daily")
    defs = load_definitions(tmp_path / "defs")
    conf = run_conf.model_copy(update={"data_root": str(tmp_path), "ledger_root": str(tmp_path / "ledger")})
    sinks, sql = "[redis]", ""
    if sql_dsn:
        conf = conf.model_copy(update={"sinks": ["redis", "sql"], "sql": SqlSettings(dsn=sql_dsn, password_env=None)})
        sql = f"sql:\n  dsn: {sql_dsn}\n  password_env: null\n  batch_rows: 10\n  statements_per_transaction: 10\n"
        sinks = "[redis, sql]"
    ledger = Ledger(spark, conf.ledger_path)
    recorded_run(spark, conf, defs, ledger, "run", "consumer_daily", DAY2)
    recorded_run(spark, conf, defs, ledger, "backfill-latest", "tiny", DAY1, DAY2, dates=[DAY1, DAY2])
    folder = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {tmp_path}\nledger_root: {conf.ledger_path}\n"
        f"definitions_dir: {tmp_path / 'defs'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"sinks: {sinks}\nredis:\n  url: {conf.redis.url}\n  pipeline_entities: 4\n{sql}",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    return conf, ledger


def step_id(ledger: Ledger, source: str) -> str:
    [step] = ledger.list(source)
    return step["run_id"]


def cleanups(ledger: Ledger) -> list[dict]:
    """The cleanup steps, oldest first, with their record parsed."""
    rows = [r for r in ledger.list(last=100) if r["kind"] == "cleanup"]
    return [{**r, "cleanup": json.loads(r["cleanup"])} for r in reversed(rows)]


def test_cleanup_removes_a_removed_sources_fields_from_every_key_it_wrote(spark, written, redis_db, tmp_path, capsys):
    conf, ledger = written
    before = raw(redis_db)
    tiny_keys = {f"c:{i}".encode() for i in TINY_WRITTEN_IDS}
    assert {k for k, h in before.items() if field_id(freshness_field_name("tiny")) in h} == tiny_keys
    only_tiny = {k for k in tiny_keys if field_id(freshness_field_name("consumer_daily")) not in before[k]}
    assert (
        only_tiny >= {f"c:{i}".encode() for i in range(5001, 5007)} and tiny_keys - only_tiny
    )  # keys no current table holds, and shared ones

    (tmp_path / "defs" / "tiny.yaml").unlink()
    assert main(["cleanup", "--env", "ci", "--entity", "consumer"]) == 0
    # every key tiny wrote lost its fields (the keys of tiny alone are gone); all else byte for byte
    assert raw(redis_db) == without(before, TINY_FIELDS)
    assert only_tiny.isdisjoint(redis_db.keys())
    out = capsys.readouterr().out
    assert "sources no longer defined (their freshness fields go): tiny" in out
    assert f"tiny: tiny_label, tiny_score, _ts:tiny on {len(TINY_WRITTEN_IDS)} keys (from {tmp_path / 'tiny'}, 1 write step)" in out
    [done] = cleanups(ledger)
    assert done["status"] == "succeeded" and done["error"] is None and done["features"] == TINY_FIELDS
    assert done["cleanup"] == {
        "cleaned": {
            "tiny": {
                "fields": TINY_FIELDS,
                "keys": len(TINY_WRITTEN_IDS),
                "fields_removed": fields_present(before, TINY_FIELDS),
                "steps": [step_id(ledger, "tiny")],
            }
        },
        "left": {},
    }
    assert json.loads(done["targets"]) == {"redis": conf.redis.url}

    # the ledger now says it is done: nothing is planned again
    assert main(["cleanup", "--env", "ci", "--entity", "consumer", "--dry-run"]) == 0
    assert "nothing to delete" in capsys.readouterr().out
    assert len(cleanups(ledger)) == 1


def test_the_ledger_reads_the_same_with_and_without_spark(spark, written, tmp_path, monkeypatch):
    # runs read the ledger's files themselves (jobs/operations/ledger/files.py); Spark is the fallback
    conf, ledger = written
    (tmp_path / "defs" / "tiny.yaml").unlink()
    assert main(["cleanup", "--env", "ci", "--entity", "consumer"]) == 0  # a cleanup step in the ledger too
    target = redis_target(conf)
    steps, (writes, legacy) = ledger.write_steps("consumer"), ledger.redis_writes("consumer", target)
    expected = [("consumer_daily", "run", "succeeded"), ("tiny", "backfill-latest", "succeeded")]
    assert [(s["source"], s["kind"], s["status"]) for s in steps] == expected
    assert [w.source for w in writes] == ["consumer_daily"] and legacy == []  # tiny's fields were all cleaned
    monkeypatch.setattr(Ledger, "_steps_without_spark", lambda self, source=None: None)
    assert ledger.write_steps("consumer") == steps
    assert ledger.redis_writes("consumer", target) == (writes, legacy)


def test_cleanup_of_a_source_whose_table_is_gone_records_only_what_it_did(spark, written, redis_db, tmp_path, capsys):
    conf, ledger = written
    before = raw(redis_db)
    defs = tmp_path / "defs"
    (defs / "tiny.yaml").unlink()
    text = (defs / "consumer_daily.yaml").read_text()
    (defs / "consumer_daily.yaml").write_text(text.replace("    - {name: tip_rate_30d, type: float}\n", ""))
    shutil.rmtree(tmp_path / "tiny")

    assert main(["cleanup", "--env", "ci", "--entity", "consumer"]) == 1
    captured = capsys.readouterr()
    reason = f"no Delta table at {tmp_path / 'tiny'}"
    assert f"cannot clean tiny on every key it wrote: {reason}" in captured.out
    assert f"error: not cleaned: tiny (tiny_label, tiny_score, _ts:tiny): {reason}; recorded as left for a later cleanup" in captured.err
    # the dropped feature went from every consumer key; tiny's fields are all still there
    assert raw(redis_db) == without(before, ["tip_rate_30d"])
    assert fields_present(raw(redis_db), TINY_FIELDS) == fields_present(before, TINY_FIELDS) > 0

    cd_keys = spark.read.format("delta").load(str(tmp_path / "consumer_daily")).where(f"ds = '{DAY2}'").select("consumer_id").toPandas()
    [first] = cleanups(ledger)
    assert first["status"] == "failed" and first["error"].startswith("CleanupIncomplete: not cleaned: tiny (")
    assert first["features"] == ["tip_rate_30d"]  # what was cleaned, not what was planned
    assert first["cleanup"] == {
        "cleaned": {
            "consumer_daily": {
                "fields": ["tip_rate_30d"], "keys": cd_keys["consumer_id"].dropna().nunique(),
                "fields_removed": fields_present(before, ["tip_rate_30d"]), "steps": [step_id(ledger, "consumer_daily")],
            }
        },
        "left": {"tiny": {"fields": TINY_FIELDS, "keys": 0, "fields_removed": 0, "reason": reason}},
    }  # fmt: skip
    assert main(["runs", "--env", "ci"]) == 0
    [listed] = [line for line in capsys.readouterr().out.splitlines() if " cleanup " in line]
    assert " failed " in listed and "CleanupIncomplete: not cleaned: tiny" in listed

    # the table is back: a later cleanup does the rest, and only that
    spark.createDataFrame(TINY_ROWS, TINY_SCHEMA).write.format("delta").save(str(tmp_path / "tiny"))
    assert main(["cleanup", "--env", "ci", "--entity", "consumer"]) == 0
    assert "consumer_daily:" not in capsys.readouterr().out
    assert raw(redis_db) == without(without(before, ["tip_rate_30d"]), TINY_FIELDS)
    second = cleanups(ledger)[1]
    assert second["status"] == "succeeded" and second["features"] == TINY_FIELDS
    assert second["cleanup"]["left"] == {} and list(second["cleanup"]["cleaned"]) == ["tiny"]
    assert second["cleanup"]["cleaned"]["tiny"]["fields_removed"] == fields_present(before, TINY_FIELDS)


def test_a_ledger_written_before_keys_were_recorded_is_read_and_not_trusted_blindly(spark, run_conf, sample_root, redis_db, tmp_path):
    """Ledger rows without keys_from/cleanup (older versions): a defined source's keys come
    from its definition, a removed source's cannot be found, an old cleanup claims nothing."""
    conf = run_conf.model_copy(update={"ledger_root": str(tmp_path / "ledger")})
    target = redis_target(conf)
    old_schema = T.StructType([f for f in SCHEMA.fields if f.name not in ("keys_from", "cleanup")])
    now = dt.datetime.now(dt.UTC)

    def old_row(run_id, kind, source, features, targets, dates, start=DAY2):
        row = {f: None for f in old_schema.fieldNames()}
        row |= {"run_id": run_id, "kind": kind, "source": source, "entity": "consumer", "start_date": start, "end_date": start,
                "sinks": ["redis"], "targets": json.dumps(targets), "dates": dates, "status": "succeeded", "features": features,
                "started_at": now, "ended_at": now, "recorded_at": now}  # fmt: skip
        return tuple(row[f] for f in old_schema.fieldNames())

    consumer_features = [f.name for f in DEFS.source("consumer_daily").features]
    old = [
        old_row("r1", "run", "consumer_daily", [*consumer_features, "old_rate"], {"redis": target}, [DAY2]),
        old_row("r2", "run", "gone", ["gone_score"], {"redis": target}, [DAY2]),
        old_row("c1", "cleanup", None, ["old_rate"], {}, None),  # claimed old_rate cleaned: not trusted
    ]
    spark.createDataFrame(old, old_schema).write.format("delta").save(str(conf.ledger_path))
    ids = spark.read.format("delta").load(str(sample_root / "consumer_daily")).where(f"ds = '{DAY2}'").select("consumer_id").toPandas()
    ids = sorted(int(i) for i in ids["consumer_id"].dropna().unique())
    for i in ids:  # what those old steps left: a stale field of each source next to a live one
        redis_db.hset(f"c:{i}", mapping={field_id("old_rate"): b"0.5", field_id("gone_score"): b"1", field_id("orders_7d"): b"3"})
    before = raw(redis_db)

    ledger = Ledger(spark, conf.ledger_path)
    plan, keys = plan_cleanup(spark, conf, DEFS, ledger, "consumer")
    assert [(p.source, p.fields, p.keys) for p in plan.parts] == [
        ("consumer_daily", ["old_rate"], len(ids)),
        ("gone", ["gone_score", "_ts:gone"], 0),
    ]
    assert plan.parts[1].left == [
        "1 of its steps were recorded without the table their keys come from, and the source is no longer defined"
    ]
    assert "note: cleanups of" in plan.describe() and "their fields are checked again" in plan.describe()
    result = recorded_cleanup(conf, DEFS, ledger, plan, keys)
    for frame in keys.values():
        frame.unpersist()
    assert list(result.cleaned) == ["consumer_daily"] and list(result.left) == ["gone"]
    assert raw(redis_db) == without(before, ["old_rate"])

    # the old rows and the new one (with the new columns) read together
    again, keys = plan_cleanup(spark, conf, DEFS, ledger, "consumer")
    assert [p.source for p in again.parts] == ["gone"] and keys == {}
    [last] = [r for r in ledger.list() if r["run_id"] not in ("r1", "r2", "c1")]
    assert json.loads(last["cleanup"])["cleaned"]["consumer_daily"]["steps"] == ["r1"]


def sql_rows(conn) -> dict[tuple[str, str], tuple[dict, object]]:
    rows = conn.execute("SELECT entity_key, source, features::text, expires_at FROM consumer_features").fetchall()
    return {(key, source): (json.loads(doc), expires) for key, source, doc, expires in rows}


def test_cleanup_cleans_the_sql_store_in_the_same_step(
    spark, run_conf, sample_root, redis_db, pg_server, pg_db, tmp_path, monkeypatch, capsys
):
    """Rows of a removed source, rows past their expiry and the JSON keys of a removed feature
    leave the SQL table, in pages, beside the Redis cleanup, counted in the summary and the ledger."""
    conf, ledger = write_sources(spark, run_conf, sample_root, tmp_path, monkeypatch, sql_dsn=pg_server.dsn)
    expired = sorted(k for k, s in sql_rows(pg_db) if s == "consumer_daily")[:7]
    # the TTL passed for these (the database's clock is what a TTL is judged by)
    pg_db.execute(
        "UPDATE consumer_features SET expires_at = now() - INTERVAL '1 second' WHERE source = 'consumer_daily' AND entity_key = ANY(%s)",
        (expired,),
    )
    before, redis_before = sql_rows(pg_db), raw(redis_db)
    tiny_rows = [k for k in before if k[1] == "tiny"]
    assert len(tiny_rows) == len(TINY_WRITTEN_IDS) and len(before) > len(tiny_rows) + 100
    # tiny wrote after consumer_daily: the consumers both wrote share tiny's expiry, as in one Redis hash
    shared = {k for k, s in tiny_rows} & {k for k, s in before if s == "consumer_daily"} - set(expired)
    assert len(shared) >= 3 and all(before[(k, "consumer_daily")][1] == before[(k, "tiny")][1] for k in shared)
    defs = tmp_path / "defs"
    (defs / "tiny.yaml").unlink()
    text = (defs / "consumer_daily.yaml").read_text()
    (defs / "consumer_daily.yaml").write_text(text.replace("    - {name: tip_rate_30d, type: float}\n", ""))

    kept = {k: v for k, v in before.items() if k[1] == "consumer_daily" and k[0] not in expired}
    stripped = sorted(k for k, (features, _) in kept.items() if "tip_rate_30d" in features)
    assert 50 < len(stripped) < len(kept)  # some rows never had it (a null value is left out)
    n_tiny, n_stripped = len(tiny_rows), len(stripped)
    counts = [
        f"SQL consumer_features: {{}} {len(expired)} expired rows and {n_tiny} rows of sources no longer defined (tiny: {n_tiny})",
        f"SQL consumer_features: {{}} {n_stripped} JSON keys no longer stored from {n_stripped} rows "
        f"(consumer_daily.tip_rate_30d: {n_stripped})",
    ]
    assert main(["cleanup", "--env", "ci", "--entity", "consumer", "--dry-run", "--sink", "sql"]) == 0
    out = capsys.readouterr().out
    assert counts[0].format("would delete") in out and counts[1].format("would remove") in out
    assert sql_rows(pg_db) == before

    assert main(["cleanup", "--env", "ci", "--entity", "consumer"]) == 0
    out = capsys.readouterr().out
    assert counts[0].format("deleted") in out and counts[1].format("removed") in out
    pages = -(-len(before) // 100)  # sql.batch_rows * sql.statements_per_transaction rows per page
    assert f"SQL consumer_features: visited {len(before):,} rows in {pages} pages" in out
    after = {k: (f, e) for k, (f, e) in kept.items()}
    for k in stripped:
        after[k] = ({n: v for n, v in after[k][0].items() if n != "tip_rate_30d"}, after[k][1])
    assert sql_rows(pg_db) == after
    assert raw(redis_db) == without(redis_before, [*TINY_FIELDS, "tip_rate_30d"])  # and Redis, in the same step

    [done] = cleanups(ledger)
    assert done["status"] == "succeeded" and sorted(done["sinks"]) == ["redis", "sql"]
    assert json.loads(done["targets"]) == {"redis": conf.redis.url, "sql": pg_server.dsn}
    assert json.loads(done["written"])["sql"] == {"rows_deleted": len(expired) + len(tiny_rows), "keys_removed": len(stripped)}
    record = done["cleanup"]["sql"]
    assert (record["table"], record["rows_visited"], record["pages"], record["error"]) == ("consumer_features", len(before), pages, None)
    assert (record["expired_rows"], record["removed_sources"]) == (len(expired), {"tiny": len(tiny_rows)})
    assert (record["keys_removed"], record["rows_stripped"]) == ({"consumer_daily": {"tip_rate_30d": len(stripped)}}, len(stripped))

    # nothing is left for another cleanup
    assert main(["cleanup", "--env", "ci", "--entity", "consumer", "--sink", "sql"]) == 0
    out = capsys.readouterr().out
    assert "deleted 0 expired rows and 0 rows of sources no longer defined\n" in out and "removed 0 JSON keys" in out
    assert sql_rows(pg_db) == after

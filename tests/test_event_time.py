"""Selection by event time (select_by: event_time), as Feast materializes: each entity's latest
row by event time (created time breaks ties), stored as of that event time in both stores and
read back as Feast's event timestamps; incremental runs from the ledger's windows, late rows
within the lookback, a failed run covered again, a window never past the time its run read the
table; rows without an event time kept aside."""

from __future__ import annotations

import datetime as dt
import json
import re
import time

import pytest
import yaml
from pyspark.sql import types as T

from feature_defs import DEFAULT_DIR, DefinitionError, load_definitions
from feature_defs.models import SourceFile
from feature_reader import FeatureReader
from fm_config import RunConf
from fm_config.sql import SqlSettings
from jobs import event_time
from jobs.cli import UsageError, main
from jobs.cli.run import incremental_sources
from jobs.operations.backfill import BackfillError, plan_backfill, recorded_run
from jobs.operations.doctor.stores import check_stored_data
from jobs.operations.ledger.events import Ledger
from jobs.operations.ledger.windows import WindowError, event_time_losses, incremental_window, read_window
from jobs.pipeline.run import run_source
from jobs.transforms import schema_problems
from serializers.horizon import FutureDateError, check_until
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema

from .expected import expected_hash
from .support.confs import env_conf
from .support.events import DAY, END_OF_DAY, FRESH, SCHEMA, SOURCE, SPECS, UTC, Y2099, at, epoch, micros, subsecond, write_events


def latest(rows: list[tuple], end: dt.datetime, start: dt.datetime | None = None) -> dict[int, tuple]:
    """Per consumer, the row a Feast materialization of [start, end) keeps: the latest event time,
    then the latest created time (none before any); derived here with Python's max."""
    out: dict[int, tuple] = {}
    for row in rows:
        if row[3] is None or row[3] >= end or (start is not None and row[3] < start):
            continue
        rank = (row[3], row[4] is not None, row[4] or dt.datetime.min.replace(tzinfo=UTC))
        kept = out.get(row[0])
        if kept is None or rank > (kept[3], kept[4] is not None, kept[4] or dt.datetime.min.replace(tzinfo=UTC)):
            out[row[0]] = row
    return out


def redis_events(client, ids) -> dict[int, dict[bytes, bytes]]:
    return {i: client.hgetall(f"c:{i}") for i in ids}


def expected_redis(rows: dict[int, tuple]) -> dict[int, dict[bytes, bytes]]:
    return {i: expected_hash(SPECS, {"score": r[1], "tag": r[2]}, FRESH, epoch(r[3]), subsecond(r[3])) for i, r in rows.items()}


def sql_events(conn) -> dict[int, tuple[dict, int]]:
    found = conn.execute("SELECT entity_key, features::text, as_of FROM consumer_features WHERE source = 'events'")
    return {int(k): (json.loads(doc), micros(as_of)) for k, doc, as_of in found}


def expected_sql(rows: dict[int, tuple]) -> dict[int, tuple[dict, int]]:
    return {i: ({k: v for k, v in (("score", r[1]), ("tag", r[2])) if v is not None}, micros(r[3])) for i, r in rows.items()}


@pytest.fixture
def both_stores(run_conf, pg_server, pg_db, tmp_path):
    sql = SqlSettings(dsn=pg_server.dsn, password_env=None, retry_base_delay=0.01, retry_max_delay=0.05)
    return run_conf.model_copy(
        update={
            "sinks": ["redis", "sql"],
            "sql": sql,
            "data_root": str(tmp_path),
            "ledger_root": str(tmp_path / "ledger"),
            "definitions_dir": str(tmp_path / "defs"),
        }
    )


# -- a run of a date: every row up to its end --

ROWS = [  # consumer_id, score, tag, event_ts, created
    (1, 1.0, "old", at("2026-11-19T10:00:00"), at("2026-11-19T10:05:00")),
    (1, 2.0, "new", at("2026-11-20T08:30:15.750000"), at("2026-11-20T08:31:00")),  # as of ...:15 and 750000 microseconds
    (1, 9.0, "too late", END_OF_DAY, at("2026-11-21T00:00:01")),  # the window's end is excluded
    (2, 3.0, "created first", at("2026-11-20T05:00:00"), at("2026-11-20T06:00:00")),
    (2, 4.0, "created last", at("2026-11-20T05:00:00"), at("2026-11-20T07:00:00")),  # same event time: created decides
    (2, 5.0, "created unknown", at("2026-11-20T05:00:00"), None),
    (2, 9.5, "no time", None, at("2026-11-20T09:00:00")),  # bad input: kept aside, the entity's other rows decide
    (3, None, "no score", at("2026-11-18T00:00:00"), None),  # a null feature: no field, no JSON key
    (4, 6.0, "from 2099", Y2099, None),  # beyond the horizon: no window reaches it
    (5, 7.0, "copy", at("2026-11-20T01:00:00"), at("2026-11-20T01:00:00")),  # exact copies, as in Feast's example data
    (5, 7.0, "copy", at("2026-11-20T01:00:00"), at("2026-11-20T01:00:00")),
    (6, 8.0, "replaces 2099", at("2026-11-20T02:00:00"), None),
    (7, 1.0, "no time", None, None),
]
NULL_TIME = "null event time (event_ts)"


def test_each_entity_is_stored_as_of_its_latest_row_by_event_time_and_never_older(spark, both_stores, redis_db, pg_db, tmp_path):
    defs = write_events(spark, tmp_path, ROWS)
    conf = both_stores.model_copy(update={"quality": both_stores.quality.model_copy(update={"max_bad_fraction": 0.75})})
    # consumer 6 holds an as-of time beyond the horizon (written by mistake): corrupt, replaced
    redis_db.hset("c:6", mapping={FRESH: str(epoch(Y2099)).encode()})
    ensure_schema(pg_db, sql_sink_config(conf, defs.sources["events"], defs.entities["consumer"], DAY))
    pg_db.execute("INSERT INTO consumer_features VALUES ('6', 'events', '{}', %s, NULL)", (Y2099,))

    summary = run_source(spark, conf, defs, "events", DAY)
    assert summary.status == "succeeded", summary.error
    want = latest(ROWS, END_OF_DAY)
    assert sorted(want) == [1, 2, 3, 5, 6] and want[1][2] == "new" and want[2][2] == "created last"
    assert redis_events(redis_db, range(1, 8)) == {**expected_redis(want), 4: {}, 7: {}}
    assert sql_events(pg_db) == expected_sql(want)
    assert summary.entities == 5 and summary.conflicting_keys == 0
    assert summary.sinks["redis"]["replaced_future"] == 1 and summary.sinks["sql"]["rows_replaced_future"] == 1
    for store in ("redis", "sql"):
        assert summary.verification[store]["mismatches"] == 0
    assert summary.window == "event_ts from the first row to 2026-11-21T00:00:00Z (end excluded)"
    # rows without an event time: kept aside, counted, said in one line of the run's output
    assert summary.bad_rows == 2 and summary.bad_reasons == {NULL_TIME: 2}
    line = f"2 row(s) of events have a null event time (event_ts): kept aside in {summary.quarantine_table}, never written"
    assert f"  warning: {line}" in summary.table().splitlines()
    kept = spark.read.format("delta").load(summary.quarantine_table).collect()
    assert sorted((json.loads(r["row"])["consumer_id"], tuple(r["reasons"])) for r in kept) == [(2, (NULL_TIME,)), (7, (NULL_TIME,))]

    # readers return each entity's event time as Feast's event timestamps, from either store
    with FeatureReader(conf, defs, cache=False) as reader:
        for store in ("redis", "sql"):
            column = reader.get_online_features(["events:tag"], {"consumer_id": [1, 2, 4]}, store=store).column("tag")
            assert column.values == ["new", "created last", None], store
            assert column.event_timestamps == [epoch(want[1][3]), epoch(want[2][3]), None], store

    # the day before: consumer 1's latest row then is older than what both stores hold, and is left out
    redis_before, sql_before = redis_events(redis_db, range(1, 8)), sql_events(pg_db)
    older = run_source(spark, conf, defs, "events", DAY - dt.timedelta(days=1))
    assert older.status == "succeeded"
    assert redis_events(redis_db, range(1, 8)) == redis_before and sql_events(pg_db) == sql_before
    assert older.entities == 2  # consumers 1 and 3 (whose row is the same: written again, as a rerun is)
    assert older.sinks["redis"]["skipped_newer"] == 1 and older.sinks["sql"]["rows_skipped_newer"] == 1
    assert older.verification["redis"]["newer"] == 1 and older.verification["redis"]["mismatches"] == 0


# -- incremental runs: the ledger's windows --

U0 = at("2026-11-20T12:00:00")
HOUR = dt.timedelta(hours=1)


def test_incremental_runs_load_late_rows_within_the_lookback_and_cover_a_failed_window_again(spark, both_stores, redis_db, pg_db, tmp_path):
    sql = both_stores.sql.model_copy(update={"batch_rows": 10, "statements_per_transaction": 1})  # a transaction of 10 rows
    conf = both_stores.model_copy(update={"sql": sql})
    first = [
        *[(i, 1.0, "v1", U0 - 2 * HOUR, None) for i in range(1, 13)],
        (13, 1.0, "v1", U0 - 5 * HOUR, None),
    ]
    defs = write_events(spark, tmp_path, first, extra="  lookback_seconds: 3600\n")
    ledger = Ledger(spark, tmp_path / "ledger")

    def incremental(until: dt.datetime):
        return recorded_run(spark, conf, defs, ledger, "run", "events", event_time.end_date(until), until=until)

    one = incremental(U0)  # the source's first incremental run: everything up to its end
    assert one.status == "succeeded", one.error
    assert one.window.endswith("the source's first incremental run, everything up to its end")
    assert redis_events(redis_db, range(1, 14)) == expected_redis(latest(first, U0))

    later = [
        *[(i, i / 8, f"v2 {i}", U0 + 10 * dt.timedelta(minutes=1), None) for i in (*range(1, 11), *range(14, 34))],
        (12, 2.0, "late, within the lookback", U0 - HOUR / 3, None),  # inside the window run one covered
        (13, 2.0, "late, beyond the lookback", U0 - 3 * HOUR, None),
    ]
    spark.createDataFrame(later, SCHEMA).write.format("delta").mode("append").save(str(tmp_path / "events"))
    # The SQL store fails mid-write, once: on its 15th row, a transaction after the first was committed
    pg_db.execute("CREATE SEQUENCE rows_seen")
    pg_db.execute(
        "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF nextval('rows_seen') = 15 THEN RAISE EXCEPTION 'the store failed mid-write'; END IF; RETURN NEW; END $$"
    )
    pg_db.execute("CREATE TRIGGER fail_once BEFORE INSERT ON consumer_features FOR EACH ROW EXECUTE FUNCTION fail_once()")
    with pytest.raises(Exception, match="the store failed mid-write"):
        incremental(U0 + 3 * HOUR)
    written = [i for i, (_, as_of) in sql_events(pg_db).items() if as_of == micros(U0) + 600_000_000]
    assert 0 < len(written) < 30  # partly written
    assert sorted(s["status"] for s in ledger.source_steps("events")) == ["failed", "succeeded"]

    # The failed run's window does not count: this one starts from the end of run one, less the
    # lookback (from U0 + 2 h, had it counted, and the rows of U0 + 10 min would never be read)
    resumed = incremental(U0 + 4 * HOUR)
    assert resumed.status == "succeeded", resumed.error
    assert resumed.window == (
        "event_ts from 2026-11-20T11:00:00Z to 2026-11-20T16:00:00Z (end excluded): "
        "from the last window's end 2026-11-20T12:00:00Z less the lookback of 3,600 s"
    )
    want = latest(first + later, U0 + 4 * HOUR)
    # A row later than the lookback (consumer 13's, 3 hours late) is outside the window: the
    # incremental run leaves the older row stored ...
    want[13] = first[-1]
    assert redis_events(redis_db, range(1, 34)) == expected_redis(want)
    assert sql_events(pg_db) == expected_sql(want)
    assert want[12][2] == "late, within the lookback" and want[11][2] == "v1" and len(want) == 33

    # ... which a run of a date, reading every row up to its end, loads
    dated = run_source(spark, conf.model_copy(update={"sinks": ["redis"]}), defs, "events", DAY)
    assert dated.status == "succeeded"
    assert redis_events(redis_db, [13]) == expected_redis({13: later[-1]})

    # Redis loses it all: doctor names the run that restores it (such a source refuses backfills)
    redis_db.flushdb()
    check = {c.name: c for c in check_stored_data(conf, defs, ["events"], ["redis"])}["redis data events"]
    assert check.status == "fail" and f"lost events's data of {DAY}" in check.detail, check
    restore = f"materialize run --env {conf.env} --source events --date {DAY} --sink redis"
    assert check.fix == f"run `{restore}` (writes each entity's latest row up to that date's end)"


# -- a window ends no later than the time its run read the table --

MINUTE = dt.timedelta(minutes=1)
CUT = "cut at the time the run read the table: the end asked for, {}, was still to come"


def clock() -> dt.datetime:
    return dt.datetime.now(UTC)


def wait_past(when: dt.datetime) -> None:
    """Until the clock is past ``when``: an incremental run without --until ends at the clock, to the second."""
    while clock() <= when:
        time.sleep(0.2)


def test_a_run_of_today_or_to_an_end_to_come_covers_up_to_its_read_and_the_next_run_loads_the_later_rows(
    spark, redis_server, pg_server, redis_db, pg_db, tmp_path, monkeypatch, capsys
):
    if clock().time() >= dt.time(23, 55):  # the date of today must stay today during the test
        wait_past(dt.datetime.combine(clock().date() + dt.timedelta(days=1), dt.time(), tzinfo=UTC))
    now = clock().replace(microsecond=0)
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tzinfo=UTC)  # the end run --date today asks for
    first = [
        (1, 1.0, "v1", now - 2 * HOUR, None),
        (2, 2.0, "v1", now - 2 * HOUR, None),
        (4, 4.0, "still to come", now + 2 * HOUR, None),  # its event time is after every read here: no window covers it yet
    ]
    write_events(spark, tmp_path, first, extra="  lookback_seconds: 3600\n")
    folder = env_conf(
        tmp_path / "conf",
        "et",
        f"data_root: {tmp_path}\ndefinitions_dir: {tmp_path / 'defs'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"sinks: [redis, sql]\nredis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        f"sql:\n  dsn: '{pg_server.dsn}'\n  password_env: null\n"
        "quality:\n  expectations: false\n  verify_sample: 20\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    ledger = Ledger(spark, tmp_path / "ledger")
    run = ["run", "--env", "et", "--source", "events"]

    def stored() -> tuple[dict, dict]:
        return redis_events(redis_db, range(1, 7)), sql_events(pg_db)

    def expected(rows: list[tuple]) -> tuple[dict, dict]:
        want = latest(rows, now + HOUR)  # every row but consumer 4's, whose event time is still to come
        return {**{i: {} for i in range(1, 7)}, **expected_redis(want)}, expected_sql(want)

    def last_step() -> dict:
        found = max(ledger.source_steps("events"), key=lambda r: r["started_at"])
        times = ("started_at", "window_start", "window_end", "window_requested_end")  # the ledger's reader may give pandas' Timestamp
        return {**found, **{k: found[k].to_pydatetime() for k in times if hasattr(found[k], "to_pydatetime")}}

    # run --date of today (the repair for rows later than the lookback): it covers what the
    # table held when it read it, up to that time, not up to the coming midnight
    before = clock().replace(microsecond=0)
    assert main([*run, "--date", str(now.date())]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    dated = last_step()
    read = dated["window_end"]
    assert before <= read <= clock() and dated["window_start"] is None and dated["window_requested_end"] == midnight
    window = f"event_ts from the first row to {event_time.utc_text(read)} (end excluded); {CUT.format(event_time.utc_text(midnight))}"
    assert re.search(rf"  event-time window +{re.escape(window)}", out)  # the summary says where and why the window was cut ...
    report = json.loads((tmp_path / "reports" / "events" / str(now.date()) / "summary.json").read_text())
    assert report["window"].startswith(window) and report["status"] == "succeeded"  # ... and so does its report
    assert stored() == expected(first)

    # rows written after that read with event times up to the midnight asked for (Feast's
    # watermark would skip them), and one late row within the lookback
    later = [
        (1, 1.5, "at the read time", read, None),  # the end of the window (excluded): the next window's
        (3, 3.0, "after the read", read + dt.timedelta(seconds=1), None),
        (2, 2.5, "late, within the lookback", read - 10 * MINUTE, None),
    ]
    spark.createDataFrame(later, SCHEMA).write.format("delta").mode("append").save(str(tmp_path / "events"))
    wait_past(read + dt.timedelta(seconds=2))
    assert main([*run, "--incremental"]) == 0, capsys.readouterr().err  # not a WindowError until 23:00
    out = capsys.readouterr().out
    resumed = last_step()
    assert resumed["window_start"] == read - HOUR and resumed["window_requested_end"] is None
    assert f"from the last window's end {event_time.utc_text(read)} less the lookback of 3,600 s" in out
    assert stored() == expected(first + later)
    assert redis_events(redis_db, [1, 3]) == expected_redis({1: later[0], 3: later[1]})  # read back raw from Redis

    # run --incremental --until an end still to come: cut at its read too
    asked = now + 3 * HOUR
    assert main([*run, "--incremental", "--until", event_time.utc_text(asked)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    ahead = last_step()
    read = ahead["window_end"]
    assert resumed["window_end"] < read <= clock() and ahead["window_requested_end"] == asked
    assert ahead["window_start"] == resumed["window_end"] - HOUR
    assert CUT.format(event_time.utc_text(asked)) in out
    report = tmp_path / "reports" / "events" / asked.strftime("%Y-%m-%dT%H%M%SZ") / "summary.json"  # named by the end asked for
    assert f"report: {report}" in out and CUT.format(event_time.utc_text(asked)) in json.loads(report.read_text())["window"]
    even_later = [(5, 5.0, "after the second read", read, None), (3, 3.5, "after the second read", read, None)]
    spark.createDataFrame(even_later, SCHEMA).write.format("delta").mode("append").save(str(tmp_path / "events"))
    wait_past(read + dt.timedelta(seconds=1))
    assert main([*run, "--incremental"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert stored() == expected(first + later + even_later)
    assert redis_events(redis_db, [3, 5]) == expected_redis({3: even_later[1], 5: even_later[0]})

    # materialize runs shows each cut with its reason, under the step
    assert main(["runs", "--env", "et", "--source", "events"]) == 0
    listing = capsys.readouterr().out
    for end in (midnight, asked):
        assert f"{'':<20} {CUT.format(event_time.utc_text(end))}, and rows with later event times may yet be written" in listing
    assert listing.count("cut at the time the run read the table") == 2


def test_event_times_of_each_accepted_type_are_utc_epoch_seconds(spark):
    source = write_events_def()
    rows = [(1, dt.datetime(2026, 11, 20, 23, 59, 59, 999999)), (2, dt.datetime(2026, 11, 21)), (3, dt.datetime(2026, 11, 19, 0, 0, 0, 1))]
    window = event_time.EventWindow(at("2026-11-19T00:00:00.000001"), END_OF_DAY)
    for kind in (T.TimestampNTZType(), T.TimestampType()):
        schema = T.StructType([T.StructField("consumer_id", T.LongType()), T.StructField("event_ts", kind)])
        data = [(i, when if isinstance(kind, T.TimestampNTZType) else when.replace(tzinfo=UTC)) for i, when in rows]
        df = event_time.with_event_as_of(event_time.in_window(spark.createDataFrame(data, schema), source, window), source)
        assert sorted((r["consumer_id"], r["_as_of"]) for r in df.collect()) == [
            (1, epoch(at("2026-11-20T23:59:59"))),
            (3, epoch(at("2026-11-19T00:00:00"))),
        ], kind
    dates = spark.createDataFrame([(1, dt.date(2026, 11, 20)), (2, dt.date(2026, 11, 21))], "consumer_id long, event_ts date")
    df = event_time.with_event_as_of(event_time.in_window(dates, source, event_time.date_window(DAY)), source)
    assert [(r["consumer_id"], r["_as_of"]) for r in df.collect()] == [(1, epoch(at("2026-11-20T00:00:00")))]


def write_events_def(extra: str = ""):
    return SourceFile.model_validate(yaml.safe_load(SOURCE.format(extra=extra))).source


# -- without Spark: the windows, the command line, the definitions --


def step(status: str, end: dt.datetime, sinks=("redis",), kind: str = "run") -> dict:
    targets = {"redis": "redis://127.0.0.1:6379/0", "sql": "postgresql://127.0.0.1:5432/f"}
    return {
        "source": "events", "kind": kind, "status": status, "window_end": end,
        "targets": json.dumps({s: targets[s] for s in sinks}),
    }  # fmt: skip


def test_an_incremental_window_starts_at_the_last_succeeded_end_of_every_store_less_the_lookback():
    source = write_events_def()
    redis = {"redis": "redis://127.0.0.1:6379"}  # the same server spelled otherwise
    both = {**redis, "sql": "postgresql://127.0.0.1:5432/f"}
    until = at("2026-11-25T00:00:00")
    first = incremental_window(source, [], redis, until)
    assert (first.start, first.end, first.since) == (None, until, None)
    steps = [
        step("succeeded", at("2026-11-20T00:00:00"), ("redis", "sql")),
        step("succeeded", at("2026-11-22T00:00:00")),  # redis only
        step("failed", at("2026-11-23T00:00:00"), ("redis", "sql")),
        step("running", at("2026-11-24T00:00:00"), ("redis", "sql")),  # crashed, or live elsewhere
        step("succeeded", at("2026-11-24T00:00:00"), ("redis", "sql"), kind="cleanup"),
    ]
    window = incremental_window(source, steps, redis, until)
    assert (window.since, window.start) == (at("2026-11-22T00:00:00"), at("2026-11-21T00:00:00"))  # default lookback: a day
    window = incremental_window(source, steps, both, until)
    assert window.since == at("2026-11-20T00:00:00")  # the SQL store was last covered to then
    assert incremental_window(source, steps, {"sql": both["sql"], "redis": "redis://other:6379"}, until).start is None
    # steps recorded before the SQL store was named sql say cockroach: read as sql, the window is the same
    old = [{**s, "targets": s["targets"].replace('"sql":', '"cockroach":')} for s in steps]
    assert '"cockroach":' in old[0]["targets"] and incremental_window(source, old, both, until).since == at("2026-11-20T00:00:00")
    with pytest.raises(WindowError, match=r"--until 2026-11-20T12:00:00Z is not after the window's start 2026-11-21T00:00:00Z"):
        incremental_window(source, steps, redis, at("2026-11-20T12:00:00"))


def test_the_sources_of_one_run_are_cut_at_one_read_time_taken_before_any_reads(monkeypatch):
    """for_each_source: every source of the run sees one read time, taken as the run starts,
    however long the others took; a window with nothing left before it uses its own clock."""
    from jobs.pipeline.run import for_each_source

    clock = iter(at(t) for t in ("2026-11-20T10:00:00", "2026-11-20T10:07:00", "2026-11-20T10:09:00", "2026-11-20T10:30:00"))

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return next(clock)

    monkeypatch.setattr(event_time.dt, "datetime", Clock)
    seen, done = {}, {}

    def work(name: str):
        seen[name] = event_time.cut_at_read(event_time.date_window(DAY))
        if name == "late":  # its last window ended after the run's read time: its own clock, 10:07
            since = at("2026-11-20T10:05:00")
            return event_time.cut_at_read(event_time.EventWindow(since - dt.timedelta(seconds=60), END_OF_DAY, since=since))
        return None

    for_each_source(["a", "b", "late"], work, 1, lambda name, result, exc: done.setdefault(name, (result, exc)))
    assert {n: w.end for n, w in seen.items()} == dict.fromkeys(("a", "b", "late"), at("2026-11-20T10:00:00"))
    late, exc = done["late"]
    assert exc is None and (late.start, late.end) == (at("2026-11-20T10:04:00"), at("2026-11-20T10:07:00"))
    assert event_time.read_time() == at("2026-11-20T10:09:00")  # after the run: the clock again


def test_a_window_ends_no_later_than_the_time_its_run_reads_the_table():
    source = write_events_def("  lookback_seconds: 3600\n")
    redis = {"redis": "redis://127.0.0.1:6379/0"}
    read = at("2026-11-20T10:15:30.250000")  # the clock as the run reads the table (sub-seconds dropped)
    dated = event_time.date_window(DAY).read_at(read)
    assert (dated.start, dated.end, dated.requested_end) == (None, at("2026-11-20T10:15:30"), END_OF_DAY)
    assert dated.describe(source) == (
        "event_ts from the first row to 2026-11-20T10:15:30Z (end excluded); cut at the time the run read the table: the end "
        "asked for, 2026-11-21T00:00:00Z, was still to come, and rows with later event times may yet be written (the next "
        "incremental run reads them)"
    )
    assert dated.read_at(read + HOUR) == dated  # a window already cut stays as it was
    past = event_time.date_window(DAY - dt.timedelta(days=1))
    assert past.read_at(read) == past  # ends before the read: not cut

    asked = incremental_window(source, [step("succeeded", at("2026-11-20T09:00:00"))], redis, at("2026-11-20T12:00:00"))
    cut = read_window(source, asked, now=read)
    assert (cut.start, cut.end, cut.since, cut.requested_end) == (
        at("2026-11-20T08:00:00"), at("2026-11-20T10:15:30"), at("2026-11-20T09:00:00"), at("2026-11-20T12:00:00"),
    )  # fmt: skip
    assert cut.report_name == asked.report_name == "2026-11-20T120000Z"  # as the command line names the report
    with pytest.raises(WindowError, match=r"start 2026-11-20T08:00:00Z .* is not before 2026-11-20T08:00:00Z, when the run reads"):
        read_window(source, asked, now=at("2026-11-20T08:00:00"))

    # the next run starts at the cut, less the lookback; an end an older version recorded after
    # the step's start (the coming midnight of a run of today) counts as that start
    after = [step("succeeded", cut.end), {**step("succeeded", END_OF_DAY), "started_at": at("2026-11-20T10:00:00")}]
    window = incremental_window(source, after, redis, at("2026-11-20T11:00:00"))
    assert (window.since, window.start) == (cut.end, at("2026-11-20T09:15:30"))
    window = incremental_window(source, after[1:], redis, at("2026-11-20T11:00:00"))
    assert (window.since, window.start) == (at("2026-11-20T10:00:00"), at("2026-11-20T09:00:00"))
    # an --until before the start: the advice is a later --until, not a run that would move the end again
    with pytest.raises(WindowError) as info:
        incremental_window(source, after, redis, at("2026-11-20T09:00:00"))
    assert "nothing to cover; the event times before 2026-11-20T10:15:30Z are covered already: run without --until" in str(info.value)


def test_the_command_line_refuses_what_an_incremental_run_cannot_do(capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        main(["run", "--incremental", "--date", "2026-11-20"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["run", "--date", "2026-11-20", "--until", "2026-11-20T06:00:00Z"]) == 2
    assert "--until is the end of an incremental window" in capsys.readouterr().err
    assert main(["run", "--incremental", "--until", "2099-01-01"]) == 2
    assert "--until 2099-01-01T00:00:00Z is in the future" in capsys.readouterr().err
    defs = load_definitions(DEFAULT_DIR)  # the sample sources select by date
    with pytest.raises(UsageError, match="consumer_daily select.s. by date: run a date"):
        incremental_sources(defs, ["consumer_daily"], named=True)
    with pytest.raises(UsageError, match="no source selects by event time"):
        incremental_sources(defs, ["consumer_daily", "store_features_long"], named=False)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--incremental" in text and "less the source's lookback_seconds" in text and "--until TIME" in text
    with pytest.raises(FutureDateError):
        check_until(at("2026-11-22T00:00:01"), now=epoch(at("2026-11-20T12:00:00")))
    check_until(at("2026-11-22T00:00:00"), now=epoch(at("2026-11-20T12:00:00")))  # the end of tomorrow: accepted


def test_definitions_and_tables_an_event_time_selection_refuses(tmp_path):
    entities = DEFAULT_DIR / "entities.yaml"
    (tmp_path / "entities.yaml").write_text(entities.read_text())
    (tmp_path / "long.yaml").write_text(
        "source:\n  name: long_events\n  entity: consumer\n  location: x\n  layout: long\n  name_column: n\n  value_column: v\n"
        "  select_by: event_time\n  timestamp_column: t\n  features:\n    - {name: a, type: float}\n"
    )
    with pytest.raises(DefinitionError, match="select_by: event_time takes the wide layout"):
        load_definitions(tmp_path)
    source = write_events_def()
    entity = load_definitions(DEFAULT_DIR).entities["consumer"]
    fields = [T.StructField("consumer_id", T.LongType()), T.StructField("score", T.DoubleType()), T.StructField("tag", T.StringType())]
    numeric = T.StructType([*fields, T.StructField("event_ts", T.LongType()), T.StructField("created", T.TimestampType())])
    assert schema_problems(numeric, source, entity) == ["column 'event_ts' has type bigint, expected an event time (timestamp)"]
    no_created = T.StructType([*fields, T.StructField("event_ts", T.TimestampNTZType())])
    assert schema_problems(no_created, source, entity) == ["column 'created' is missing (expected a timestamp)"]


def test_a_backfill_of_a_source_selected_by_event_time_is_refused_with_the_runs_that_do_it(tmp_path):
    (tmp_path / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (tmp_path / "events.yaml").write_text(SOURCE.format(extra=""))
    defs = load_definitions(tmp_path)
    with pytest.raises(BackfillError, match=r"selects by event time .* `materialize run --date 2026-11-20 --source events`"):
        plan_backfill(None, RunConf(env="test"), defs, None, "events", DAY, DAY, "latest", force=False)


def test_a_store_loss_of_a_source_selected_by_event_time_is_restored_by_a_run_of_a_date():
    loss = {"sink": "redis", "target": "redis://h:6379/0", "dates": ["2026-11-18", "2026-11-19", "2026-11-22"], "evidence": "e"}
    left, rewritten = event_time_losses([loss], dt.date(2026, 11, 20), "prod", "events", ["redis", "sql"])
    assert rewritten == [dt.date(2026, 11, 18), dt.date(2026, 11, 19)]  # a run of the 20th reads every row up to its end
    assert [(x["dates"], x["ranges"]) for x in left] == [(["2026-11-22"], "2026-11-22")]
    assert left[0]["restore"] == "materialize run --env prod --source events --date 2026-11-22 --sink redis"
    left, rewritten = event_time_losses([loss], None, "prod", "events", ["redis"])  # an incremental run rewrites its window only
    assert rewritten == [] and left[0]["restore"] == "materialize run --env prod --source events --date 2026-11-22"


def test_a_source_taking_pushes_counts_entities_pushes_hold_newer_and_does_not_fail(spark, both_stores, redis_db, pg_db, tmp_path):
    # issue 62, item 6: a push-fed source's incremental runs failed MostlySkippedNewer (exit 7) run after run
    from feature_push.app import build_app
    from fm_config.reader import ServerSettings

    from .support.asgi import asgi_call

    now = dt.datetime.now(UTC).replace(microsecond=0)
    table = [(i, float(i), f"row {i}", now - 2 * HOUR, None) for i in range(1, 5)]
    defs = write_events(spark, tmp_path, table, extra="  push_source: events_push\n")
    conf = both_stores.model_copy(update={"server": ServerSettings.model_validate({"push": {"enabled": True}})})
    pushed = {"consumer_id": [1, 2, 3], "event_ts": [(now - HOUR).isoformat()] * 3, "score": [10.5, 20.5, 30.5], "tag": ["p"] * 3}
    status, body = asgi_call(build_app(conf), "POST", "/push", json.dumps({"push_source_name": "events_push", "df": pushed}).encode())
    assert status == 200, body
    ledger = Ledger(spark, tmp_path / "ledger")
    summary = recorded_run(spark, conf, defs, ledger, "run", "events", now.date(), until=now, guard_skipped_newer=True)
    # three of four entities hold a newer pushed value: left, counted, said; the run succeeds (was 75% > 50%: failed)
    assert summary.status == "succeeded", summary.error
    assert (summary.sinks["redis"]["skipped_newer"], summary.sinks["sql"]["rows_skipped_newer"]) == (3, 3)
    said = "\n".join(summary.warnings)
    assert "redis: 3 entities of events hold a newer pushed value (push_source) and were left as they are" in said
    assert {i: v["score"] for i, (v, _) in sql_events(pg_db).items()} == {1: 10.5, 2: 20.5, 3: 30.5, 4: 4.0}

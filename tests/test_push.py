"""Pushes (feature_push/): Feast's push routes on the feature server, in process, against the
session's real Redis and PostgreSQL. What a push stores is read back raw: Redis fields
against the reference encoder (serializers.scalar.encode, not the column-wise path the
writers use), SQL documents as parsed JSON, as-of times as the pushed event times."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest

from feature_defs import load_definitions
from feature_push.app import build_app
from fm_config import ConfigError, RunConf
from fm_config.reader import ServerAuthSettings
from serializers import decode, encode, field_id
from serializers.keys import freshness_field, subsecond_field

from .support.asgi import JSON, asgi_request
from .support.tokens import AUDIENCE, ISSUER, Signer, jwks_of

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
ENTITIES = """entities:
  - {name: driver, prefix: d, keys: [{name: driver_id, type: int}], sql_table: driver_features}
"""
STATS = """source:
  name: driver_stats
  entity: driver
  location: driver_stats
  layout: wide
  select_by: event_time
  timestamp_column: event_timestamp
  created_column: created
  push_source: driver_push
  features:
    - {name: conv_rate, type: float, precision: float32}
    - {name: trips, type: int}
    - {name: city, type: string, max_length: 8}
    - {name: profile, type: json}
    - {name: vec, type: embedding, dimension: 2}
    - {name: recent, type: int_list}
    - {name: zones, type: json, json_text_elements: true}
"""
DAILY = """source:
  name: driver_daily
  entity: driver
  location: driver_daily
  layout: wide
  features:
    - {name: rating, type: float}
"""
FEATURES = {
    "conv_rate": "float", "trips": "int", "city": "string", "profile": "json", "vec": "embedding", "recent": "int_list", "zones": "json",
}  # fmt: skip
T1, T2, T3 = "2026-11-28T10:00:00", "2026-11-28T11:00:00.750000", "2026-11-28T12:00:00+00:00"


def epoch(text: str) -> int:
    """Whole UTC epoch seconds, floored: what the freshness field holds."""
    return micros(text) // 1_000_000


def micros(text: str) -> int:
    """UTC epoch microseconds: the as-of time both stores order writes by."""
    t = dt.datetime.fromisoformat(text)
    return ((t if t.tzinfo else t.replace(tzinfo=UTC)) - EPOCH) // dt.timedelta(microseconds=1)


@pytest.fixture(scope="module")
def defs_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("push") / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text(ENTITIES)
    (folder / "driver_stats.yaml").write_text(STATS)
    (folder / "driver_daily.yaml").write_text(DAILY)
    return folder


DEFS = Path()  # set by the module's first test that reads Redis back (redis_held): the definitions' folder


@pytest.fixture(autouse=True)
def _defs_folder(defs_dir):
    global DEFS
    DEFS = defs_dir


def push_conf(tmp_path, defs_dir, redis_server, pg_server, server: dict | None = None, **fields) -> RunConf:
    """Redis and PostgreSQL written, push on (``server``: further server settings; ``fields``: other sections)."""
    settings = {
        "env": "test",
        "data_root": str(tmp_path / "data"),
        "definitions_dir": str(defs_dir),
        "sinks": ["redis", "sql"],
        "redis": {"url": redis_server.url, "password_env": None},
        "sql": {"dsn": pg_server.dsn, "password_env": None, "retry_base_delay": 0.01},
        "reader": {"timeout_ms": 10_000},
        "server": {"push": {"enabled": True}, **(server or {})},
    }
    return RunConf.model_validate({**settings, **fields})


@pytest.fixture
def conf(tmp_path, defs_dir, redis_db, pg_db, redis_server, pg_server) -> RunConf:
    return push_conf(tmp_path, defs_dir, redis_server, pg_server)


def calls(app, *requests) -> list[tuple[int, dict]]:
    """Requests (method, path, body dict, headers) answered in order on one event loop."""

    async def run():
        out = []
        try:
            for method, path, body, *headers in requests:
                status, text = await asgi_request(app, method, path, json.dumps(body).encode(), headers[0] if headers else JSON)
                out.append((status, json.loads(text)))
        finally:
            await app.reader.close()
            if app.push is not None:
                app.push.close()
        return out

    return asyncio.run(run())


def push(df: dict, **extra) -> tuple:
    return ("POST", "/push", {"push_source_name": "driver_push", "df": df, **extra})


def redis_held(client, driver: int) -> tuple[dict, int] | None:
    """The source's values in the driver's hash, decoded, and its as-of time (epoch microseconds); None: no hash."""
    fields = client.hgetall(f"d:{driver}")
    if not fields:
        return None
    # the as-of time to the microsecond: the freshness field's seconds and the sub-second field's microseconds (absent: 0)
    as_of = int(fields.pop(freshness_field("driver_stats"))) * 1_000_000 + int(fields.pop(subsecond_field("driver_stats"), 0))
    options = {f.name: f.options for f in load_definitions(DEFS).sources["driver_stats"].features}
    values = {n: decode(t, fields.pop(field_id(n)), **options[n]) for n, t in FEATURES.items() if field_id(n) in fields}
    assert not fields, fields
    return values, as_of


def sql_held(conn, driver: int) -> tuple[dict, int] | None:
    row = conn.execute(
        "SELECT features::text, as_of FROM driver_features WHERE entity_key = %s AND source = 'driver_stats'", [str(driver)]
    ).fetchone()
    return None if row is None else (json.loads(row[0]), (row[1] - EPOCH) // dt.timedelta(microseconds=1))


def rows(**columns) -> dict:
    return {k: list(v) for k, v in columns.items()}


def empty_table(tmp_path: Path) -> Path:
    """driver_stats' offline table: an empty Delta table of its key, times, trips and city."""
    import deltalake
    import pyarrow as pa

    table = tmp_path / "data" / "driver_stats"
    schema = pa.schema([("driver_id", pa.int64()), ("event_timestamp", pa.timestamp("us", "UTC")), ("created", pa.timestamp("us", "UTC")),
                        ("trips", pa.int64()), ("city", pa.string())])  # fmt: skip
    deltalake.write_deltalake(str(table), pa.table({n: pa.array([], t) for n, t in zip(schema.names, schema.types)}))
    return table


def test_pushed_rows_are_stored_as_a_run_stores_them_in_both_stores(conf, defs_dir, redis_db, pg_db):
    defs = load_definitions(defs_dir)
    df = rows(
        driver_id=[1, 2],
        event_timestamp=[T1, T2],
        conv_rate=[0.1, 0.25],
        trips=[3, None],
        city=["Köln", "Oslo"],
        profile=['{"b": [1, 2.0], "a": "x"}', None],
        vec=[[0.5, -1.5], None],
        recent=[[7, 8, 9], []],
    )
    [(status, answer)] = calls(build_app(conf), push(df))
    assert status == 200, answer
    assert answer["written"] == {
        "driver_stats": {
            "redis": {"written": 2, "kept_newer": 0, "replaced_future": 0},
            "sql": {"written": 2, "kept_newer": 0, "replaced_future": 0},
        }
    }
    # the bytes Redis holds are the reference encoder's
    options = {f.name: f.options for f in defs.sources["driver_stats"].features}
    raw = redis_db.hgetall("d:1")
    assert raw[field_id("conv_rate")] == encode("float", 0.1, **options["conv_rate"])
    assert raw[field_id("profile")] == b'{"a":"x","b":[1,2]}'  # canonical JSON text (serializers/FORMAT.md)
    assert raw[field_id("recent")] == encode("int_list", [7, 8, 9], **options["recent"])
    assert raw[freshness_field("driver_stats")] == str(epoch(T1)).encode()
    # T2 is 11:00:00.75: its whole seconds in the freshness field, the microseconds past them in the
    # sub-second field (serializers/FORMAT.md 1.4); T1 has none, and no sub-second field
    assert subsecond_field("driver_stats") not in raw
    assert redis_db.hmget("d:2", [freshness_field("driver_stats"), subsecond_field("driver_stats")]) == [b"1795863600", b"750000"]
    assert redis_held(redis_db, 2) == ({"conv_rate": 0.25, "city": "Oslo", "recent": []}, micros(T2))  # nulls not written
    assert sql_held(pg_db, 1) == (
        {"conv_rate": 0.1, "trips": 3, "city": "Köln", "profile": {"a": "x", "b": [1, 2]}, "vec": [0.5, -1.5], "recent": [7, 8, 9]},
        micros(T1),
    )
    assert sql_held(pg_db, 2) == ({"conv_rate": 0.25, "city": "Oslo", "recent": []}, micros(T2))


def test_of_one_entitys_rows_the_latest_is_written_and_an_older_push_never_replaces_a_newer_value(conf, defs_dir, redis_db, pg_db):
    same_time = rows(driver_id=[5, 5, 5, 6], event_timestamp=[T2, T3, T3, T1], created=[None, T1, T2, None], trips=[1, 2, 3, 4])
    older = rows(driver_id=[5, 6], event_timestamp=[T1, T1], trips=[10, 11])  # 5: older; 6: as old, written again
    write = ("POST", "/write-to-online-store", {"feature_view_name": "driver_stats", "df": older})
    (s1, first), (s2, second) = calls(build_app(conf), push(same_time), write)
    assert (s1, first["written"]["driver_stats"]["redis"]) == (200, {"written": 2, "kept_newer": 0, "replaced_future": 0})
    assert (s2, second["written"]["driver_stats"]["sql"]) == (200, {"written": 1, "kept_newer": 1, "replaced_future": 0})
    # the latest event time, then the latest created time, wins
    assert redis_held(redis_db, 5) == sql_held(pg_db, 5) == ({"trips": 3}, micros(T3))
    assert redis_held(redis_db, 6) == sql_held(pg_db, 6) == ({"trips": 11}, micros(T1))


BAD = [
    ({"event_timestamp": [T1], "trips": [1]}, "missing entity key column(s) 'driver_id'", "BadPush"),
    ({"driver_id": [1], "trips": [1]}, "missing the event time column 'event_timestamp'", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "trips": [1], "speed": [2]}, "unknown column(s) 'speed'", "BadPush"),
    ({"driver_id": [1, 2], "event_timestamp": [T1, T1], "trips": [1, 2.5]}, "row 1, column 'trips': expected an integer", "BadPush"),
    (
        {"driver_id": [1, "x"], "event_timestamp": [T1, T1], "trips": [1, 2]},
        "entity key 'driver_id' row 1: expected an integer",
        "BadPushKey",
    ),
    (
        {"driver_id": [1, 2], "event_timestamp": [T1, None], "trips": [1, 2]},
        "row 1, column 'event_timestamp': the event time is null",
        "BadPush",
    ),
    (
        {"driver_id": [1], "event_timestamp": ["2099-01-01T00:00:00"], "trips": [1]},
        "plus 300 s (server.push.clock_skew_seconds)",
        "BadPush",
    ),
    ({"driver_id": [1], "event_timestamp": ["yesterday"], "trips": [1]}, "'yesterday' is not an ISO 8601 time", "BadPush"),
    ({"driver_id": [1, 2], "event_timestamp": [T1, T1], "vec": [[1.0, 2.0], [1.0]]}, "row 1, column 'vec': 1 elements", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "recent": [[1, None]]}, "row 0, column 'recent': element 1 is null", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "conv_rate": [1e39]}, "row 0, column 'conv_rate': 1e+39 is beyond float32", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "city": ["Amsterdam"]}, "row 0, column 'city': longer than 8 characters", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "profile": ["{not json"]}, "row 0, column 'profile'", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "city": ["a\x00b"]}, "NUL character", "BadPush"),
    ({"driver_id": [1, 2], "event_timestamp": [T1], "trips": [1, 2]}, "the columns of 'df' differ in length", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [-1e20], "trips": [1]}, "row 0, column 'event_timestamp': expected an ISO 8601", "BadPush"),
    (
        {"driver_id": [1], "event_timestamp": [T1], "profile": [{"n": 2**64 + 1}]},
        "row 0, column 'profile': integer beyond int64",
        "BadPush",
    ),
    ({"driver_id": [1], "event_timestamp": [T1], "zones": [["{", "2"]]}, "row 0, column 'zones': element 0: not JSON", "BadPush"),
    # issue 62, item 3: a df whose rows were not counted (200 with nothing written)
    ({"driver_id": {"0": 1}, "event_timestamp": {"0": T1}, "trips": {"0": 1}}, "pandas' DataFrame.to_dict() default", "BadPush"),
    ({"driver_id": 1, "event_timestamp": [T1], "trips": [1]}, "column 'driver_id': expected a list of values, got int", "BadPush"),
    ({"driver_id": [], "event_timestamp": [], "trips": []}, "'df' holds no rows", "BadPush"),
    ({"speed": [1]}, "missing entity key column(s) 'driver_id'", "BadPush"),
    # item 4: an event time Spark cannot read back from the table (year 1; the entity has no TTL here)
    ({"driver_id": [1], "event_timestamp": ["0001-01-01T00:00:00"], "trips": [1]}, "is before 1900-01-01", "BadPush"),
    ({"driver_id": [1], "event_timestamp": [T1], "created": ["1899-12-31T23:59:59"], "trips": [1]}, "column 'created'", "BadPush"),
    # times whose offset carries them past year 1 or 9999, UTC (their message was a 500)
    ({"driver_id": [1], "event_timestamp": ["0001-01-01T00:00:00+01:00"], "trips": [1]}, "is before 1900-01-01", "BadPush"),
    ({"driver_id": [1], "event_timestamp": ["9999-12-31T23:59:59-01:00"], "trips": [1]}, "microseconds from the epoch is later", "BadPush"),
    # a row of an entity older than the one written is checked too: an offline push appends it
    (
        {"driver_id": [1, 1], "event_timestamp": [T1, T2], "vec": [[1.0], [1.0, 2.0]]},
        "row 0, column 'vec': 1 elements; the embedding's dimension is 2",
        "BadPush",
    ),
    # item 10: an integer past float64, a lone surrogate (were 500)
    (
        {"driver_id": [1], "event_timestamp": [T1], "conv_rate": [2**1100]},
        "row 0, column 'conv_rate': 1358298529049385849277351428359266778603... is beyond float64",
        "BadPush",
    ),
    ({"driver_id": [1], "event_timestamp": [T1], "city": ["\ud800"]}, "the body['df']['city'][0]: a lone surrogate", "BadPush"),
    # item 9: JSON texts and JSON values mixed in a json_text_elements list (the texts were stored as strings)
    (
        {"driver_id": [1], "event_timestamp": [T1], "zones": [['{"a": 1}', 2]]},
        "row 0, column 'zones': element 1 is a JSON value among JSON texts",
        "BadPush",
    ),
]


@pytest.mark.parametrize("df,text,kind", BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_push_to_the_offline_store_is_refused_alike_and_nothing_is_appended(conf, tmp_path, redis_db, pg_db, df, text, kind):
    # issue 62, item 4: to: offline skipped every check of the online path (the next run then failed)
    import deltalake
    import pyarrow as pa

    table = tmp_path / "data" / "driver_stats"
    deltalake.write_deltalake(str(table), pa.table({"driver_id": pa.array([], pa.int64()), "trips": pa.array([], pa.int64())}))
    [(status, answer)] = calls(build_app(conf), push(df, to="offline"))
    assert status == 400 and answer["type"] == kind and text in answer["error"], answer
    assert deltalake.DeltaTable(str(table)).version() == 0
    assert redis_db.keys("d:*") == []  # no entity written (the stores' description may be recorded, as by a run)


@pytest.mark.parametrize("df,text,kind", BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_push_is_refused_naming_its_row_and_column_and_nothing_of_it_is_written(conf, defs_dir, redis_db, pg_db, df, text, kind):
    good = {"driver_id": [9], "event_timestamp": [T1], "trips": [1]}  # written first: the bad push must leave it alone
    app = build_app(conf)
    [(s1, _), (status, answer)] = calls(app, push(good), push(df))
    assert s1 == 200
    assert status == 400 and answer["type"] == kind and text in answer["error"], answer
    metrics = asyncio.run(asgi_request(app, "GET", "/metrics"))[1].decode()
    assert "feature_server_pushes_total 1.0" in metrics and "feature_server_pushes_refused_total 1.0" in metrics
    assert "feature_server_pushed_rows_total 1.0" in metrics
    assert sorted(redis_db.keys("d:*")) == [b"d:9"]
    assert [r[0] for r in pg_db.execute("SELECT entity_key FROM driver_features")] == ["9"]


def test_what_a_push_may_not_be(conf, tmp_path, defs_dir, redis_db, pg_db, redis_server, pg_server):
    small = push_conf(tmp_path, defs_dir, redis_server, pg_server, {"push": {"enabled": True, "max_rows": 2}, "max_body_bytes": 2048})
    two = rows(driver_id=[1, 2, 3], event_timestamp=[T1] * 3, trips=[1, 2, 3])
    answers = calls(
        build_app(small),
        push(two),
        push({"driver_id": list(range(400)), "event_timestamp": [T1] * 400}),
        push(rows(driver_id=[1], event_timestamp=[T1], trips=[1]), to="elsewhere"),
        ("POST", "/push", {"push_source_name": "nope", "df": {"driver_id": [1]}}),
        ("POST", "/write-to-online-store", {"feature_view_name": "nope", "df": {"driver_id": [1]}}),
        ("POST", "/write-to-online-store", {"feature_view_name": "driver_daily", "df": {"driver_id": [1], "rating": [1.0]}}),
        ("POST", "/push", ["not", "an", "object"]),
    )
    assert [(s, a["type"]) for s, a in answers] == [
        (413, "TooManyRows"),
        (413, "BodyTooLarge"),
        (400, "BadPush"),
        (404, "UnknownPushSource"),
        (404, "UnknownFeatureView"),
        (400, "NotPushable"),
        (400, "BadPush"),
    ]
    assert "3 rows; the limit is 2 (server.push.max_rows)" in answers[0][1]["error"]
    assert "'to' must be one of online, offline, online_and_offline" in answers[2][1]["error"]
    assert "push sources: driver_push" in answers[3][1]["error"]
    assert "selected by date" in answers[5][1]["error"]
    assert redis_db.dbsize() == 0


def test_push_off_answers_403_and_the_server_holds_no_writer_credentials(
    tmp_path, defs_dir, redis_db, redis_server, pg_server, monkeypatch
):
    monkeypatch.delenv("FM_TEST_NO_SUCH_PASSWORD", raising=False)

    def conf(push: dict):
        return push_conf(
            tmp_path, defs_dir, redis_server, pg_server, {"push": push},
            sinks=["redis"],
            redis={"url": redis_server.url, "password_env": "FM_TEST_NO_SUCH_PASSWORD"},  # the writer's: never read
            reader={"timeout_ms": 10_000, "redis": {"username": None}},  # reads as the default user, no password
        )  # fmt: skip

    [(status, answer)] = calls(build_app(conf({"enabled": False})), push(rows(driver_id=[1], event_timestamp=[T1], trips=[1])))
    assert (status, answer) == (403, {"error": "this server takes no pushes (server.push.enabled: false)", "type": "PushDisabled"})
    with pytest.raises(ConfigError, match="redis.password_env names 'FM_TEST_NO_SUCH_PASSWORD'"):
        build_app(conf({"enabled": True}))  # push on: the writer's credentials are read at the start, and missing
    # push's own credentials, apart from the writer's
    pushing = conf({"enabled": True, "redis": {"username": None}})
    [(status, answer)] = calls(build_app(pushing), push(rows(driver_id=[1], event_timestamp=[T1], trips=[4])))
    assert status == 200 and redis_db.hget("d:1", field_id("trips")) == encode("int", 4)


def test_the_server_that_took_a_push_answers_the_new_value_at_once(conf, defs_dir, redis_db, pg_db):
    """Its L1 cache (5 s) forgets the pushed entities; another server's cache answers the old value until its entry expires."""
    read = ("POST", "/get-online-features", {"features": ["driver_stats:trips"], "entities": {"driver_id": [1, 2]}})

    def values(answer):
        return answer["results"][1]["values"]

    async def run():
        app, other = build_app(conf), build_app(conf)
        try:
            out = []
            for target, (method, path, body) in [
                (app, push(rows(driver_id=[1], event_timestamp=[T1], trips=[1]))),
                (app, read),
                (other, read),
                (app, push(rows(driver_id=[1, 2], event_timestamp=[T2, T2], trips=[2, 3]))),
                (app, read),
                (other, read),
            ]:
                status, text = await asgi_request(target, method, path, json.dumps(body).encode(), JSON)
                out.append((status, json.loads(text)))
            return out, app.reader.stats
        finally:
            await app.reader.close()
            await other.reader.close()

    answers, stats = asyncio.run(run())
    assert [s for s, _ in answers] == [200] * 6
    assert values(answers[1][1]) == values(answers[2][1]) == [1, None]
    assert values(answers[4][1]) == [2, 3]  # at once, on the server that took it
    assert values(answers[5][1]) == [1, None]  # the other server's cache, within its time to live
    assert stats["hits"] == 0 and stats["misses"] == 4  # both reads of the pushing server went to Redis


GRANTS = {"pusher": {"sources": ["*"], "push": ["driver_stats"]}, "reader": {"sources": ["*"]}}


def test_a_push_needs_a_token_granting_push_on_each_source_it_writes(conf, tmp_path, redis_db, pg_db):
    signer = Signer("k1")
    (tmp_path / "jwks.json").write_bytes(jwks_of(signer))
    auth = {"mode": "jwt", "jwks_file": str(tmp_path / "jwks.json"), "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS}
    conf = conf.model_copy(update={"server": conf.server.model_copy(update={"auth": ServerAuthSettings(**auth)})})
    df = rows(driver_id=[1], event_timestamp=[T1], trips=[1])

    def bearer(roles):
        return [*JSON, (b"authorization", f"Bearer {signer.token(roles)}".encode())]

    answers = calls(build_app(conf), (*push(df), JSON), (*push(df), bearer(["reader"])), (*push(df), bearer(["reader", "pusher"])))
    assert [(s, a.get("type")) for s, a in answers] == [(401, "Unauthorized"), (403, "Forbidden"), (200, None)]
    assert answers[1][1]["error"] == "this token does not grant pushing to 'driver_stats' (server.auth.grants: push)"
    assert redis_db.hget("d:1", field_id("trips")) == encode("int", 1)
    # a token granting no push learns nothing of which sources exist (was 404 for one, 403 for another)
    answers = calls(
        build_app(conf),
        *[(*write, bearer(["reader"])) for write in (("POST", "/write-to-online-store", {"feature_view_name": n, "df": df})
                                                     for n in ("driver_stats", "nope"))],
    )  # fmt: skip
    assert [(s, a["type"]) for s, a in answers] == [(403, "Forbidden"), (403, "Forbidden")]
    assert answers[1][1]["error"] == "this token does not grant pushing to 'nope' (server.auth.grants: push)"


def test_online_and_offline_appends_to_the_table_first_and_a_refused_append_writes_nothing(conf, tmp_path, redis_db, pg_db):
    import deltalake

    table = empty_table(tmp_path)
    df = rows(driver_id=[1, 2], event_timestamp=[T1, T2], created=[None, None], trips=[4, 5], city=["a", "b"])
    unknown = rows(driver_id=[3], event_timestamp=[T1], created=[None], trips=[6], city=["c"], conv_rate=[0.5])  # not in the table
    nul = rows(driver_id=[4], event_timestamp=[T1], created=[None], trips=[7], city=["a\x00b"])  # the table takes it, the SQL store not
    (s1, a1), (s2, a2), (s3, a3) = calls(
        build_app(conf), push(df, to="online_and_offline"), push(unknown, to="online_and_offline"), push(nul, to="online_and_offline")
    )
    assert s1 == 200 and a1["offline"] == {"driver_stats": 2}, a1
    read = deltalake.DeltaTable(str(table)).to_pyarrow_table().sort_by("driver_id")
    assert read.column("trips").to_pylist() == [4, 5]
    assert [t.timestamp() for t in read.column("event_timestamp").to_pylist()] == [epoch(T1), epoch(T2) + 0.75]
    assert redis_held(redis_db, 2) == sql_held(pg_db, 2) == ({"trips": 5, "city": "b"}, micros(T2))
    assert s2 == 400 and "conv_rate" in a2["error"], a2
    assert s3 == 400 and "NUL character" in a3["error"], a3  # refused before the append
    assert redis_held(redis_db, 3) is None and sql_held(pg_db, 3) is None  # the append was refused: no store written
    assert redis_held(redis_db, 4) is None and sql_held(pg_db, 4) is None
    assert deltalake.DeltaTable(str(table)).version() == 1


def test_writers_stay_open_between_pushes_and_one_whose_connection_died_is_replaced(conf, redis_db, pg_db, pg_server):
    app = build_app(conf)

    async def run():
        out, before = [], {c["id"] for c in redis_db.client_list(_type="normal")}
        for n, event in enumerate((T1, T2, T3)):
            body = {"push_source_name": "driver_push", "df": rows(driver_id=[1], event_timestamp=[event], trips=[n])}
            out.append(await asgi_request(app, "POST", "/push", json.dumps(body).encode(), JSON))
            if n == 0:
                # the connections this server made (by id: another test's, closing meanwhile, are not counted)
                connections = len({c["id"] for c in redis_db.client_list(_type="normal")} - before)
            if n == 1:  # the kept writers' connections die (an idle timeout, a restart, a proxy)
                redis_db.client_kill_filter(_type="normal", skipme=True)
                with pg_server.connect() as admin:
                    others = "pid <> pg_backend_pid() AND datname = current_database()"
                    admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {others}")
        await app.reader.close()
        app.push.close()
        return out, connections

    answers, connections = asyncio.run(run())
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert connections == 3, connections  # the kept writer's two (its commands', its pipeline's), the descriptions' reader
    assert redis_held(redis_db, 1) == ({"trips": 2}, micros(T3))
    with pg_server.connect() as check:
        assert sql_held(check, 1) == ({"trips": 2}, micros(T3))


def test_what_a_run_reads_alike_a_push_writes_alike(conf, redis_db, pg_db):
    """JSON texts per element (json_text_elements), sub-second event times ordering one push's rows,
    a body whose JSON a run would refuse (a duplicate key), an empty push."""
    df = rows(
        driver_id=[1, 1, 2],
        event_timestamp=["2026-11-28T10:00:00.900", "2026-11-28T10:00:00.100", T1],  # 1: the first row is the later
        city=["newer", "older", None],
        zones=[['{"a": 1}', "2", None], None, ["[1, 2.5]"]],
        profile=['"\\\\u0000 is six characters"', None, None],  # a backslash, then u0000: no NUL
    )
    duplicate = b'{"push_source_name": "driver_push", "df": {"driver_id": [3], "event_timestamp": ["' + T1.encode() + b'"], '
    duplicate += b'"profile": [{"k": 1, "k": 2}]}}'

    async def run():
        app = build_app(conf)
        try:
            return [
                await asgi_request(app, "POST", "/push", json.dumps({"push_source_name": "driver_push", "df": df}).encode(), JSON),
                await asgi_request(app, "POST", "/push", duplicate, JSON),
                await asgi_request(app, "POST", "/push", json.dumps(push({"driver_id": [], "event_timestamp": []})[2]).encode(), JSON),
            ]
        finally:
            await app.reader.close()
            app.push.close()

    (s1, a1), (s2, a2), (s3, a3) = asyncio.run(run())
    assert s1 == 200, a1
    expected = {"city": "newer", "zones": [{"a": 1}, 2, None], "profile": "\\u0000 is six characters"}
    assert redis_held(redis_db, 1) == sql_held(pg_db, 1) == (expected, micros("2026-11-28T10:00:00.900"))  # to the microsecond
    assert redis_held(redis_db, 2)[0] == sql_held(pg_db, 2)[0] == {"zones": [[1, 2.5]]}
    assert (s2, json.loads(a2)["error"]) == (400, "the body is not JSON: duplicate key in a JSON object: 'k'")
    assert (s3, json.loads(a3)) == (400, {"error": "'df' holds no rows: a push writes at least one", "type": "BadPush"})
    assert redis_held(redis_db, 3) is None


def test_a_push_meets_the_runs_redis_checks_an_evicting_policy_is_refused(conf, redis_db, pg_db):
    policy = redis_db.config_get("maxmemory-policy")["maxmemory-policy"]
    redis_db.config_set("maxmemory-policy", "allkeys-lru")
    try:
        [(status, answer)] = calls(build_app(conf), push(rows(driver_id=[1], event_timestamp=[T1], trips=[1])))
    finally:
        redis_db.config_set("maxmemory-policy", policy)
    assert (status, answer["type"]) == (507, "StoreFull"), answer
    assert "maxmemory-policy may evict driver keys" in answer["error"] and "Nothing was written" in answer["error"]
    assert redis_db.keys("d:*") == []


def test_a_read_asked_after_a_push_never_waits_on_one_begun_before_it(conf, redis_db):
    """The scoreboard (single-flight): a read of an entity claimed before a push is not joined
    by a read asked after it, which reads the store itself."""
    from feature_reader import FeatureReader

    reader = FeatureReader(conf, load_definitions(DEFS))
    try:
        core = reader._core
        request = reader._request(["driver_stats:trips"], {"driver_id": [1]}, None, False, None)
        before = core.get(request, None, reader._flights)
        assert next(before)[0] == "read"  # claimed: under way
        joined = core.get(request, None, reader._flights)
        assert next(joined)[0] == "wait"  # a second read of it waits on the first
        joined.close()
        core.forget("driver_stats", ["1"])
        after = core.get(request, None, reader._flights)
        assert next(after)[0] == "read"  # after the push: its own read
        after.close()
        before.close()
    finally:
        reader.close()


# -- issue 62: pushes Feast's SDK makes, times a push may carry ---------------------------------------


def shared_push_view(name: str, features: str) -> str:
    """A view of the driver by event time over the push source shared_push, keyed by its own column driver."""
    return (
        f"source:\n  name: {name}\n  entity: driver\n  location: {name}\n  layout: wide\n  select_by: event_time\n"
        f"  timestamp_column: ts\n  key_columns: [driver]\n  push_source: shared_push\n  features:\n{features}"
    )


TWO_VIEWS = {
    "entities.yaml": """entities:
  - {name: driver, prefix: d, keys: [{name: driver_id, type: int}], sql_table: driver_features, ttl_seconds: 864000}
""",
    "stats_a.yaml": shared_push_view("stats_a", "    - {name: trips, type: int}\n    - {name: rate, type: float, precision: float32}\n"),
    "stats_b.yaml": shared_push_view("stats_b", "    - {name: city, type: string}\n"),
}


@pytest.fixture
def two_views(tmp_path, redis_db, pg_db, redis_server, pg_server) -> RunConf:
    folder = tmp_path / "two_views"
    folder.mkdir()
    for name, text in TWO_VIEWS.items():
        (folder / name).write_text(text)
    return push_conf(tmp_path, folder, redis_server, pg_server)


def test_one_push_source_read_by_two_sources_writes_each_its_own_columns(two_views, redis_db, pg_db):
    now = dt.datetime.now(UTC).replace(microsecond=0)
    df = {"driver": [1], "ts": [now.isoformat()], "trips": [3], "rate": [3.4028235e38], "city": ["Oslo"]}
    by_join_key = {"driver_id": [2], "ts": [now.isoformat()], "trips": [4], "city": ["Rome"]}  # what Feast's SDK sends
    (s1, a1), (s2, a2), (s3, a3) = calls(
        build_app(two_views),
        ("POST", "/push", {"push_source_name": "shared_push", "df": df}),
        ("POST", "/push", {"push_source_name": "shared_push", "df": by_join_key}),
        ("POST", "/push", {"push_source_name": "shared_push", "df": {**df, "speed": [1]}}),
    )
    assert (s1, s2) == (200, 200), (a1, a2)
    assert set(a1["written"]) == {"stats_a", "stats_b"}
    # each source's own features, as the reference encoder writes them (float32's largest value taken, not refused)
    assert redis_db.hmget("d:1", [field_id("trips"), field_id("rate"), field_id("city")]) == [
        encode("int", 3), encode("float", 3.4028234663852886e38, precision="float32"), b"Oslo"
    ]  # fmt: skip
    assert redis_db.hmget("d:2", [field_id("trips"), field_id("city")]) == [encode("int", 4), b"Rome"]
    stamps = redis_db.hmget("d:1", [freshness_field("stats_a"), freshness_field("stats_b")])
    assert stamps == [b"%d" % now.timestamp()] * 2
    found = pg_db.execute("SELECT entity_key, source, features::text FROM driver_features ORDER BY 1, 2").fetchall()
    assert [(k, s, json.loads(f)) for k, s, f in found] == [
        ("1", "stats_a", {"trips": 3, "rate": 340282350000000000000000000000000000000}),  # float32's 3.4028235e38 as JSONB prints it
        ("1", "stats_b", {"city": "Oslo"}),
        ("2", "stats_a", {"trips": 4}), ("2", "stats_b", {"city": "Rome"}),
    ]  # fmt: skip
    assert s3 == 400 and "unknown column(s) 'speed'" in a3["error"], a3  # a column of neither source is still refused


def test_a_pushed_event_time_past_the_clock_and_skew_or_past_the_ttl_is_refused(two_views, redis_db):
    now = dt.datetime.now(UTC)
    cases = {
        "later": now + dt.timedelta(seconds=400),  # skew 300 s: refused
        "1970": dt.datetime(1970, 1, 1, tzinfo=UTC),  # expired by the TTL (10 days): was served PRESENT for 10 more
        "ttl": now - dt.timedelta(days=10, seconds=60),
        "soon": now + dt.timedelta(seconds=200),  # within the skew: taken
        "old": now - dt.timedelta(days=9),  # within the TTL: taken
    }
    answers = calls(
        build_app(two_views),
        *[("POST", "/push", {"push_source_name": "shared_push", "df": {"driver": [i], "ts": [t.isoformat()], "trips": [i], "city": ["x"]}})
          for i, t in enumerate(cases.values())],
    )  # fmt: skip
    assert [s for s, _ in answers] == [400, 400, 400, 200, 200], answers
    assert "later than now" in answers[0][1]["error"] and "(server.push.clock_skew_seconds)" in answers[0][1]["error"]
    for _, a in answers[1:3]:
        assert "older than entity 'driver''s TTL (864,000 s, ttl_seconds)" in a["error"], a
    assert sorted(redis_db.keys("d:*")) == [b"d:3", b"d:4"]


def test_serving_unauthenticated_off_loopback_with_push_on_says_it_writes(conf):
    from feature_reader.auth import AuthConfigError, check_start

    with pytest.raises(AuthConfigError) as refused:
        check_start(conf.server, "10.1.2.3", False, Path("."))
    assert "could read every feature and write every pushed source's values (server.push is on)" in str(refused.value)


def test_reads_keep_their_capacity_while_pushes_wait_on_a_locked_sql_row(tmp_path, defs_dir, redis_db, pg_db, redis_server, pg_server):
    # issue 62, item 8: 16 pushing threads made 107 of 177 reads answer 503; with the table locked, 333 of 360
    limits = {"push": {"enabled": True, "max_in_flight": 2, "store_timeout_ms": 1500}, "max_in_flight": 8}
    conf = push_conf(tmp_path, defs_dir, redis_server, pg_server, limits)
    read = json.dumps({"features": ["driver_stats:trips"], "entities": {"driver_id": [1, 2]}}).encode()

    def body(trips: int) -> bytes:  # entity 1 at T2: pushed again, each waits on the row's lock
        return json.dumps(push(rows(driver_id=[1], event_timestamp=[T2], trips=[trips]))[2]).encode()

    async def run():
        app = build_app(conf)
        try:
            assert (await asgi_request(app, "POST", "/push", body(1), JSON))[0] == 200
            with pg_server.connect() as locker:  # a transaction holding the pushed row's lock, as a long run's batch would
                locker.execute("BEGIN")
                locker.execute("SELECT 1 FROM driver_features WHERE entity_key = '1' FOR UPDATE")
                pushes = [asyncio.ensure_future(asgi_request(app, "POST", "/push", body(2 + i), JSON)) for i in range(12)]
                await asyncio.sleep(0.2)
                gauge = (await asgi_request(app, "GET", "/metrics"))[1].decode()
                reads = [await asgi_request(app, "POST", "/get-online-features", read, JSON) for _ in range(30)]
                pushed = await asyncio.gather(*pushes)
                locker.execute("ROLLBACK")
            return gauge, reads, pushed
        finally:
            await app.reader.close()
            app.push.close()

    gauge, reads, pushed = asyncio.run(run())
    assert "feature_server_pushes_in_flight 2.0" in gauge  # the two pushes let in wait on the lock
    assert [s for s, _ in reads] == [200] * 30  # every read answered while pushes waited
    answers = sorted((s, json.loads(b)["type"]) for s, b in pushed)
    # 10 refused at once (their limit), the 2 let in cancelled at the lock deadline: 503, retry (Redis took them already)
    assert answers == [(503, "Overloaded")] * 10 + [(503, "StoreUnavailable")] * 2, answers
    cancelled = [json.loads(b)["error"] for s, b in pushed if json.loads(b)["type"] == "StoreUnavailable"]
    assert all("canceling statement due to statement timeout" in e and "(retry: a push repeats safely)" in e for e in cancelled)


def test_the_push_limit_must_leave_reads_room(tmp_path, defs_dir, redis_server, pg_server):
    with pytest.raises(ValueError, match=r"server.push.max_in_flight \(8\) must be below server.max_in_flight \(4\)"):
        push_conf(tmp_path, defs_dir, redis_server, pg_server, {"max_in_flight": 4})


def test_pushes_within_one_second_are_ordered_by_their_microseconds_in_both_stores(conf, redis_db, pg_db):
    # issue 62, item 1: the stores compared whole seconds, and an equal second was written again
    late, early = "2026-11-28T10:00:00.900000", "2026-11-28T10:00:00.100000"
    answers = calls(
        build_app(conf),
        push(rows(driver_id=[1, 2], event_timestamp=[late, early], trips=[1, 2])),
        push(rows(driver_id=[1, 2], event_timestamp=[early, late], trips=[3, 4])),  # 1: older by 0.8 s, kept; 2: newer
        push(rows(driver_id=[1], event_timestamp=[late], trips=[5])),  # as new: written again (a retry repeats itself)
    )
    assert [a["written"]["driver_stats"] for _, a in answers[1:2]] == [
        {s: {"written": 1, "kept_newer": 1, "replaced_future": 0} for s in ("redis", "sql")}
    ]
    assert redis_held(redis_db, 1) == sql_held(pg_db, 1) == ({"trips": 5}, micros(late))
    assert redis_held(redis_db, 2) == sql_held(pg_db, 2) == ({"trips": 4}, micros(late))


def _defs(folder: Path, features: str, lock: dict | None = None) -> Path:
    folder.mkdir()
    (folder / "entities.yaml").write_text(ENTITIES)
    (folder / "s.yaml").write_text(
        "source:\n  name: s\n  entity: driver\n  location: s\n  layout: wide\n  select_by: event_time\n  timestamp_column: ts\n"
        f"  push_source: p\n  features:\n{features}"
    )
    if lock is not None:
        from feature_defs.stored_lock import Lock, Stored, write_lock

        write_lock(folder, Lock({"driver": {n: Stored(**s) for n, s in lock.items()}}))
    return folder


def test_a_server_on_older_definitions_than_the_stores_refuses_the_push_with_a_409(tmp_path, redis_db, pg_db, redis_server, pg_server):
    # issue 62, item 2: the stores' description was checked at a source's first push only, and a server on
    # older definitions wrote retired names, retired a newer feature, re-dated a newer feature's value
    a, b = "    - {name: a, type: int}\n", "    - {name: b, type: int}\n"
    old = push_conf(tmp_path, _defs(tmp_path / "old", a), redis_server, pg_server)
    new = push_conf(tmp_path, _defs(tmp_path / "new", a + b), redis_server, pg_server)
    # newer still: a removed, which its stored.lock records (a push of it retires a, as a run would)
    lock = {n: {"source": "s", "feature": n, "encoding": "int"} for n in ("a", "b")}
    lock["a"]["retired"] = "2026-12-01"
    newest = push_conf(tmp_path, _defs(tmp_path / "newest", b, lock), redis_server, pg_server)

    def push_to(conf, when: str, **values):
        df = {"driver_id": [1], "ts": [when], **{k: [v] for k, v in values.items()}}
        [(status, answer)] = calls(build_app(conf), ("POST", "/push", {"push_source_name": "p", "df": df}))
        return status, answer

    def held():
        fields = redis_db.hgetall("d:1")
        row = pg_db.execute("SELECT features::text, as_of FROM driver_features WHERE entity_key = '1'").fetchone()
        return {k: fields.get(field_id(k)) for k in ("a", "b", "_ts:s")}, (json.loads(row[0]), row[1].isoformat())

    assert push_to(old, "2026-12-01T10:00:00", a=1)[0] == 200  # the old definitions first: nothing newer stored yet
    assert push_to(new, "2026-12-01T11:00:00", a=2, b=3)[0] == 200  # a run or server on the new ones
    before = held()
    stamp = str(epoch("2026-12-01T11:00:00")).encode()
    assert before == ({"a": b"2", "b": b"3", "_ts:s": stamp}, ({"a": 2, "b": 3}, "2026-12-01T11:00:00+00:00"))
    status, answer = push_to(old, "2026-12-01T12:00:00", a=4)
    assert (status, answer["type"]) == (409, "StaleDefinitions"), answer
    assert "the stores hold 'b' (Redis), which this server's definitions do not write" in answer["error"]
    assert held() == before  # b neither retired nor re-dated; nothing written
    assert redis_db.hget("d", b"b") == b"int s" and redis_db.hget("d", b"a") == b"int s"  # the description as the new run left it
    # the newest definitions retire a in both stores, as their run would
    assert push_to(newest, "2026-12-01T13:00:00", b=5)[0] == 200
    assert redis_db.hget("d", b"a") == b"int s retired"
    assert pg_db.execute("SELECT retired FROM stored_names WHERE stored_name = 'a'").fetchone() == (True,)
    # a retired name is never written again by a server that still writes it
    status, answer = push_to(new, "2026-12-01T14:00:00", a=6, b=7)
    assert (status, answer["type"]) == (409, "StoredAsSomethingElse"), answer
    assert "its stored name 'a' is retired in this store" in answer["error"]
    assert redis_db.hget("d:1", field_id("b")) == b"5"


def test_concurrent_pushes_of_one_entity_at_one_time_leave_both_stores_holding_one_value(conf, redis_db, pg_db):
    # issue 62, item 2: Redis and SQL held different values in 7 of 20 rounds (each store kept the push that reached it last)
    async def run():
        app = build_app(conf)
        try:
            held = []
            for r in range(20):
                when = f"2026-11-28T10:00:{r:02d}.500000"  # one time for the round's pushes, later each round
                bodies = [json.dumps(push(rows(driver_id=[1], event_timestamp=[when], trips=[100 * r + i]))[2]).encode() for i in range(4)]
                answers = await asyncio.gather(*[asgi_request(app, "POST", "/push", b, JSON) for b in bodies])
                assert [s for s, _ in answers] == [200] * 4, answers
                held.append((redis_held(redis_db, 1), sql_held(pg_db, 1)))
            return held
        finally:
            await app.reader.close()
            app.push.close()

    for r, (in_redis, in_sql) in enumerate(asyncio.run(run())):
        assert in_redis == in_sql, (r, in_redis, in_sql)
        assert in_redis[0]["trips"] in range(100 * r, 100 * r + 4)


def test_a_push_that_would_leave_a_tie_the_run_refuses_is_refused(conf, tmp_path, redis_db, pg_db):
    # issue 62, item 5: two pushes of one entity at one event time to online_and_offline left a tie in
    # the table, which the run's on_tie: fail refused for the whole source (exit 4)
    import deltalake

    table = empty_table(tmp_path)
    first = rows(driver_id=[1, 2], event_timestamp=[T1, T1], created=[None, T2], trips=[1, 2], city=["a", "b"])
    tied = rows(driver_id=[1], event_timestamp=[T1], created=[None], trips=[9], city=["a"])  # 1 again, other trips
    same_time_later_created = rows(driver_id=[2], event_timestamp=[T1], created=[T3], trips=[7], city=["b"])  # not tied
    within = rows(driver_id=[3, 3], event_timestamp=[T1, T1], created=[None, None], trips=[1, 2], city=["c", "c"])
    answers = calls(
        build_app(conf),
        push(first, to="online_and_offline"),
        push(tied, to="online_and_offline"),
        push(tied, to="offline"),
        push(first, to="online_and_offline"),  # a retry of the first: exact copies, no tie
        push(same_time_later_created, to="online_and_offline"),
        push(within, to="online"),
    )
    assert [(s, a.get("type")) for s, a in answers] == [(200, None), (409, "Tie"), (409, "Tie"), (200, None), (200, None), (400, "BadPush")]
    assert (
        "holds a row as recent as the pushed one (driver_id=1, event_timestamp=2026-11-28 10:00:00+00:00, created=None)"
        in answers[1][1]["error"]
    )
    assert "rows 0 and 1 of entity '3' have the same event time and different values: a tie" in answers[5][1]["error"]
    held = deltalake.DeltaTable(str(table)).to_pyarrow_table().sort_by([("driver_id", "ascending"), ("trips", "ascending")])
    assert list(zip(held.column("driver_id").to_pylist(), held.column("trips").to_pylist())) == [(1, 1), (1, 1), (2, 2), (2, 2), (2, 7)]
    assert redis_held(redis_db, 1) == sql_held(pg_db, 1) == ({"trips": 1, "city": "a"}, micros(T1))  # the tied push wrote no store
    assert redis_held(redis_db, 3) is None and sql_held(pg_db, 3) is None

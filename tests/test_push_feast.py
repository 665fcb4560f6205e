"""Feast's own SDK pushes to `materialize serve` (server.push.enabled) and reads back what it
pushed, on Feast's own example (`feast init`, Feast 0.67 in a venv of its own; imported with
`materialize import-feast`, written first by this project's job: tests/support/feast_example.py).

Feast's client, its online store `{type: remote}`, sends `FeatureStore.push` and
`write_to_online_store` alike as POST /write-to-online-store, one per feature view the push
source feeds (it finds those in its own registry); POST /push, which names the push source
and which the import maps to the view's `push_source`, is what other clients send: it is
posted here directly, in the body Feast's feature server takes.

The values pushed are read back through Feast's SDK, and raw from Redis (each field decoded
as the format says) and PostgreSQL (the source's JSONB row), with each row's event time,
floored to the second, as its as-of time; a push older than what is stored changes nothing;
a push Feast's client sends but the server refuses raises in Feast's client naming the row
and column, and writes none of its rows.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass

import pytest
import redis

from feature_defs import Definitions
from fm_config import RunConf
from serializers import decode
from serializers.batch import feature_specs
from serializers.keys import freshness_field, key_prefix, redis_key
from throwaway.servers import PostgresServer

from .support.feast_example import (
    FEATURES,
    OUR_DB,
    FeastSdk,
    as_compared,
    feast,
    imported_example,
    materialize_ours,
    our_conf,
    remote_client,
    serve_ours,
)
from .support.serving import Served

pytestmark = pytest.mark.install  # Feast runs from a venv of its own

FRESH, BATCH = "driver_hourly_stats_fresh", "driver_hourly_stats"
PUSH_SOURCE = "driver_stats_push_source"
MATERIALIZED = 1001  # a driver of the example's data: the run wrote it before the pushes
NONE = 2999  # no such driver


@dataclass
class Setup:
    conf: RunConf
    defs: Definitions
    server: Served
    sdk: FeastSdk
    redis_db: redis.Redis
    """The run's Redis database (OUR_DB)."""
    pg_server: PostgresServer


@pytest.fixture(scope="module")
def setup(tmp_path_factory, spark, redis_server, pg_server):
    """Feast's example imported and written by this project's job, `feast apply`'d (the
    registry Feast's client reads), served with pushes on; Feast's SDK in a process of its own
    whose online store is that server."""
    root = tmp_path_factory.mktemp("push-feast")
    client = root / "client"
    client.mkdir()
    sdk = FeastSdk(client, root / "feast-sdk.log")  # Feast's import runs while the rest is made
    server = None
    try:
        repo, defs_dir, defs = imported_example(root)
        assert defs.sources[FRESH].push_source == PUSH_SOURCE  # the import maps Feast's PushSource (no stop-gap here)
        assert defs.sources[BATCH].push_source is None
        feast(repo, "apply")
        conf = our_conf(root, defs_dir, redis_server, pg_server)
        materialize_ours(spark, conf, defs, redis_server, pg_server)
        server = serve_ours(conf, root, server={"push": {"enabled": True}})
        remote_client(repo, server.port, client)
        yield Setup(conf, defs, server, sdk, redis_server.client(OUR_DB), pg_server)
    finally:
        sdk.stop()
        if server is not None:
            server.stop()


def rows(when: dt.datetime, drivers: dict[int, dict]) -> dict[str, list]:
    """A push's columns as Feast's example's test_workflow.py builds its frame: driver_id, event
    time and created time, each feature; every row at ``when``."""
    ids = list(drivers)
    return {
        "driver_id": ids,
        "event_timestamp": [when.isoformat()] * len(ids),
        "created": [when.isoformat()] * len(ids),
        **{f: [drivers[d][f] for d in ids] for f in FEATURES},
    }


def values(conv: float, acc: float, trips: int, vehicle: str, zones: list[str], name: str) -> dict:
    return {
        "conv_rate": conv,
        "acc_rate": acc,
        "avg_daily_trips": trips,
        "driver_metadata": {"vehicle_type": vehicle, "rating": "4.5"},  # one set of keys: Feast's client fills a key a row lacks with null
        "driver_config": json.dumps({"max_distance_km": trips, "preferred_zones": zones}),  # Json: JSON text
        "driver_profile": {"name": name, "age": str(trips % 60)},
    }


def compared(value_of: dict) -> dict:
    """A driver's values as compared (float32 as float32, Json text parsed)."""
    return {f: as_compared(f, [value_of[f]])[0] for f in FEATURES}


def read_back(s: Setup, drivers: list[int]) -> dict[int, dict]:
    """What Feast's SDK reads for ``drivers`` through `materialize serve`, as compared (None: no value)."""
    got = s.sdk.ask({"op": "read", "features": [f"{FRESH}:{f}" for f in FEATURES], "entity_rows": [{"driver_id": d} for d in drivers]})
    assert "ok" in got, got
    table = got["ok"]
    assert table["driver_id"] == drivers
    out = {}
    for i, d in enumerate(drivers):
        row = {f: table[f"{FRESH}__{f}"][i] for f in FEATURES}
        out[d] = None if all(v is None for v in row.values()) else compared(row)
    return out


def redis_hash(s: Setup, driver: int) -> dict[bytes, bytes]:
    entity = s.defs.entities[s.defs.sources[FRESH].entity]
    return s.redis_db.hgetall(redis_key(key_prefix(entity.prefix, s.conf.redis.namespace), str(driver)))


def sql_row(s: Setup, driver: int, source: str = FRESH) -> tuple[dict, dt.datetime] | None:
    table = s.defs.entities[s.defs.sources[source].entity].sql_table
    with s.pg_server.connect() as conn:
        return conn.execute(
            f"SELECT features, as_of FROM {table} WHERE entity_key = %s AND source = %s", (str(driver), source)
        ).fetchone()  # fmt: skip


def stored(s: Setup, driver: int) -> dict[str, tuple[dict, int]]:
    """The source's values of ``driver`` and their as-of time, per store: Redis's hash fields
    decoded (field id: xxh32 of the stored name) and its freshness field; the SQL row's JSONB
    (keyed by stored name) and as_of."""
    specs = feature_specs(s.defs.sources[FRESH].features)
    fields = redis_hash(s, driver)
    redis_values = {f.name: decode(f.type, fields[f.field], **f.options) for f in specs if f.field in fields}
    as_of = fields.get(freshness_field(FRESH))
    features, sql_as_of = sql_row(s, driver)
    sql_values = {f.name: features[f.stored_name] for f in specs if f.stored_name in features}
    return {
        "redis": (compared(redis_values) if redis_values.keys() == set(FEATURES) else redis_values, int(as_of) if as_of else None),
        "sql": (compared(sql_values) if sql_values.keys() == set(FEATURES) else sql_values, int(sql_as_of.timestamp())),
    }


def raw(s: Setup, drivers: list[int]) -> dict:
    """Everything stored of ``drivers``, byte for byte: each hash whole, each SQL row of either view."""
    return {d: (redis_hash(s, d), sql_row(s, d, FRESH), sql_row(s, d, BATCH)) for d in drivers}


def test_feasts_sdk_pushes_and_reads_back_what_it_pushed(setup):
    s = setup
    now = dt.datetime.now(dt.UTC)  # with its microseconds: the as-of time is the event time's second
    pushed = {
        MATERIALIZED: values(0.125, 0.5, 111, "truck", ["north"], "driver_1001_pushed"),
        2001: values(0.375, 0.25, 222, "van", ["south", "east"], "driver_2001"),
        2002: values(0.3, 0.7, 333, "bike", ["east"], "driver_2002"),  # 0.3 and 0.7: not exact in float32
    }
    written = {2003: values(0.625, 0.875, 444, "car", ["west"], "driver_2003")}
    posted = {2004: values(0.0625, 0.1, 555, "scooter", ["centre"], "driver_2004")}
    at = {d: now for d in pushed} | {2003: now - dt.timedelta(seconds=5), 2004: now - dt.timedelta(seconds=7)}
    expected = {d: compared(v) for d, v in (pushed | written | posted).items()}
    batch_row = sql_row(s, MATERIALIZED, BATCH)  # the other view's SQL row of the materialized driver
    batch_fields = {spec.field for spec in feature_specs(s.defs.sources[BATCH].features)} | {freshness_field(BATCH)}
    batch_before = {k: v for k, v in redis_hash(s, MATERIALIZED).items() if k in batch_fields}
    assert len(batch_before) == len(FEATURES) + 1  # the run wrote the other view's features into the same hash
    assert stored(s, MATERIALIZED)["redis"][1] < math.floor(now.timestamp())  # the run's row: older than the push

    # Feast's SDK: push to the push source (its client writes every view the push source feeds), and write one view
    assert s.sdk.ask({"op": "push", "push_source_name": PUSH_SOURCE, "df": rows(now, pushed), "to": "online"}) == {"ok": True}
    assert s.sdk.ask({"op": "write", "feature_view_name": FRESH, "df": rows(at[2003], written)}) == {"ok": True}
    # POST /push names the push source, in the body Feast's feature server takes (the time as Feast's remote store sends it)
    body = rows(at[2004].replace(tzinfo=None), posted)
    body["driver_metadata"] = [json.dumps(v) for v in body["driver_metadata"]]
    body["driver_profile"] = [json.dumps(v) for v in body["driver_profile"]]
    status, answer = s.server.request("POST", "/push", json.dumps({"push_source_name": PUSH_SOURCE, "df": body, "to": "online"}).encode())
    assert status == 200, answer
    once = {"written": 1, "kept_newer": 0, "replaced_future": 0}
    assert json.loads(answer) == {"status": "ok", "rows": 1, "written": {FRESH: {"redis": once, "sql": once}}}

    # read back through Feast's SDK: exactly the values pushed
    drivers = [*expected, NONE]
    assert read_back(s, drivers) == {**expected, NONE: None}

    # raw: Redis's hash fields and the SQL row hold the values pushed, as of each row's event time (whole seconds)
    for d, want in expected.items():
        as_of = math.floor(at[d].timestamp())
        assert stored(s, d) == {"redis": (want, as_of), "sql": (want, as_of)}, d
    # the other view's values of the materialized driver untouched, in its hash and its SQL row
    assert {k: v for k, v in redis_hash(s, MATERIALIZED).items() if k in batch_fields} == batch_before
    assert sql_row(s, MATERIALIZED, BATCH) == batch_row

    # a push older than what is stored changes nothing, in either store (its event time: after the run's rows, before the push's)
    before = raw(s, [MATERIALIZED, 2001])
    older = {d: values(0.875, 0.875, 999, "old", ["old"], "old") for d in (MATERIALIZED, 2001)}
    assert s.sdk.ask({"op": "push", "push_source_name": PUSH_SOURCE, "df": rows(now - dt.timedelta(minutes=10), older)}) == {"ok": True}
    assert raw(s, [MATERIALIZED, 2001]) == before
    assert read_back(s, [MATERIALIZED, 2001]) == {d: expected[d] for d in (MATERIALIZED, 2001)}


def test_a_push_the_server_refuses_raises_in_feasts_client_naming_row_and_column_and_writes_nothing(setup):
    s = setup
    now = dt.datetime.now(dt.UTC)
    good = values(0.125, 0.25, 7, "truck", ["north"], "good")
    drivers = [2008, 2009]
    nan_json = dict(good, driver_config='{"max_distance_km": NaN}')  # Python's json (Feast's check) takes NaN; JSON has none

    def refused(df: dict) -> dict:
        got = s.sdk.ask({"op": "push", "push_source_name": PUSH_SOURCE, "df": df})
        assert "error" in got, got
        return got

    # a JSON feature's text holding NaN, in the second row: refused by the server (400), raised by Feast's client
    got = refused(rows(now, {2008: good, 2009: nan_json}))
    assert got["error"] == "RuntimeError", got  # Feast's remote store: the answer is not 200
    assert "Error_code=400" in got["message"] and "row 1, column 'driver_config'" in got["message"], got
    # an event time past tomorrow in the second row
    late = rows(now, {2008: good, 2009: good})
    late["event_timestamp"][1] = dt.datetime(2099, 1, 1, tzinfo=dt.UTC).isoformat()
    got = refused(late)
    assert got["error"] == "RuntimeError" and "Error_code=400" in got["message"], got
    assert "row 1, column 'event_timestamp'" in got["message"] and "server.push.clock_skew_seconds" in got["message"], got
    # a string in conv_rate: Feast's own client refuses it before sending (its conversion to Float32 fails)
    text = rows(now, {2008: good, 2009: good})
    text["conv_rate"][1] = "fast"
    got = refused(text)
    assert "conv_rate" in got["message"] or "fast" in got["message"], got

    # none of the rows of any of them written, in either store
    assert raw(s, drivers) == {d: ({}, None, None) for d in drivers}
    assert read_back(s, drivers) == {d: None for d in drivers}

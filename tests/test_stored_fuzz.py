"""Stored data no writer wrote, read back: random bytes in Redis hash fields (features and
freshness fields) and random JSON and as-of times in the SQL store's rows. Every read must
answer, each cell as the reference decoder (serializers.decode) and the format's rules say:
a value that does not decode costs its own cell (INVALID), an unusable freshness value or
as-of time costs its entity's source (INVALID, counted in ``bad_freshness``), every other
cell reads as stored. Seeded, so every run sees the same data.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import random
import signal
import subprocess

import numpy as np
import pytest

from feature_reader import AsyncFeatureReader, FeatureReader
from serializers import DecodeError, decode, encode, field_id, freshness_field
from serializers.keys import redis_key

from .support.confs import env_conf
from .support.every_type import AS_OF, EXPECTED
from .support.reader_sample import write_sample_into
from .support.serving import MATERIALIZE, serve, server_settings

NOW = AS_OF + 60
MAX_AS_OF = int(dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp())
MIN_AS_OF = int(dt.datetime(1, 1, 1, tzinfo=dt.UTC).timestamp())
HORIZON = int(dt.datetime.combine(dt.datetime.fromtimestamp(NOW + 300, dt.UTC).date() + dt.timedelta(2), dt.time(), dt.UTC).timestamp())
"""The latest as-of time a store may hold at NOW (that of tomorrow's date, clocks 300 s apart): later is corrupt."""
FLT_MAX = float(np.finfo(np.float32).max)
CONSUMERS = [1, 2, 3, 4]
PAIRS = [("eu", 7), ("us", 7), ("eu", 8)]
DEEP = "[" * 2000 + "]" * 2000
"""JSON nested deeper than Python's parser goes by default."""
FRESHNESS = [
    b"99999999999999", str(AS_OF * 1000).encode(), str(AS_OF).encode(), b"-1", b"", b"0", b"253402300799", b"253402300800",
    b"-62135596800", b"-62135596801", b"1.7e9", b" 1700000000", b"1_700_000_000", b"+1700000000", "١٧٠٠".encode(), b"9" * 40,
    b"0x10", b"\xff\xfe", str(AS_OF - 10).encode(), b"-0", str(HORIZON).encode(), str(HORIZON + 1).encode(),
]  # fmt: skip
NUMBERISH = [b"1e999", b"-0", b"+1", b" 1", b"1_0", b"nan", b"inf", b"-inf", b"9" * 30, b"9" * 5000, b"0x10", b"1.", b".", b"-",
             b"e5", b"3.4e38", b"3.5e38", b"1" * 400, b"true", b"1", b"0", b"\x00", b"00"]  # fmt: skip
AS_OF_SQL = [  # (timestamptz literal, epoch seconds; None: unusable)
    ("infinity", None), ("-infinity", None), ("294276-12-31 23:59:59+00", None), ("10000-01-01 00:00:00+00", None),
    ("9999-12-31 23:59:59+00", None), ("0001-01-01 00:00:00+00", MIN_AS_OF), ("0002-01-01 00:00:00+00 BC", None),  # 9999: past the horizon
    ("1970-01-01 00:00:00+00", 0), (dt.datetime.fromtimestamp(AS_OF - 100, dt.UTC).isoformat(), AS_OF - 100),
    (dt.datetime.fromtimestamp(HORIZON, dt.UTC).isoformat(), HORIZON), (dt.datetime.fromtimestamp(HORIZON + 1, dt.UTC).isoformat(), None),
]  # fmt: skip


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory, redis_server, pg_server):
    return write_sample_into(spark, tmp_path_factory, redis_server, pg_server, 6, "stored-fuzz")


def _stored_as_of(raw: bytes | None):
    """The reference for a freshness value: decimal epoch seconds within years 1..9999 (None: not stored; "bad")."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    digits = text[1:] if text.startswith("-") else text
    if not digits or not all(c in "0123456789" for c in digits) or len(digits) > 12:
        return "bad"
    value = int(text)
    return value if MIN_AS_OF <= value <= min(MAX_AS_OF, HORIZON) else "bad"


def _bytes_cell(feature, raw):
    if raw is None:
        return "NULL_VALUE", None
    try:
        return "PRESENT", decode(feature.type, raw, **feature.options)
    except DecodeError:
        return "INVALID", None


def _json_cell(feature, value):
    """The format's rules for a JSON map value (FORMAT.md): the feature's type, finite, within its range."""
    kind = feature.type
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    in64 = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    if value is None:
        return "NULL_VALUE", None
    if kind == "float":
        try:
            x = float(value) if number else math.nan
        except OverflowError:
            return "INVALID", None
        ok = math.isfinite(x) and (feature.precision != "float32" or abs(x) <= FLT_MAX)
        return ("PRESENT", x) if ok else ("INVALID", None)
    if kind == "int":
        return ("PRESENT", value) if in64 else ("INVALID", None)
    if kind == "bool":
        return ("PRESENT", value) if isinstance(value, bool) else ("INVALID", None)
    if kind == "string":
        return ("PRESENT", value) if isinstance(value, str) else ("INVALID", None)
    if not isinstance(value, list):
        return "INVALID", None
    if kind == "embedding":
        if len(value) != feature.dimension or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return "INVALID", None
        try:
            with np.errstate(over="ignore"):
                arr = np.asarray([float(v) for v in value]).astype(np.float32)
        except OverflowError:
            return "INVALID", None
        return ("PRESENT", arr) if np.isfinite(arr).all() else ("INVALID", None)
    if kind == "int_list":
        ok = all(isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 for v in value)
    else:
        ok = all(isinstance(v, str) for v in value)
    return ("PRESENT", value) if ok else ("INVALID", None)


def _same(feature, got, want) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if feature.type == "embedding":
        return np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    if feature.type == "float" and feature.precision == "float32":
        return np.float32(got) == np.float32(want)
    return got == want and type(got) is type(want)


def _random_bytes(rng: random.Random, feature) -> bytes:
    kind = rng.random()
    if kind < 0.25:
        return rng.randbytes(rng.randrange(0, 40))
    if kind < 0.45:
        return rng.choice(NUMBERISH)
    if kind < 0.55:
        return rng.choice(FRESHNESS)
    good = {
        "float": rng.choice([0.5, -1e-300, 1e308, 3.4e38]), "int": rng.choice([0, -(2**63), 2**63 - 1]), "bool": rng.random() < 0.5,
        "string": rng.choice(["", "x" * 100, "日本"]), "embedding": [rng.uniform(-1, 1) for _ in range(4)],
        "int_list": [rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(0, 5))], "string_list": ["a", "é"],
    }  # fmt: skip
    other = rng.choice(list(good))
    options = {"embedding": {"dimension": 4}, "int_list": {"compression": rng.choice(["snappy", "none"])},
               "string_list": {"compression": rng.choice(["snappy", "none"])}}.get(other, {})  # fmt: skip
    raw = encode(other, good[other], **options) or b""
    if kind < 0.8 or not raw:
        return raw
    at = rng.randrange(len(raw))
    cut = rng.random()
    if cut < 0.4:
        return raw[:at]
    if cut < 0.8:
        return raw[:at] + bytes([raw[at] ^ (1 << rng.randrange(8))]) + raw[at + 1 :]
    return raw + rng.randbytes(rng.randrange(1, 5))


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(12)
    if kind == 0:
        return rng.choice([2**63, -(2**63) - 1, 10**400, 2**1030, -(2**64)])
    if kind == 1:
        return rng.choice([1e308, -0.0, 3.4028235e38, 3.5e38, 1e-320, 0.1])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.choice(["", "日本", "\u0001x", "a" * 300])
    if kind == 4:
        return [rng.choice([0.5, 1, 2**70, 10**400, 1e39, -3.4e38, True, "1"]) for _ in range(rng.choice([3, 4, 4, 5]))]
    if kind == 5:
        return [rng.choice([1, -(2**63), 2**63, 0, 127]) for _ in range(rng.randrange(0, 4))]
    if kind == 6:
        return [rng.choice(["a", "", 1, None]) for _ in range(rng.randrange(0, 3))]
    if kind == 7 and depth < 2:
        return {"k": _random_json(rng, depth + 1)}
    if kind == 8:
        return DEEP
    return rng.randrange(-(2**40), 2**40)


def _json_text(rng: random.Random) -> str:
    value = _random_json(rng)
    return value if value is DEEP else json.dumps(value)


def _sample_defs(conf):
    from feature_defs import load_definitions

    return load_definitions(conf.definitions_dir)


def _redis_expectation(client, defs, prefixes) -> dict:
    """(source, entity row, feature) -> (status, value) from the stored hashes, by the reference decoder."""
    out = {}
    for source, entities in (("every_type", [(c,) for c in CONSUMERS]), ("pair_daily", PAIRS)):
        src = defs.sources[source]
        for row, parts in enumerate(entities):
            stored = client.hgetall(redis_key(prefixes[source], ":".join(map(str, parts))))
            as_of = _stored_as_of(stored.get(freshness_field(source)))
            for f in src.features:
                if as_of is None:
                    cell = ("NOT_FOUND", None)
                elif as_of == "bad":
                    cell = ("INVALID", None)
                elif src.max_age_seconds is not None and NOW - as_of > src.max_age_seconds:
                    cell = ("OUTSIDE_MAX_AGE", None)
                else:
                    cell = _bytes_cell(f, stored.get(field_id(f.name)))
                out[(source, row, f.name)] = (*cell, None if as_of in (None, "bad") else as_of)
    return out


def _sql_expectation(conn, defs) -> dict:
    out = {}
    tables = {"every_type": ("consumer_features", [(c,) for c in CONSUMERS]), "pair_daily": ("pair_features", PAIRS)}
    for source, (table, entities) in tables.items():
        src = defs.sources[source]
        rows = dict(conn.execute(f"SELECT entity_key, features::text FROM {table} WHERE source = %s", (source,)).fetchall())
        stamps = dict(conn.execute(f"SELECT entity_key, as_of::text FROM {table} WHERE source = %s", (source,)).fetchall())
        for row, parts in enumerate(entities):
            key = ":".join(map(str, parts))
            text = rows.get(key)
            as_of = None if text is None else _sql_as_of(stamps[key])
            try:
                doc = None if text is None else json.loads(text)
            except RecursionError:
                doc = None
            for f in src.features:
                if text is None:
                    cell = ("NOT_FOUND", None)
                elif as_of == "bad":
                    cell = ("INVALID", None)
                elif src.max_age_seconds is not None and NOW - as_of > src.max_age_seconds:
                    cell = ("OUTSIDE_MAX_AGE", None)
                elif not isinstance(doc, dict):
                    cell = ("INVALID", None)
                else:
                    cell = _json_cell(f, doc.get(f.name))
                out[(source, row, f.name)] = (*cell, None if as_of in (None, "bad") else as_of)
    return out


def _sql_as_of(text: str):
    for literal, epoch in AS_OF_SQL:
        if text == _PG_TEXT.get(literal):
            return "bad" if epoch is None else epoch
    raise AssertionError(f"an as-of time this test did not write: {text}")


_PG_TEXT: dict[str, str] = {}
GET_BODY = b'{"features": ["every_type:n"], "entities": {"consumer_id": [1, 2, 3]}}'


def _check(result_every, result_pair, expected: dict, defs, where: str) -> int:
    """Every cell as expected; the number of (source, entity) whose freshness is unusable."""
    bad = 0
    for source, result, rows in (("every_type", result_every, len(CONSUMERS)), ("pair_daily", result_pair, len(PAIRS))):
        for f in defs.sources[source].features:
            col = result.column(f.name)
            for row in range(rows):
                status, value, as_of = expected[(source, row, f.name)]
                assert col.statuses[row] == status, (where, source, row, f.name, col.statuses[row], col.values[row])
                assert _same(f, col.values[row], value), (where, source, row, f.name, col.values[row], value)
                assert col.event_timestamps[row] == as_of, (where, source, row, f.name)
        first = defs.sources[source].features[0].name
        bad += sum(expected[(source, row, first)][0] == "INVALID" and expected[(source, row, first)][2] is None for row in range(rows))
    return bad


def _read(reader, store: str):
    every = reader.get_online_features(["every_type"], {"consumer_id": CONSUMERS}, store=store)
    pair = reader.get_online_features(["pair_daily"], {"region": [r for r, _ in PAIRS], "store_id": [s for _, s in PAIRS]}, store=store)
    return every, pair


def _read_async(conf, defs, store: str):
    async def run():
        async with AsyncFeatureReader(conf, defs, cache=False, clock=lambda: NOW) as reader:
            every = await reader.get_online_features(["every_type"], {"consumer_id": CONSUMERS}, store=store)
            pair = await reader.get_online_features(
                ["pair_daily"], {"region": [r for r, _ in PAIRS], "store_id": [s for _, s in PAIRS]}, store=store
            )
            return every, pair

    return asyncio.run(run())


def _redis_keys(defs, conf) -> dict[str, str]:
    from serializers.keys import key_prefix

    return {s: key_prefix(defs.entities[defs.sources[s].entity].prefix, conf.redis.namespace) for s in ("every_type", "pair_daily")}


@contextlib.contextmanager
def _restoring(restore, *args):
    """The stored data as written again when the block ends, failed or not (the next test reads it)."""
    try:
        yield
    finally:
        restore(*args)


def _restore_redis(client, kept: dict) -> None:
    for k, stored in kept.items():
        client.delete(k)
        client.hset(k, mapping=stored)


def _restore_sql(conn, kept: dict) -> None:
    for t, rows in kept.items():
        for key, source, features, as_of in rows:
            conn.execute(
                f"UPDATE {t} SET features = %s::jsonb, as_of = %s WHERE entity_key = %s AND source = %s", (features, as_of, key, source)
            )


def test_random_bytes_in_redis_fields_cost_only_their_cell_or_their_source(written, redis_server):
    conf, defs = written
    client = redis_server.client(6)
    prefixes = _redis_keys(defs, conf)
    hashes = [redis_key(prefixes["every_type"], str(c)) for c in CONSUMERS[:3]] + [
        redis_key(prefixes["pair_daily"], f"{r}:{s}") for r, s in PAIRS[:2]
    ]
    kept = {k: client.hgetall(k) for k in hashes}
    assert all(kept.values())
    fields = {  # per hash: its source's freshness field and feature fields
        k: [(freshness_field(s), None)] + [(field_id(f.name), f) for f in defs.sources[s].features]
        for k, s in zip(hashes, ["every_type"] * 3 + ["pair_daily"] * 2)
    }
    rng = random.Random(38)
    bad_sources = 0
    with _restoring(_restore_redis, client, kept), FeatureReader(conf, defs, cache=False, clock=lambda: NOW) as reader:
        # the data as written reads as written first (the expectation of test_reader, derived independently)
        every, _ = _read(reader, "redis")
        for name, (_, statuses) in EXPECTED.items():
            assert every.column(name).statuses == statuses
        for round_ in range(150):
            _restore_redis(client, kept)
            for _ in range(rng.randrange(1, 6)):
                k = rng.choice(hashes)
                field, feature = rng.choice(fields[k])
                if rng.random() < 0.1:
                    client.hdel(k, field)
                elif feature is None:
                    client.hset(k, field, rng.choice(FRESHNESS) if rng.random() < 0.8 else rng.randbytes(rng.randrange(0, 16)))
                else:
                    client.hset(k, field, _random_bytes(rng, feature))
            expected = _redis_expectation(client, defs, prefixes)
            bad_sources += _check(*_read(reader, "redis"), expected, defs, f"redis round {round_}")
            if round_ % 10 == 0:
                _check(*_read_async(conf, defs, "redis"), expected, defs, f"async redis round {round_}")
        assert bad_sources > 20  # the rounds did plant unusable freshness values
        assert reader.stats["bad_freshness"] == bad_sources
        assert reader.stats["decode_errors"] > 100


def test_random_json_and_as_of_times_in_sql_rows_cost_only_their_cell_or_their_source(written, pg_server):
    conf, defs = written
    rng = random.Random(83)
    with pg_server.connect() as conn:
        conn.autocommit = True
        for literal, _ in AS_OF_SQL:
            _PG_TEXT[literal] = conn.execute("SELECT %s::timestamptz::text", (literal,)).fetchone()[0]
        tables = [("consumer_features", "every_type"), ("pair_features", "pair_daily")]
        kept = {t: conn.execute(f"SELECT entity_key, source, features::text, as_of FROM {t}").fetchall() for t, _ in tables}
        assert all(kept.values())
        # every as-of time the test may write is one it can name: the rows as written read as the job's as-of time
        _PG_TEXT.setdefault(
            "written", conn.execute("SELECT %s::timestamptz::text", (dt.datetime.fromtimestamp(AS_OF, dt.UTC),)).fetchone()[0]
        )
        AS_OF_SQL.append(("written", AS_OF))
        bad_sources = 0
        with _restoring(_restore_sql, conn, kept), FeatureReader(conf, defs, cache=False, clock=lambda: NOW) as reader:
            for round_ in range(120):
                _restore_sql(conn, kept)
                if round_ == 0:  # edges planted for sure: an int beyond float64 in an embedding, a map nested too deep
                    set_value = "UPDATE consumer_features SET features = jsonb_set(features, %s, %s::jsonb) WHERE entity_key = %s"
                    conn.execute(set_value, (["e"], json.dumps([10**400, 1, 1, 1]), "1"))
                    conn.execute(set_value, (["sl"], DEEP, "2"))
                for _ in range(rng.randrange(1, 5)):
                    t, source = rng.choice(tables)
                    key = rng.choice(kept[t])[0]
                    what = rng.random()
                    if what < 0.2:
                        conn.execute(f"UPDATE {t} SET as_of = %s::timestamptz WHERE entity_key = %s", (rng.choice(AS_OF_SQL[:-1])[0], key))
                    elif what < 0.3:
                        conn.execute(f"UPDATE {t} SET features = %s::jsonb WHERE entity_key = %s", (_json_text(rng), key))
                    else:
                        name = rng.choice(defs.sources[source].features).name
                        conn.execute(
                            f"UPDATE {t} SET features = jsonb_set(features, %s, %s::jsonb) WHERE entity_key = %s AND jsonb_typeof(features) = 'object'",  # noqa: E501
                            ([name], _json_text(rng), key),
                        )
                expected = _sql_expectation(conn, defs)
                bad_sources += _check(*_read(reader, "sql"), expected, defs, f"sql round {round_}")
                if round_ % 10 == 0:
                    _check(*_read_async(conf, defs, "sql"), expected, defs, f"async sql round {round_}")
            assert bad_sources > 10
            assert reader.stats["bad_freshness"] == bad_sources


def test_the_server_and_the_get_command_answer_over_unusable_stored_data(written, redis_server, pg_server, tmp_path):
    """Freshness past year 9999 (and in milliseconds), a field of random bytes, an as-of time of
    infinity: `materialize serve` answers 200 with the other cells right and counts them in
    /metrics; `materialize get` prints the body, no traceback."""
    conf, defs = written
    client = redis_server.client(6)
    prefixes = _redis_keys(defs, conf)
    client.hset(redis_key(prefixes["every_type"], "1"), freshness_field("every_type"), b"99999999999999")
    client.hset(redis_key(prefixes["every_type"], "2"), field_id("n"), b"\xff\x00junk")
    client.hset(redis_key(prefixes["pair_daily"], "eu:7"), freshness_field("pair_daily"), str(AS_OF * 1000).encode())
    with pg_server.connect() as conn:
        conn.execute("UPDATE consumer_features SET as_of = 'infinity' WHERE entity_key = '3'")
        conn.commit()
    server = serve(tmp_path, "t", server_settings(conf))
    try:
        status, body = server.post({"features": ["every_type:n", "every_type:s"], "entities": {"consumer_id": [1, 2, 3, 4]}})
        assert status == 200, body
        n, s = json.loads(body)["results"][1:]
        # 1: its freshness is unusable; 2: n does not decode; 3: as written; 4: never written (SQL: its as-of is infinity)
        assert n["statuses"] == ["INVALID", "INVALID", "PRESENT", "NOT_FOUND"] and n["values"][2] == -5
        assert s["statuses"] == ["INVALID", "NULL_VALUE", "PRESENT", "NOT_FOUND"] and s["values"][2] == ""
        assert n["event_timestamps"][0] == "1970-01-01T00:00:00Z" and n["event_timestamps"][2] != n["event_timestamps"][0]
        status, body = server.post({"features": ["pair_daily:score"], "entities": {"region": ["eu", "us"], "store_id": [7, 7]}})
        assert status == 200, body
        score = json.loads(body)["results"][2]
        assert score["statuses"] == ["INVALID", "OUTSIDE_MAX_AGE"]  # the server's clock: the written day is past max_age
        metrics = server.request("GET", "/metrics")[1].decode()
        counters = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("feature_reader_")}
        assert counters["feature_reader_bad_freshness_total"] == 2 and counters["feature_reader_decode_errors_total"] == 1
        # the cache's gauges: consumers 1-4 and the two pairs, each entry counting at least its bookkeeping
        assert counters["feature_reader_cache_entries"] == 6 and counters["feature_reader_cache_bytes"] > 6 * 240
    finally:
        assert server.stop() == -signal.SIGTERM
    assert "Traceback" not in server.log.read_text()
    folder = env_conf(tmp_path / "get-conf", "g", json.dumps(server_settings(conf)))
    for store in ("redis", "sql"):
        done = subprocess.run(
            [MATERIALIZE, "get", "--env", "g", "--store", store], input=GET_BODY,
            capture_output=True, env={**os.environ, "FM_CONF_DIR": str(folder)}, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
        statuses = json.loads(done.stdout)["results"][1]["statuses"]
        assert statuses == (["INVALID", "INVALID", "PRESENT"] if store == "redis" else ["PRESENT", "NULL_VALUE", "INVALID"]), store

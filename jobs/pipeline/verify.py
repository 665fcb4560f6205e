"""Post-write verification: read a random sample of entities back from each store,
decode it with the serializers, and compare it with the rows that were to be written."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import replace
from typing import Any

import numpy as np
from psycopg import sql
from pyspark.sql import DataFrame

from feature_defs import FeatureDef, SourceDef
from jobs.pipeline.context import RunContext
from jobs.pipeline.gate.checks import VerificationError
from jobs.pipeline.report.summary import RunSummary
from serializers import decode, field_id, json_value
from serializers.batch import AS_OF_US
from serializers.keys import freshness_field_name, redis_key, subsecond_field_name
from serializers.scalar import DecodeError
from sinks.redis.config import RedisSinkConfig
from sinks.redis.preflight import detect_cluster
from sinks.redis.router import KeyRouter
from sinks.sql.config import SqlSinkConfig, sql_sink_config
from stores.sql import connect as sql_connect

MAX_LISTED = 50
"""Mismatches kept in the report (all are counted)."""


def sample_rows(good: DataFrame, n: int, total: int, seed: int = 29) -> list[dict[str, Any]]:
    """About ``n`` random rows of the written snapshot (_id and features), on the driver."""
    if n <= 0 or total <= 0:
        return []
    fraction = min(1.0, 2.0 * n / total)
    return [r.asDict() for r in good.sample(fraction=fraction, seed=seed).limit(n).collect()]


def is_written(feature: FeatureDef, value: Any) -> bool:
    """Null features and NaN/inf floats are not written to any store."""
    if value is None:
        return False
    return not (feature.type == "float" and not math.isfinite(float(value)))


def same_value(feature: FeatureDef, found: Any, expected: Any) -> bool:
    """Equal in value and in JSON/decoded type (a stored 3.7 is not the int 3, "0.5" not 0.5)."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    if feature.type == "float":
        if not number(found):
            return False
        if feature.precision == "float32":
            return bool(np.float32(found) == np.float32(expected))
        return float(found) == float(expected)
    if feature.type == "int":
        return isinstance(found, int) and not isinstance(found, bool) and found == int(expected)
    if feature.type == "bool":
        return isinstance(found, bool) and found == bool(expected)
    if feature.type == "string":
        return isinstance(found, str) and found == expected
    if feature.type == "json":  # expected: the canonical text written; found: the value read back, written again
        try:
            return json_value.canonical_value(found) == expected.encode("utf-8")
        except ValueError:
            return False
    if not isinstance(found, list):
        return False
    if feature.type == "embedding":
        return all(map(number, found)) and bool(np.array_equal(np.asarray(found, np.float32), np.asarray(expected, np.float32)))
    if feature.type == "int_list":
        return all(isinstance(v, int) and not isinstance(v, bool) for v in found) and found == list(expected)
    if feature.type == "float_list":  # the SQL store's JSON holds a whole number as an integer: equal as numbers
        width = np.float32 if feature.precision == "float32" else np.float64
        return all(map(number, found)) and bool(np.array_equal(np.asarray(found, width), np.asarray(expected, width)))
    return all(isinstance(v, str) for v in found) and found == list(expected)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Mismatches:
    def __init__(self, sink: str):
        self.sink = sink
        self.count = 0
        self.listed: list[dict[str, str]] = []
        self.newer = 0
        """Sampled entities holding a newer snapshot than the one written (left as they were)."""

    def add(self, key: str, feature: str, expected: Any, found: Any) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append({"sink": self.sink, "key": key, "feature": feature, "expected": _short(expected), "found": _short(found)})


def _compare(source: SourceDef, key: str, row: dict, found: dict[str, Any], out: Mismatches, decode_fn) -> None:
    for f in source.features:
        expected = row[f.name]
        raw = found.pop(f.name, None)
        if not is_written(f, expected):
            if raw is not None:
                out.add(key, f.name, None, raw)
            continue
        if raw is None:
            out.add(key, f.name, expected, None)
            continue
        try:
            value = decode_fn(f, raw)
        except (DecodeError, ValueError, TypeError) as exc:
            out.add(key, f.name, expected, f"undecodable {raw!r}: {exc}")
            continue
        if not same_value(f, value, expected):
            out.add(key, f.name, expected, value)


def _is_newer(stored: bytes | None, stored_us: bytes | None, as_of: int, micros: int) -> bool:
    """Whether the stored as-of time (freshness seconds, sub-second microseconds) is later than the row's."""
    try:
        return stored is not None and (int(stored), int(stored_us or 0)) > (as_of, micros)
    except ValueError:
        return False  # not a freshness value: reported as a mismatch


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _seconds(micros: int) -> int | float:
    return micros // 1_000_000 if micros % 1_000_000 == 0 else micros / 1_000_000


def _micros_past(row: dict, as_of: int) -> int:
    """The row's microseconds past its as-of second (event-time sources; 0 otherwise)."""
    return row[AS_OF_US] - as_of * 1_000_000 if row.get(AS_OF_US) is not None else 0


def verify_redis(conf: RedisSinkConfig, source: SourceDef, rows: list[dict]) -> Mismatches:
    out = Mismatches("redis")
    if not rows:
        return out
    router = KeyRouter(conf, conf.cluster)
    try:
        hashes = router.run([redis_key(conf.key_prefix, row["_id"]) for row in rows], lambda pipe, key: pipe.hgetall(key))
    finally:
        router.close()
    for row, stored in zip(rows, hashes):
        key = conf.key_prefix + row["_id"]
        as_of = str(row.get("_as_of") or conf.as_of).encode()  # range runs: the row's own date
        micros, stored_us = _micros_past(row, int(as_of)), stored.get(conf.subsecond_field) if conf.subsecond_field else None
        if _is_newer(stored.get(conf.freshness_field), stored_us, int(as_of), micros):
            out.newer += 1  # the write left it: nothing of this snapshot to compare
            continue
        if stored.get(conf.freshness_field) != as_of:
            out.add(key, freshness_field_name(source.name), as_of, stored.get(conf.freshness_field))
        if conf.subsecond_field and stored_us != (str(micros).encode() if micros else None):
            out.add(key, subsecond_field_name(source.name), micros or None, stored_us)
        by_name = {f.name: stored.get(field_id(f.stored_name)) for f in source.features}
        _compare(source, key, row, by_name, out, lambda f, raw: decode(f.type, raw, **f.options))
    return out


def verify_sql(conf: SqlSinkConfig, source: SourceDef, rows: list[dict]) -> Mismatches:
    out = Mismatches("sql")
    if not rows:
        return out
    query = sql.SQL("SELECT entity_key, features::text, as_of FROM {} WHERE source = %s AND entity_key = ANY(%s)").format(conf.table_id)
    with sql_connect(conf) as conn:
        stored = {k: (json.loads(doc), as_of) for k, doc, as_of in conn.execute(query, (conf.source, [r["_id"] for r in rows]))}
    for row in rows:
        key = row["_id"]
        if key not in stored:
            out.add(key, "(row)", "a row", None)
            continue
        features, as_of = stored[key]
        want = row.get("_as_of") or conf.as_of
        want_us, held_us = want * 1_000_000 + _micros_past(row, want), (as_of - _EPOCH) // dt.timedelta(microseconds=1)
        if held_us > want_us:
            out.newer += 1
            continue
        if held_us != want_us:
            out.add(key, "as_of", _seconds(want_us), _seconds(held_us))
        by_name = {f.name: features.pop(f.stored_name) for f in source.features if f.stored_name in features}
        _compare(source, key, row, by_name, out, lambda f, value: json_value.from_parsed(value) if f.type == "json" else value)
        for extra in features:  # what no defined feature is stored under
            out.add(key, extra, None, features[extra])
    return out


def verify_sample(ctx: RunContext, good: DataFrame, summary: RunSummary) -> list[dict[str, Any]]:
    """The rows to read back after the write (taken before it: the write of another source of
    the run holds Spark's task slots while it runs, and this small job would wait for it)."""
    return sample_rows(good, ctx.conf.quality.verify_sample, summary.entities)


def verify_writes(ctx: RunContext, rows: list[dict[str, Any]], summary: RunSummary) -> None:
    """Read ``rows`` (verify_sample) back from every store written; any difference fails the run."""
    conf, source, entity, date = ctx.conf, ctx.source, ctx.entity, ctx.date
    found = []
    if "redis" in summary.sinks:
        sink_conf = ctx.redis_config()
        found.append(verify_redis(replace(sink_conf, cluster=detect_cluster(conf.redis, sink_conf)), source, rows))
    if "sql" in summary.sinks:
        found.append(verify_sql(sql_sink_config(conf, source, entity, date, summary.sinks["sql"]["dialect"]), source, rows))
    for m in found:
        summary.verification[m.sink] = {"checked": len(rows), "newer": m.newer, "mismatches": m.count, "listed": m.listed}
    wrong = [m for m in found if m.count]
    if wrong:
        total = sum(m.count for m in wrong)
        raise VerificationError(
            f"source {source.name!r} {date}: {total:,} value(s) read back differ from the source "
            f"({', '.join(f'{m.sink}: {m.count:,}' for m in wrong)}); first: {wrong[0].listed[0]}"
        )

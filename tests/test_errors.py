"""Errors leave a partition as (kind, message) and come back as their classes; the writers'
stats rows have one schema per store, derived from the stats types."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
import redis

from sinks.base import RedisWriteStats, SqlWriteStats, stats_schema
from sinks.errors import CapacityError, SinkError, TerminalSinkError, TransientSinkError, from_wire, raise_first, to_wire
from sinks.redis.cluster import FailedOverUnreplicated
from sinks.redis.node import ChunkFailed, KeysEvicted, RedisRestarted


@pytest.mark.parametrize("error", [
    TransientSinkError("dropped"), TerminalSinkError("refused"), CapacityError("full"), ChunkFailed("chunk 3 failed", pending_from=3),
    RedisRestarted("restarted"), FailedOverUnreplicated("lost"), KeysEvicted("evicted"),
])  # fmt: skip
def test_every_sink_error_crosses_as_its_class(error):
    kind, message = to_wire(error)
    wire = pickle.loads(pickle.dumps((kind, message)))  # what a stats row carries: two strings
    rebuilt = from_wire(*wire)
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)
    assert isinstance(rebuilt, TransientSinkError) == isinstance(error, TransientSinkError)


def test_a_store_clients_own_error_is_terminal_and_an_unknown_kind_too():
    kind, message = to_wire(redis.ResponseError("NOPERM this user has no permissions to run the 'hset' command"), "Redis")
    assert (kind, message) == ("TerminalSinkError", "Redis: ResponseError: NOPERM this user has no permissions to run the 'hset' command")
    assert type(from_wire("SomethingNewer", "x")) is TerminalSinkError


def test_the_run_fails_as_the_first_terminal_error_else_the_first_transient_one():
    with pytest.raises(KeysEvicted, match=r"^2 writers failed; first: KeysEvicted: evicted$"):
        raise_first([ChunkFailed("chunk", 1), KeysEvicted("evicted")], "2 writers failed")
    with pytest.raises(ChunkFailed, match=r"^writers failed; first: ChunkFailed: chunk 1$") as info:
        raise_first([ChunkFailed("chunk 1", 1), RedisRestarted("restarted")], "writers failed")
    assert isinstance(info.value, TransientSinkError)  # a rerun (an Airflow retry) may succeed
    raise_first([], "nothing failed")  # no error: no raise
    assert issubclass(CapacityError, SinkError)


def test_stats_schemas_are_the_stats_types_fields():
    (_STATS_ARROW, STATS_SCHEMA), (_SQL_STATS_ARROW, SQL_STATS_SCHEMA) = stats_schema(RedisWriteStats), stats_schema(SqlWriteStats)
    redis_fields = ["entities", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries", "redirects",
                    "skipped_newer", "replaced_future", "unreachable", "peak_rss", "seconds", "stopped", "error_kind", "error"]  # fmt: skip
    assert _STATS_ARROW.names == redis_fields
    sql_fields = ["rows_upserted", "rows_skipped_newer", "rows_replaced_future", "expiry_followed", "duplicates", "statements",
                  "transactions", "retries", "reconnects",
                  "non_finite", "bytes_sent", "peak_rss", "seconds", "stopped", "error_kind", "error"]  # fmt: skip
    assert _SQL_STATS_ARROW.names == sql_fields
    for arrow, ddl in ((_STATS_ARROW, STATS_SCHEMA), (_SQL_STATS_ARROW, SQL_STATS_SCHEMA)):
        spark_names = {pa.int64(): "long", pa.float64(): "double", pa.string(): "string"}
        assert ddl == ", ".join(f"{f.name} {spark_names[f.type]}" for f in arrow)
    assert _STATS_ARROW.field("seconds").type == pa.float64() and _STATS_ARROW.field("error_kind").type == pa.string()

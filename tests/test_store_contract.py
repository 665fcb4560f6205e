"""The store contract: the same cases against every store's writer (Redis, Redis Cluster,
SQL), each through the one partition function (sinks/partition.py) as Spark runs it, on
real servers, with what the store holds read back raw and compared with values derived
here (the scalar encoder for Redis bytes, Python values for the SQL JSON).

A new store passes when it gets an adapter below and every case runs green.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

import pyarrow as pa
import pytest

from serializers.json_map import encode_json_maps
from sinks.base import Outcome
from sinks.errors import from_wire
from sinks.partition import partition_schema, write_partition
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import SqlSinkConfig
from sinks.sql.preflight import ensure_schema
from sinks.sql.writer import SqlWritePlan
from stores.errors import TerminalError, TransientError
from throwaway.cluster import start_cluster

from .expected import expected_hash, row_of
from .support.redis_sink import FRESH, SPECS, sink_config, things

T1, T2 = 1700000000, 1700086400
T2099 = 4102531200  # 2099-01-02T00:00:00Z: the as-of time of `run --date 2099-01-01`
N = 23
PASSWORD = "s3cret-contract-pw"


@dataclass
class Store:
    """One store as the contract sees it: how to plan a write, and what it holds."""

    name: str
    written: str
    """The stats column counting entities written."""
    skipped: str
    """The stats column counting entities left because the store holds a newer snapshot."""
    replaced: str
    """The stats column counting entities written over an as-of time beyond the horizon."""
    plan: object
    """plan(as_of, **config overrides) -> a write plan."""
    unreachable: object
    """A plan pointing at a port where nothing listens."""
    refused: object
    """A plan whose credentials the server refuses."""
    rows: object
    """rows(batch) -> the Arrow batch the store's writer takes (its Spark input)."""
    stored: object
    """stored(ids) -> {id: what the store holds}, read raw."""
    expected: object
    """expected(batch, row, as_of) -> what the store must hold for that entity."""


def _redis_expected(batch: pa.RecordBatch, row: int, as_of: int) -> dict:
    return expected_hash(SPECS, row_of(batch, row), FRESH, as_of)


def _redis_store(name: str, url: str, clients) -> Store:
    def plan(as_of: int, **overrides) -> RedisWritePlan:
        config = sink_config(url, as_of=as_of, cluster=name == "redis cluster")
        return RedisWritePlan(sink=replace(config, **overrides), features=tuple(SPECS))

    def stored(ids: list[str]) -> dict:
        return {i: clients(f"t:{i}".encode()).hgetall(f"t:{i}") for i in ids}

    return Store(
        name, "entities", "skipped_newer", "replaced_future", plan,
        unreachable=lambda: plan(T1, url="redis://127.0.0.1:1/0", retries=1, socket_timeout=1.0),
        refused=lambda: plan(T1, username="nobody", password=PASSWORD),
        rows=lambda batch: batch, stored=stored, expected=_redis_expected,
    )  # fmt: skip


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("contract-cluster"), primaries=3)
    yield cluster
    cluster.stop()


@pytest.fixture(params=["redis", "redis cluster", "sql"])
def store(request, redis_server, pg_server) -> Store:
    if request.param == "redis":
        client = redis_server.client()
        client.flushall()
        yield _redis_store("redis", redis_server.url, lambda key: client)
        client.close()
    elif request.param == "redis cluster":
        cluster = request.getfixturevalue("redis_cluster")
        for port in cluster.primaries():
            cluster.client(port).flushall()
        yield _redis_store("redis cluster", cluster.url, lambda key: cluster.client(cluster.owner_of(key)))
    else:
        with pg_server.connect() as conn:
            yield _sql_store(pg_server.dsn, conn)


def _sql_store(dsn: str, conn) -> Store:
    base = SqlSinkConfig(dsn=dsn, table="contract_features", source="things", as_of=T1, dialect="postgres", batch_rows=4,
                         statements_per_transaction=2, retry_base_delay=0.01, retry_max_delay=0.02)  # fmt: skip
    conn.execute("DROP TABLE IF EXISTS contract_features")
    ensure_schema(conn, base)

    def plan(as_of: int, **overrides) -> SqlWritePlan:
        return SqlWritePlan(sink=replace(base, as_of=as_of, **overrides))

    def rows(batch: pa.RecordBatch) -> pa.RecordBatch:
        docs, non_finite = encode_json_maps(batch, SPECS)
        return pa.RecordBatch.from_pydict(
            {"_id": batch.column("_id"), "_features_json": docs, "_non_finite": pa.array(non_finite, pa.int64())}
        )

    def stored(ids: list[str]) -> dict:
        found = conn.execute("SELECT entity_key, features::text, as_of FROM contract_features WHERE source = 'things'").fetchall()
        return {k: (json.loads(doc), int(as_of.timestamp())) for k, doc, as_of in found if k in ids}

    def expected(batch: pa.RecordBatch, row: int, as_of: int) -> tuple:
        values = {s.name: batch.column(s.name)[row].as_py() for s in SPECS}
        return {k: v for k, v in values.items() if v is not None}, as_of

    return Store(
        "sql", "rows_upserted", "rows_skipped_newer", "rows_replaced_future", plan,
        unreachable=lambda: plan(T1, dsn="postgresql://postgres@127.0.0.1:1/features", connect_timeout=1, retries=1),
        refused=lambda: plan(T1, dsn=dsn.replace("postgres@", "nobody@", 1) if "postgres@" in dsn else f"{dsn} user=nobody"),
        rows=rows, stored=stored, expected=expected,
    )  # fmt: skip


def _run(plan, batches: list[pa.RecordBatch]) -> dict:
    """One partition, as Spark's mapInArrow runs it: exactly one stats row comes out."""
    out = list(write_partition(plan, iter(batches)))
    assert len(out) == 1 and out[0].num_rows == 1
    return out[0].to_pylist()[0]


def _split(store: Store, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    rows = store.rows(batch)
    return [rows.slice(0, 10), rows.slice(10)]  # two Arrow batches in one partition


def test_a_partition_writes_every_entity_exactly(store):
    batch = things(N)
    row = _run(store.plan(T1), _split(store, batch))
    assert row["error"] is None and row["stopped"] is None, row
    assert row[store.written] == N and row[store.skipped] == 0
    ids = batch.column("_id").to_pylist()
    assert store.stored(ids) == {i: store.expected(batch, n, T1) for n, i in enumerate(ids)}


def test_a_repeated_partition_writes_the_same(store):
    batch = things(N)
    first = _run(store.plan(T1), _split(store, batch))
    again = _run(store.plan(T1), _split(store, batch))  # a retried Spark task
    assert (first[store.written], again[store.written], again[store.skipped]) == (N, N, 0)
    ids = batch.column("_id").to_pylist()
    assert store.stored(ids) == {i: store.expected(batch, n, T1) for n, i in enumerate(ids)}


def test_an_older_snapshot_is_left_out_and_counted(store):
    newer, older = things(N), things(N, offset=0)
    older = older.set_column(1, "score", pa.array([float(-n) for n in range(N)], pa.float64()))
    _run(store.plan(T2), _split(store, newer))
    row = _run(store.plan(T1), _split(store, older))
    assert (row[store.written], row[store.skipped], row["error"]) == (0, N, None)
    ids = newer.column("_id").to_pylist()
    assert store.stored(ids) == {i: store.expected(newer, n, T2) for n, i in enumerate(ids)}


def test_a_stored_as_of_beyond_the_horizon_is_replaced_and_counted(store):
    """A snapshot later than any date a run accepts (2099) is corrupt: the next write replaces
    it; a later one up to the horizon is newer and stays. The horizon is the writer's (its clock)."""
    later, older = things(N), things(N, offset=0)
    older = older.set_column(1, "score", pa.array([float(-n) for n in range(N)], pa.float64()))
    ids = later.column("_id").to_pylist()
    _run(store.plan(T2099), _split(store, later))
    row = _run(store.plan(T1), _split(store, older))  # the horizon of today's clock
    assert (row[store.written], row[store.skipped], row[store.replaced], row["error"]) == (N, 0, N, None)
    assert store.stored(ids) == {i: store.expected(older, n, T1) for n, i in enumerate(ids)}
    # at the horizon: newer, left; one second past it: replaced
    _run(store.plan(T2), _split(store, later))
    row = _run(store.plan(T1, horizon=T2), _split(store, older))
    assert (row[store.written], row[store.skipped], row[store.replaced]) == (0, N, 0)
    assert store.stored(ids) == {i: store.expected(later, n, T2) for n, i in enumerate(ids)}
    row = _run(store.plan(T1, horizon=T2 - 1), _split(store, older))
    assert (row[store.written], row[store.skipped], row[store.replaced]) == (N, 0, N)
    assert store.stored(ids) == {i: store.expected(older, n, T1) for n, i in enumerate(ids)}


def test_an_empty_partition_reports_zeros(store):
    row = _run(store.plan(T1), [])
    assert (row[store.written], row[store.skipped], row["error"], row["error_kind"]) == (0, 0, None, None)


def test_an_unreachable_store_is_a_transient_error_in_the_stats_row(store):
    row = _run(store.unreachable(), [store.rows(things(3))])
    error = from_wire(row["error_kind"], row["error"])
    assert isinstance(error, TransientError), row  # Spark's task succeeded; the driver fails the run, retryable
    assert row[store.written] == 0 and "127.0.0.1" in row["error"]


def test_refused_credentials_are_a_terminal_error_in_the_stats_row(store):
    row = _run(store.refused(), [store.rows(things(3))])
    error = from_wire(row["error_kind"], row["error"])
    assert isinstance(error, TerminalError) and not isinstance(error, TransientError), row
    assert PASSWORD not in row["error"]  # never the password


def test_the_stats_row_is_what_spark_is_told(store):
    """Every stats column filled: Arrow would turn a counter the writer forgot into a null,
    which the driver's sums cannot add."""
    plan = store.plan(T1)
    row = _run(plan, [store.rows(things(2))])
    counters = [f.name for f in fields(plan.stats_type)]
    assert [part.split(" ")[0] for part in partition_schema(plan).split(", ")] == [*counters, *(f.name for f in fields(Outcome))]
    assert all(isinstance(row[name], int) and row[name] >= 0 for name in counters), row
    assert row[store.written] == 2 and row["seconds"] > 0 and row["peak_rss"] > 0

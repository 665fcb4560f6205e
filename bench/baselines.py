"""What the pipeline is measured against, run on the same data in the same bench run.

- the Redis server's ceiling: the job's own RESP bytes, pre-built, loaded by one process
  over a raw socket, with a second thread sending while the first counts replies;
- redis-py (with hiredis) building the same HSETs in a pipeline, as a client library would;
- raw psycopg multi-row upserts (25 rows per statement) from one connection with one
  commit, and from two processes committing as often as the job does: the rate a
  hand-written loader reaches.
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.ipc as ipc
import redis
from psycopg import sql

from serializers.resp import WRITE_SCRIPT, EntityCommands


def _host_port(url: str) -> tuple[str, int]:
    client = redis.Redis.from_url(url)
    kwargs = client.connection_pool.connection_kwargs
    client.close()
    return kwargs.get("host", "127.0.0.1"), int(kwargs.get("port", 6379))


def raw_load(url: str, commands: list[EntityCommands], chunk_entities: int = 500) -> float:
    """Send pre-built commands as fast as one connection takes them; returns seconds.

    Each entity's command is one call of the write script, loaded here first; each
    element of ``commands`` may instead say how many replies it expects (``replies``)."""
    loader = redis.Redis.from_url(url)
    loader.script_load(WRITE_SCRIPT)
    loader.close()
    expected = sum(getattr(c, "replies", len(c)) for c in commands)
    chunks = [c.wire_bytes(s, min(len(c), s + chunk_entities)) for c in commands for s in range(0, len(c), chunk_entities)]
    sock = socket.create_connection(_host_port(url))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    errors: list[BaseException] = []

    def send() -> None:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except OSError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    start = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    seen = 0
    while seen < expected:
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("Redis closed the connection during the raw load")
        if b"-" in data:
            raise RuntimeError(f"Redis refused a command in the raw load: {data[data.index(b'-') :][:200]!r}")
        seen += data.count(b"\n")  # every reply is one integer line
    seconds = time.perf_counter() - start
    sender.join()
    sock.close()
    if errors:
        raise errors[0]
    return seconds


def redis_py_load(url: str, keys: list[bytes], rows: list[dict[bytes, bytes]], pipeline_entities: int = 500) -> float:
    """The same HSETs through a redis-py pipeline (hiredis parser); returns seconds."""
    client = redis.Redis.from_url(url)
    start = time.perf_counter()
    for first in range(0, len(keys), pipeline_entities):
        pipe = client.pipeline(transaction=False)
        for key, mapping in zip(keys[first : first + pipeline_entities], rows[first : first + pipeline_entities]):
            pipe.hset(key, mapping=mapping)
        pipe.execute()
    seconds = time.perf_counter() - start
    client.close()
    return seconds


RAW_TABLE = "bench_raw_upsert"


def _raw_upsert_worker(
    dsn: str, password: str | None, path: str, part: int, parts: int, batch_rows: int, commit_every: int | None, barrier, results
) -> None:
    table = ipc.open_file(path).read_all()
    rows = len(table)
    share = table.slice(part * rows // parts, (part + 1) * rows // parts - part * rows // parts)
    keys, docs = share.column("key").to_pylist(), share.column("doc").to_pylist()
    placeholders = sql.SQL(", ").join([sql.SQL("(%s, 'raw', %s::jsonb, now())")] * batch_rows)
    statement = sql.SQL(
        "INSERT INTO {} (entity_key, source, features, as_of) VALUES {} "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of"
    ).format(sql.Identifier(RAW_TABLE), placeholders)
    with psycopg.connect(dsn, password=password) as conn:
        barrier.wait()  # loaded and connected: start together
        # building the parameters is part of a loader's work (the job's writers do it too)
        params = []
        for first in range(0, len(keys) - batch_rows + 1, batch_rows):
            flat: list = []
            for key, doc in zip(keys[first : first + batch_rows], docs[first : first + batch_rows]):
                flat += (key, doc)
            params.append(flat)
        step = commit_every or len(params) or 1
        with conn.cursor() as cur:
            for first in range(0, len(params), step):
                cur.executemany(statement, params[first : first + step])
                conn.commit()
        results.put(len(params) * batch_rows)


def raw_upsert(
    dsn: str,
    password: str | None,
    keys: list[str],
    docs: list[str],
    workdir: Path,
    parts: int = 2,
    batch_rows: int = 25,
    commit_every: int | None = None,
) -> tuple[int, float]:
    """``parts`` processes upsert shares of the rows (sorted by key, as the job's writers
    send them) at the same time, committing every ``commit_every`` statements (None: once
    at the end); returns (rows, wall seconds)."""
    with psycopg.connect(dsn, password=password, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(RAW_TABLE)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (entity_key TEXT NOT NULL, source TEXT NOT NULL, features JSONB NOT NULL, "
                "as_of TIMESTAMPTZ NOT NULL, PRIMARY KEY (entity_key, source))"
            ).format(sql.Identifier(RAW_TABLE))
        )
    path = workdir / "raw_upsert.arrow"
    with ipc.new_file(str(path), pa.schema([("key", pa.string()), ("doc", pa.string())])) as writer:
        table = pa.table({"key": keys, "doc": docs})
        writer.write_table(table.sort_by("key"))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs a JVM gateway
    barrier, results = ctx.Barrier(parts + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_raw_upsert_worker, args=(dsn, password, str(path), i, parts, batch_rows, commit_every, barrier, results))
        for i in range(parts)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=300)
    start = time.perf_counter()
    rows = sum(results.get(timeout=900) for _ in procs)
    seconds = time.perf_counter() - start
    for p in procs:
        p.join()
    path.unlink()
    return rows, seconds

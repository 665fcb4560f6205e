"""What the per-entity snapshot-order guard costs the Redis server, against plain commands.

The writer sends one ``EVALSHA`` of the write script per entity (``serializers.resp``): it
compares the stored freshness field with the write's as-of time and only then runs
``HSET``/``HDEL``/``EXPIRE``. The baseline is the same entities as plain pipelined
``HSET`` + ``HDEL`` + ``EXPIRE`` without any check (what the writer sent before the guard).
Both are pre-built bytes loaded over one raw socket into the same fresh redis-server, in
the same process, so the ratio is the server's cost of the guard alone:

- new keys, and the nightly case of overwriting every key with a newer snapshot;
- an older snapshot sent over the newer one (every entity skipped by the script).

    .venv/bin/python -m bench.write_guard --entities 200000 --output bench/results/write_guard_results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from bench.baselines import raw_load
from serializers.batch import FeatureSpec, encode_batch
from serializers.horizon import as_of_horizon
from serializers.resp import EntityCommands, entity_commands
from serializers.scalar import field_id
from throwaway.servers import start_redis

FLOATS, INTS, DIMENSION = 44, 4, 32
TTL = 2_592_000


@dataclass
class PlainCommands:
    """HSET (+ HDEL) + EXPIRE per entity, packed by redis-py: the unguarded baseline."""

    chunks: list[bytes]
    replies: int
    entities: int

    def __len__(self) -> int:
        return self.entities

    def wire_bytes(self, start: int, stop: int) -> bytes:
        return b"".join(self.chunks[start:stop])


def _pack(*args: bytes) -> bytes:
    return b"".join(redis.connection.PythonRespSerializer(6000, lambda v: v).pack(*args))


def plain_commands(keys: list[bytes], columns: list[list[bytes | None]], fields: list[bytes], fresh: bytes, stamp: bytes) -> PlainCommands:
    chunks, replies = [], 0
    for i, key in enumerate(keys):
        pairs = [x for fid, col in zip(fields, columns) if col[i] is not None for x in (fid, col[i])]
        nulls = [fid for fid, col in zip(fields, columns) if col[i] is None]
        wire = _pack(b"HSET", key, *pairs, fresh, stamp)
        if nulls:
            wire += _pack(b"HDEL", key, *nulls)
        wire += _pack(b"EXPIRE", key, str(TTL).encode())
        chunks.append(wire)
        replies += 2 + bool(nulls)
    return PlainCommands(chunks, replies, len(keys))


def standard_batch(start: int, n: int, rng: np.random.Generator) -> pa.RecordBatch:
    """The bench's standard shape (bench/standard.py) made with numpy, without Spark."""
    cols: dict[str, pa.Array] = {"_id": pa.array([str(i) for i in range(start, start + n)])}
    for j in range(FLOATS):
        values = np.round(rng.random(n) * [1, 10, 100, 1][j % 4], [2, 2, 2, 3][j % 4])
        cols[f"f{j:02d}"] = pa.array(np.where(rng.random(n) < 0.6, 0.0, values))
    for j, top in enumerate([30, 400, 10_000, 2_000_000]):
        cols[f"n{j}"] = pa.array((rng.random(n) * top).astype(np.int64))
    cols["recent_ids"] = pa.array(list(rng.integers(1, 65, (n, 10))), pa.list_(pa.int64()))
    cols["embedding"] = pa.array(list(rng.standard_normal((n, DIMENSION)).astype(np.float32)), pa.list_(pa.float32()))
    return pa.RecordBatch.from_pydict(cols)


SPECS = [FeatureSpec(f"f{j:02d}", "float") for j in range(FLOATS)] + [FeatureSpec(f"n{j}", "int") for j in range(INTS)]
SPECS += [FeatureSpec("recent_ids", "int_list"), FeatureSpec("embedding", "embedding", {"dimension": DIMENSION})]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2, help="best of this many loads per case")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(7)
    fields = [s.field for s in SPECS]
    fresh = field_id("_ts:bench_standard")
    newer, older = b"1763683200", b"1763596800"
    guarded: dict[bytes, list[EntityCommands]] = {newer: [], older: []}
    plain: list[PlainCommands] = []
    for start in range(0, args.entities, 10_000):
        encoded = encode_batch(standard_batch(start, min(10_000, args.entities - start), rng), SPECS)
        keys = pc.binary_join_element_wise(b"b:", encoded.ids.cast(pa.binary()), b"")
        ttl = np.full(len(keys), TTL, np.int64)
        for stamp in guarded:
            guarded[stamp].append(entity_commands(keys, encoded.columns, fields, fresh, stamp, ttl, horizon=as_of_horizon()))
        plain.append(plain_commands(keys.to_pylist(), [c.to_pylist() for c in encoded.columns], fields, fresh, newer))

    workdir = Path(tempfile.mkdtemp(prefix="fm-bench-guard-"))
    server = start_redis(workdir, "--hash-max-listpack-value", "256")
    url, client = server.url, server.client()
    try:

        def best(commands, fresh_server: bool) -> float:
            rates = []
            for _ in range(args.repeat):
                if fresh_server:
                    client.flushall()
                rates.append(args.entities / raw_load(url, commands))
            return max(rates)

        out = {
            "entities": args.entities,
            "values_per_entity": len(SPECS),
            "redis": client.info("server")["redis_version"],
            "python": platform.python_version(),
        }
        out["plain_new_keys_per_s"] = best(plain, True)
        raw_load(url, plain)  # keys exist: the nightly case
        out["plain_overwrite_keys_per_s"] = best(plain, False)
        out["guarded_new_keys_per_s"] = best(guarded[newer], True)
        raw_load(url, guarded[newer])
        out["guarded_overwrite_keys_per_s"] = best(guarded[newer], False)
        out["guarded_older_skipped_keys_per_s"] = best(guarded[older], False)
        stamps = {client.hget(f"b:{i}", fresh) for i in range(0, args.entities, max(1, args.entities // 1000))}
        assert stamps == {newer}, f"an older snapshot replaced a newer one: {stamps}"
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out["guard_cost_new"] = out["plain_new_keys_per_s"] / out["guarded_new_keys_per_s"]
    out["guard_cost_overwrite"] = out["plain_overwrite_keys_per_s"] / out["guarded_overwrite_keys_per_s"]
    for key, value in out.items():
        print(f"{key:36s} {value:,.2f}" if isinstance(value, float) else f"{key:36s} {value}")
    if args.output:
        args.output.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()

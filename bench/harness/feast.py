"""The peer: `feast materialize` on the same data, timed as a whole process; and how `feast serve` is run.

Feast runs in a virtualenv of its own (``.run/feast-venv``, pinned and made by
throwaway/feast_venv.py; from PyPI on first use), never in the project's. Its feature
repository reads the standard table (bench/standard.py) exported to Parquet (Feast's file
offline store cannot read Delta without an extra package), one feature view of the same 50
features, with Redis as its online store on the same server as our runs, in a database of
its own. ``feast apply``
runs first (untimed); ``feast materialize`` over the table's date is timed as a whole
process, as a user would time it, and the keys it wrote are counted.
``online_write_batch_size`` is set: without it Feast 0.67 writes all rows in one batch,
which ran out of memory at 1,000,000 entities on this 24 GiB machine.

``FEAST_FLAGS``: how the benchmarks run ``feast serve``. `python -m bench.feast_peer` runs
`feast materialize` alone.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from throwaway import feast_venv

BATCH_ROWS = 10_000
"""Feast's ``materialization.online_write_batch_size`` (rows per online write)."""
FEAST_FLAGS = ("--no-access-log", "--workers", "1", "--max-requests", "100000000")
"""Feast tuned as its docs advise: no access log; its default restarts the worker every ~1,000 requests, which would cost it."""


def feast_bin() -> Path:
    """The pinned Feast's command, installing it into its venv when missing."""
    return feast_venv.ensure().parent / "feast"


def export_parquet(entities: int, workdir: Path) -> Path:
    """The standard table of ``entities`` rows as Parquet, with Feast's event timestamp."""
    from pyspark.sql import functions as F

    from bench.standard import SOURCE
    from fm_config import load_config
    from jobs.spark import build_spark

    out = workdir / "feast" / f"standard-{entities}.parquet"
    table = workdir / "data" / str(entities) / SOURCE
    marker = out / "_from"
    stamp = (table / "_bench_rows").read_text() if (table / "_bench_rows").is_file() else None
    if stamp is None:
        raise SystemExit(f"no standard table at {table}: run `python -m bench.stage_profile --entities {entities}` first")
    if marker.is_file() and marker.read_text() == stamp:
        return out
    spark = build_spark(load_config("local", {"spark": {"master": "local[2]"}}).spark)
    try:
        df = spark.read.format("delta").load(str(table))
        # the snapshot is as of the end of its date: Feast reads rows up to the materialize end
        df = df.withColumn("event_timestamp", F.to_timestamp(F.concat(F.col("ds").cast("string"), F.lit(" 06:00:00")))).drop("ds")
        df.coalesce(2).write.mode("overwrite").parquet(str(out))
    finally:
        spark.stop()
    marker.write_text(stamp)
    return out


def feature_repo(folder: Path, data: Path, redis_url: str) -> Path:
    from bench.standard import ENTITY, FLOATS, INTS, SOURCE

    url = urlparse(redis_url)
    db = int((url.path or "/0").lstrip("/") or 0) + 1  # a database of its own on the same server
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "feature_store.yaml").write_text(
        "project: fm_bench\nregistry: registry.db\nprovider: local\nentity_key_serialization_version: 3\n"
        f'online_store:\n  type: redis\n  connection_string: "{url.hostname}:{url.port},db={db}"\n'
        f"offline_store:\n  type: file\nmaterialization:\n  online_write_batch_size: {BATCH_ROWS}\n"
    )
    fields = [f'Field(name="f{j:02d}", dtype=Float64)' for j in range(FLOATS)] + [f'Field(name="n{j}", dtype=Int64)' for j in range(INTS)]
    fields += ['Field(name="recent_ids", dtype=Array(Int64))', 'Field(name="embedding", dtype=Array(Float32))']
    (folder / "features.py").write_text(
        "from datetime import timedelta\n"
        "from feast import Entity, FeatureView, Field, FileSource\n"
        "from feast.types import Array, Float32, Float64, Int64\n\n"
        f'entity = Entity(name="{ENTITY}", join_keys=["entity_id"])\n'
        f'source = FileSource(path="{data}", timestamp_field="event_timestamp")\n'
        f'view = FeatureView(name="{SOURCE}", entities=[entity], ttl=timedelta(days=30), online=True, source=source, schema=[\n    '
        + ",\n    ".join(fields) + ",\n])\n"
    )  # fmt: skip
    return folder


def materialize(entities: int, redis_url: str, workdir: Path) -> dict:
    """``feast materialize`` of the standard table's date: whole-process seconds and keys written."""
    import redis

    from bench.standard import DATE

    exe = feast_bin()
    data = export_parquet(entities, workdir)
    repo = feature_repo(workdir / "feast" / f"repo-{entities}", data, redis_url)
    (repo / "registry.db").unlink(missing_ok=True)
    subprocess.run([str(exe), "-c", str(repo), "apply"], check=True, capture_output=True)
    url = urlparse(redis_url)
    client = redis.Redis(host=url.hostname, port=url.port, db=int((url.path or "/0").lstrip("/") or 0) + 1)
    client.flushdb()
    start = time.perf_counter()
    done = subprocess.run(
        [str(exe), "-c", str(repo), "materialize", f"{DATE}T00:00:00", f"{DATE}T23:59:59"],
        capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"feast materialize failed ({done.returncode}): {done.stderr[-2000:]}")
    keys = client.dbsize()
    if keys != entities:
        raise RuntimeError(f"feast materialize wrote {keys:,} keys for {entities:,} entities")
    peer = feast_venv.pinned().replace("feast==", "feast[redis]==")
    return {"peer": peer, "entities": entities, "seconds": round(seconds, 2), "keys": keys, "online_write_batch_size": BATCH_ROWS}

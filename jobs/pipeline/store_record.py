"""After a store's write: what identifies it and what it holds, with a sample of the
entities written, for the ledger (``stores.<sink>.after``), which the next steps compare
with (jobs/operations/ledger/store_state.py). Never fails a written run: a store that does not
answer here is a warning, and the next comparison has one record less."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from jobs import transforms as tf
from jobs.pipeline.context import RunContext
from jobs.pipeline.report.summary import RunSummary
from sinks.redis.config import RedisSinkConfig
from sinks.sql.config import SqlSinkConfig

SAMPLE_KEYS = 32
"""Entities of each write whose presence later steps check (a pipeline of HMGETs, one indexed query)."""


def redis_after(config: RedisSinkConfig, sample: pa.Table, summary: RunSummary) -> dict[str, Any]:
    """``config``: the write plan's (cluster or not); ``sample``: rows the preflight sampled."""
    from sinks.redis.identity import observe

    ids = sample.column(tf.ENTITY_ID).to_pylist()[:SAMPLE_KEYS] if sample.num_rows else []
    try:
        return {**observe(config, config.cluster), "sample": [config.key_prefix + i for i in ids]}
    except Exception as exc:  # noqa: BLE001 (written and checked: only the record is missing)
        summary.warnings.append(f"redis: could not record what it holds after the write ({type(exc).__name__}: {exc})")
        return {}


def sql_after(ctx: RunContext, config: SqlSinkConfig, rows: DataFrame, summary: RunSummary) -> dict[str, Any]:
    """The Redis write's sample when there was one (the same entities), else one of ``rows``."""
    from sinks.sql.identity import observe
    from stores.sql import connect

    redis_keys = summary.sinks.get("redis", {}).get("store", {}).get("sample")
    if redis_keys is not None:
        prefix = ctx.redis_config().key_prefix
        ids = [k[len(prefix) :] for k in redis_keys]
    else:
        fraction = min(1.0, 4.0 * SAMPLE_KEYS / max(1, summary.entities))
        ids = [r[0] for r in rows.select(tf.ENTITY_ID).sample(fraction=fraction, seed=31).limit(SAMPLE_KEYS).collect()]
    try:
        with connect(config) as conn:
            return {**observe(conn, config), "sample": ids}
    except Exception as exc:  # noqa: BLE001
        summary.warnings.append(f"{config.dialect}: could not record what it holds after the write ({type(exc).__name__}: {exc})")
        return {}

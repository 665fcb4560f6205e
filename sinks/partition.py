"""The one function that runs inside Spark partitions, for every store (module-level: only
its write plan is pickled).

It opens the plan's writer inside the partition, feeds it the partition's Arrow batches,
and yields one row of stats. No data goes back to the driver; memory per task is bounded
by the Arrow batch size. An error leaves the partition as (kind, message) in that row
(:func:`sinks.errors.to_wire`); the driver rebuilds it as its class.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import asdict
from functools import cache

import pyarrow as pa

from sinks.base import Outcome, WritePlan, WriteStats, stats_schema
from sinks.errors import to_wire


def peak_rss() -> int:
    """Peak resident memory of this Python worker so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@cache
def _schemas(stats_type: type[WriteStats]) -> tuple[pa.Schema, str]:
    return stats_schema(stats_type)


def partition_schema(plan: WritePlan) -> str:
    """Spark DDL of the stats rows :func:`write_partition` yields for this plan."""
    return _schemas(plan.stats_type)[1]


def write_partition(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write one partition's batches with the plan's writer; yield its stats row."""
    outcome, start = Outcome(), time.perf_counter()
    writer = plan.writer()
    try:
        writer.open()
        for batch in batches:
            if batch.num_rows:
                writer.write_batch(batch)
        writer.flush()
    except writer.stops as exc:
        # e.g. the memory ceiling: this writer stops and reports; the driver sums every
        # writer and fails the run with how much was written
        outcome.stopped = str(exc)
    except writer.errors as exc:
        # Retries are exhausted, or the store refused a command (terminal). Anything else
        # is a bug: it fails the task, with its traceback, as Spark reports it.
        outcome.error_kind, outcome.error = to_wire(exc, plan.store)
    finally:
        writer.close()
    outcome.peak_rss, outcome.seconds = peak_rss(), time.perf_counter() - start
    row = {**writer.stats.as_dict(), **asdict(outcome)}
    yield pa.RecordBatch.from_pylist([row], schema=_schemas(plan.stats_type)[0])


def sum_partition_stats(stats: dict, parts: list, keys: tuple[str, ...], seconds: float, rate: tuple[str, str]) -> None:
    """Add up the writers' stats rows; ``rate`` is (name, counted key) of the per-second figure."""
    for key in keys:
        stats[key] = sum(p[key] for p in parts)
    # memory per Python worker, the figure that must stay flat as the data grows
    stats["worker_peak_rss"] = max((p["peak_rss"] for p in parts), default=0)
    # the rest of write_seconds is Spark's: scheduling, starting workers, the rows' first batch
    stats["slowest_writer_seconds"] = max((p["seconds"] for p in parts), default=0.0)
    stats["write_seconds"] = seconds
    stats[rate[0]] = stats[rate[1]] / seconds if seconds else 0.0

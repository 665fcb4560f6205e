"""Stage 3, quarantine: the bad rows, with their reasons, into a Delta table per source."""

from __future__ import annotations

from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fm_config.locations import Location
from jobs.pipeline.context import RunContext


def write_quarantine(ctx: RunContext, quarantine: DataFrame, bad_rows: int) -> str:
    """Replace this (source, date or dates)'s quarantined rows: a rerun leaves the same table.
    Returns its path.

    With no bad rows (prepare counted them) the snapshot is not scanned again: the date's
    earlier rows, if any, are deleted from the log alone (a delete by partition rewrites
    no file), and a missing table is made empty."""
    path = str(ctx.conf.quarantine_path / ctx.source.name)
    date, end = ctx.date, ctx.end
    where = f"ds >= '{date.isoformat()}' AND ds <= '{end.isoformat()}'" if end else f"ds = '{date.isoformat()}'"
    if not bad_rows:
        if _is_table(ctx, path):
            DeltaTable.forPath(ctx.spark, path).delete(where)
        else:
            ctx.spark.createDataFrame([], quarantine.schema).write.format("delta").partitionBy("ds").save(path)
        return path
    (quarantine.write.format("delta").mode("overwrite").option("replaceWhere", where).partitionBy("ds").save(path))
    return path


def _is_table(ctx: RunContext, path: str) -> bool:
    if Location(path).is_local:
        return (Path(path) / "_delta_log").is_dir()
    return DeltaTable.isDeltaTable(ctx.spark, path)


def reason_counts(quarantine: DataFrame, bad_rows: int) -> dict[str, int]:
    """Bad rows per reason (a row with two reasons counts in both); no Spark job when none is bad."""
    if not bad_rows:
        return {}
    reasons = quarantine.select(F.explode("reasons").alias("reason")).groupBy("reason").count().collect()
    return {r["reason"]: r["count"] for r in reasons}

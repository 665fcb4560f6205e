"""Stage 3, quarantine: the bad rows, with their reasons, into a Delta table per source."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.pipeline.context import RunContext


def write_quarantine(ctx: RunContext, quarantine: DataFrame) -> str:
    """Replace this (source, date or dates)'s quarantined rows: a rerun leaves the same table. Returns its path."""
    path = str(ctx.conf.quarantine_path / ctx.source.name)
    date, end = ctx.date, ctx.end
    where = f"ds >= '{date.isoformat()}' AND ds <= '{end.isoformat()}'" if end else f"ds = '{date.isoformat()}'"
    (
        quarantine.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", where)
        .partitionBy("ds")
        .save(path)
    )
    return path


def reason_counts(quarantine: DataFrame) -> dict[str, int]:
    """Bad rows per reason (a row with two reasons counts in both)."""
    reasons = quarantine.select(F.explode("reasons").alias("reason")).groupBy("reason").count().collect()
    return {r["reason"]: r["count"] for r in reasons}

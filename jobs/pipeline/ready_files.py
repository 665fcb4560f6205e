"""Whether a source has rows for a date, from its files, without Spark: `materialize ready`,
which a sensor runs every few minutes of the night, in a second or two and without a JVM.

A Delta table is read by delta-rs (its log names the files, with each file's partition values
and column statistics), a Parquet location by pyarrow (the footers' statistics); both skip
what the filter rules out and stop at the first row found. The filter is the run's own: the
date partition (a date or a ``yyyy-MM-dd`` text column), a long layout's defined feature names,
an event time within the day (UTC; a time without a zone read as UTC, a date as its midnight).

Where it cannot answer as Spark would, it answers None and the caller asks Spark: a catalog
table, a location behind a URI, a column of another type, files it cannot read as one
(Spark reads each Parquet file in its own types: jobs/pipeline/parquet_files.py).
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

from feature_defs import SourceDef
from fm_config import RunConf
from jobs.pipeline.source_table import table_ref

__all__ = ["has_rows"]

log = logging.getLogger(__name__)


def has_rows(conf: RunConf, source: SourceDef, date: dt.date) -> bool | None:
    """Whether ``source`` has rows for ``date`` (no table yet: False); None when Spark must say."""
    ref = table_ref(conf, source)
    if ref.table or not (ref.location.is_local or ref.location.startswith("file:")):
        return None
    path = ref.location.local_path()
    try:
        dataset = _dataset(path, ref.format)
        if dataset is None:
            return False  # no table yet, as a run finds it (jobs/pipeline/source_table.py _check_local)
        condition = _condition(dataset.schema, source, date)
        if condition is None:
            return None
        return dataset.scanner(filter=condition, columns=[]).head(1).num_rows > 0
    except Exception as exc:  # noqa: BLE001 (any file or type pyarrow or delta-rs cannot take: Spark reads it)
        log.info("ready: %s read without Spark failed (%s: %s): asking Spark", path, type(exc).__name__, exc)
        return None


def _dataset(path: Path, fmt: str):
    import pyarrow.dataset as ds

    if fmt == "delta":
        if not (path / "_delta_log").is_dir():
            return None
        from deltalake import DeltaTable

        return DeltaTable(str(path)).to_pyarrow_dataset()
    if not path.exists() or (path.is_dir() and not any(path.rglob("*.parquet"))):
        return None
    return ds.dataset(str(path), format="parquet", partitioning="hive")


def _condition(schema, source: SourceDef, date: dt.date):
    """The run's filter of the date's rows as a pyarrow expression; None for a type it does not handle."""
    import pyarrow.dataset as ds

    if source.by_event_time:
        within = _in_day(schema, source.timestamp_column, date)
    else:
        within = _on_date(schema, source.date_column, date)
    if within is None or source.layout != "long":
        return within
    if source.name_column not in schema.names:
        return None
    return within & ds.field(source.name_column).isin([f.source_column for f in source.features])


def _on_date(schema, column: str, date: dt.date):
    import pyarrow as pa
    import pyarrow.dataset as ds

    if column not in schema.names:
        return None
    kind = schema.field(column).type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ds.field(column) == date.isoformat()
    if pa.types.is_date(kind):
        return ds.field(column) == pa.scalar(date, kind)
    return None


def _in_day(schema, column: str, date: dt.date):
    """Event times from the date's midnight (included) to the next (excluded), UTC."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if column not in schema.names:
        return None
    kind = schema.field(column).type
    if pa.types.is_date(kind):
        return ds.field(column) == pa.scalar(date, kind)
    if not pa.types.is_timestamp(kind):
        return None
    start = dt.datetime.combine(date, dt.time(), tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
    if kind.tz is None:  # read as UTC, as the run reads a time without a zone
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    field = ds.field(column)
    return (field >= pa.scalar(start, kind)) & (field < pa.scalar(end, kind))

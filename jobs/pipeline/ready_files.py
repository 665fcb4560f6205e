"""Whether a source has rows for a date, from its files, without Spark: `materialize ready`,
which a sensor runs every few minutes of the night, in a second or two and without a JVM.

A Delta table is read by delta-rs (its log names the files, with each file's partition values
and column statistics), a Parquet location by pyarrow (the footers' statistics); both skip
what the filter rules out and stop at the first row found. The filter is the run's own: the
date partition (a date or a ``yyyy-MM-dd`` text column), a long layout's defined feature names,
an event time within the day (UTC; a time without a zone read as UTC, a date as its midnight).

Where it cannot answer as Spark would, it answers None and the caller asks Spark: a catalog
table, a location behind a URI, a column of another type, a Delta table whose reader needs
more than its log and files (column mapping: delta-rs 1.6 would read its columns as nulls),
Parquet files that disagree on a column's type (Spark reads each file in its own types or
refuses the folder: jobs/pipeline/parquet_files.py), a file it cannot read.
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
        if dataset is _SPARK:
            return None
        condition = _condition(dataset.schema, source, date)
        if condition is None or (ref.format == "parquet" and not _files_agree(dataset)):
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

        table = DeltaTable(str(path))
        return table.to_pyarrow_dataset() if _plain_reader(table) else _SPARK
    if not path.exists():
        return None
    dataset = ds.dataset(str(path), format="parquet", partitioning="hive")  # `_` and `.` files left out, as Spark does
    return dataset if dataset.files else None


_SPARK = object()
"""A table this module does not read as Spark would: the caller asks Spark."""


def _plain_reader(table) -> bool:
    """A table delta-rs reads from its log and files alone: reader version 1, or only the
    timestampNtz reader feature, and no column mapping (files keyed by physical names)."""
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    mapping = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    return (protocol.min_reader_version == 1 or features <= {"timestampNtz"}) and mapping == "none"


def _files_agree(dataset) -> bool:
    """Whether every file holds its columns in the dataset's types. Spark reads each file in its
    own types and widens them, or refuses the folder in one line (jobs/pipeline/parquet_files.py):
    files that differ are left to it, so `ready` says what the run will say."""
    want = dataset.schema
    for fragment in dataset.get_fragments():
        for field in fragment.physical_schema:
            if field.name in want.names and want.field(field.name).type != field.type:
                return False
    return True


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

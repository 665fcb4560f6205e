"""Where a source's rows are, and the one way they are opened: a Delta table or Parquet (one
file, or a folder of files, hive-partitioned or not) at a location, or a table of Spark's
catalog. A run's read, readiness, backfill plans, cleanup and doctor all open tables here,
so they find the same rows and fail with the same one-line errors.

Opening is lazy: no row is read; a Parquet folder's schema comes from its footers. The dates
a run covers are a separate step (:func:`dated`), a filter on the date column as stored, which
Spark pushes down to the partitions (a Delta table's, a hive-partitioned folder's, a catalog
table's) so only those are listed and read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import SourceDef
from fm_config import RunConf
from fm_config.catalog import CATALOG_HELP
from fm_config.locations import Location
from jobs.pipeline.parquet_files import MixedParquetTypes, read_parquet
from jobs.source_errors import CatalogNotConfigured, CatalogUnavailable, SchemaDriftError, SourceNotFound, SourceUnreadable
from jobs.sql_text import ident
from jobs.transforms import date_problem

__all__ = [
    "CatalogNotConfigured",
    "CatalogUnavailable",
    "SourceNotFound",
    "SourceUnreadable",
    "TableRef",
    "check_catalog",
    "dated",
    "on_dates",
    "open_source",
    "open_table",
    "root_cause",
    "source_path",
    "table_ref",
]


@dataclass(frozen=True)
class TableRef:
    """A source table's identity: a location and what is there, or a catalog table's name.
    Recorded in the ledger (``record``), so cleanup finds the keys again once the source's
    definition is gone."""

    location: Location | None = None
    format: str = "delta"
    table: str | None = None

    def __str__(self) -> str:
        return f"catalog table {self.table}" if self.table else str(self.location)

    def record(self) -> dict[str, Any]:
        """As the ledger keeps it: a Delta location as before ({"location"}), the others tagged."""
        if self.table:
            return {"table": self.table}
        return {"location": str(self.location)} | ({"format": self.format} if self.format != "delta" else {})

    @classmethod
    def from_record(cls, where: dict[str, Any]) -> TableRef:
        if where.get("table"):
            return cls(table=where["table"])
        return cls(location=Location(where["location"]), format=where.get("format", "delta"))


def source_path(conf: RunConf, source: SourceDef) -> Location:
    """The source's location as a URI or absolute path, else under data_root."""
    if source.location is None:
        raise ValueError(f"source {source.name!r} reads the catalog table {source.table}, not a location")
    return conf.table_path(source.location)


def table_ref(conf: RunConf, source: SourceDef) -> TableRef:
    if source.table is not None:
        return TableRef(table=source.table)
    return TableRef(location=source_path(conf, source), format=source.format)


def check_catalog(conf: RunConf, sources: Iterable[SourceDef]) -> None:
    """Fail before Spark starts when a source names a catalog table and no catalog is set."""
    for source in sources:
        if source.table is not None and not conf.spark.catalog.configured:
            raise CatalogNotConfigured(
                f"source {source.name!r} reads the catalog table {source.table}, but no catalog is configured: {CATALOG_HELP}"
            )


def open_source(spark: SparkSession, conf: RunConf, source: SourceDef) -> DataFrame:
    """The source's whole table, lazily (no row read): what every reader of a source opens.
    Raises SourceNotFound, SourceUnreadable, CatalogUnavailable or CatalogNotConfigured, each
    one line naming the source and its location or table."""
    check_catalog(conf, [source])
    ref = table_ref(conf, source)
    try:
        return open_table(spark, conf, ref)
    except (SourceNotFound, SourceUnreadable, CatalogUnavailable) as exc:
        sample = isinstance(exc, SourceNotFound) and ref.format == "delta" and ref.location is not None and ref.location.is_local
        raise type(exc)(
            f"source {source.name!r}: {exc}" + (" (for the local sample data run `materialize sample-data`)" if sample else "")
        ) from None


def open_table(spark: SparkSession, conf: RunConf, ref: TableRef) -> DataFrame:
    """The table ``ref`` names, lazily. Errors name the location or table, in one line."""
    if ref.table:
        if not conf.spark.catalog.configured:
            raise CatalogNotConfigured(f"{ref} needs a catalog, and none is configured: {CATALOG_HELP}")
        return _open_catalog_table(spark, conf, ref.table)
    where = ref.location
    if where.is_local or where.startswith("file:"):
        _check_local(Path(where.local_path()), where, ref.format)
    try:
        if ref.format == "parquet":  # each file in its own types (timestamp units, widened columns)
            return read_parquet(spark, str(where))
        return spark.read.format(ref.format).load(str(where))
    except MixedParquetTypes:
        raise
    except Exception as exc:  # noqa: BLE001 (Spark's AnalysisException or a Py4JJavaError: one line instead of a JVM trace)
        raise _location_error(exc, where, ref.format) from None


def _check_local(path: Path, where: Location, fmt: str) -> None:
    """A local location's problems named before Spark looks (its own errors are JVM traces)."""
    if fmt == "delta":
        if not (path / "_delta_log").is_dir():
            hint = " (it holds Parquet files: set format: parquet)" if path.is_dir() and _parquet_files(path) else ""
            raise SourceNotFound(f"no Delta table at {where}{hint}")
    elif not path.exists():
        raise SourceNotFound(f"no Parquet file or folder at {where}")
    elif path.is_dir() and not _parquet_files(path):
        raise SourceNotFound(f"no Parquet files (*.parquet) in {where}")


def _parquet_files(folder: Path) -> bool:
    """Whether ``folder`` holds a Parquet file Spark would read (it skips names starting with _ or .)."""
    for file in folder.rglob("*.parquet"):
        parts = file.relative_to(folder).parts
        if file.is_file() and not any(p.startswith(("_", ".")) for p in parts):
            return True
    return False


_NOT_FOUND = ("PATH_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE", "DELTA_TABLE_NOT_FOUND", "DELTA_PATH_DOES_NOT_EXIST")


def _location_error(exc: Exception, where: Location, fmt: str) -> Exception:
    condition = _error_class(exc)
    if condition in _NOT_FOUND or "is not a Delta table" in str(exc):
        return SourceNotFound(f"no Delta table at {where}" if fmt == "delta" else f"no Parquet file or folder at {where}")
    if condition == "UNABLE_TO_INFER_SCHEMA":
        return SourceNotFound(f"no Parquet files in {where}")
    return SourceUnreadable(f"cannot read {where} as {fmt}: {root_cause(exc)}")


def _open_catalog_table(spark: SparkSession, conf: RunConf, table: str) -> DataFrame:
    catalog = conf.spark.catalog
    database = table.rpartition(".")[0]
    try:
        if database and not spark.catalog.databaseExists(database):
            raise SourceNotFound(f"no database {database} in the catalog ({catalog.describe()}), so no table {table}")
        if not spark.catalog.tableExists(table):
            raise SourceNotFound(f"no table {table} in the catalog ({catalog.describe()})")
        return spark.table(table)
    except SourceNotFound:
        raise
    except Exception as exc:  # noqa: BLE001 (the metastore's errors arrive as JVM traces)
        cause = root_cause(exc)
        if _unreachable(exc):
            return_error: Exception = CatalogUnavailable(f"cannot reach the catalog ({catalog.describe()}) to open {table}: {cause}")
        else:
            return_error = SourceUnreadable(f"cannot open the catalog table {table} ({catalog.describe()}): {cause}")
        raise return_error from None


def _unreachable(exc: Exception) -> bool:
    text = str(exc)
    return any(m in text for m in ("Could not connect to meta store", "Unable to instantiate", "ConnectException", "TTransportException"))


def _error_class(exc: Exception) -> str | None:
    getter = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    try:
        return getter() if getter else None
    except Exception:  # noqa: BLE001 (an error without a condition)
        return None


def root_cause(exc: Exception) -> str:
    """The innermost cause of a JVM error, in one line (``java.net.ConnectException: Connection
    refused``); else the first line of the message."""
    origin = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    try:
        while origin is not None and origin.getCause() is not None and not origin.getCause().equals(origin):
            origin = origin.getCause()
        if origin is not None:  # its first line: Hive writes whole stack traces into its messages
            return str(origin.toString()).strip().splitlines()[0][:300]
    except Exception:  # noqa: BLE001 (the gateway went away: the Python message is all there is)
        pass
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


# -- dates -------------------------------------------------------------------------------


def dated(df: DataFrame, column: str, start: dt.date, end: dt.date | None = None, *, source: str | None = None) -> DataFrame:
    """The rows of ``df`` dated ``start`` (..``end``), with ``column`` as dates."""
    return on_dates(df, column, ranges=[(start, end or start)], source=source)


def on_dates(
    df: DataFrame, column: str, dates: Iterable[dt.date] = (), ranges: Iterable[tuple[dt.date, dt.date]] = (), *, source: str | None = None
) -> DataFrame:
    """The rows of ``df`` dated one of ``dates`` or within one of ``ranges`` (inclusive), with
    ``column`` as dates. The filter compares the column as stored, so Spark prunes partitions
    by it; a text column is matched against each date's yyyy-MM-dd. Fails naming the column
    (and ``source``) when it is missing or neither a date nor text."""
    problem = date_problem(df.schema, column)
    if problem:
        raise SchemaDriftError(f"source {source!r}: {problem}" if source else problem)
    exact, spans = sorted(set(dates)), list(ranges)
    day = F.col(ident(column))  # quoted: a name may hold a dot
    if isinstance(df.schema[column].dataType, T.StringType):
        days = set(exact) | {a + dt.timedelta(days=n) for a, b in spans for n in range((b - a).days + 1)}
        kept = df.where(day.isin(sorted(d.isoformat() for d in days)) if days else F.lit(False))
        return kept.withColumn(column, F.to_date(day, "yyyy-MM-dd"))
    keep = [day == F.lit(a) if a == b else day.between(F.lit(a), F.lit(b)) for a, b in spans]
    if exact:
        keep.append(day == F.lit(exact[0]) if len(exact) == 1 else day.isin(exact))
    if not keep:
        return df.where(F.lit(False))
    condition = keep[0]
    for more in keep[1:]:
        condition = condition | more
    return df.where(condition)

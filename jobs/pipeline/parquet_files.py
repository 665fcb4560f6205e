"""A Parquet location read file by file in each file's own types.

Spark takes a folder's schema from the footer of one of its files and reads every file as if
it had those types. Files written at different times often do not: pandas writes event times
of nanoseconds and Spark or pyarrow of microseconds, an old writer an ``int`` where a new one
writes a ``bigint``. Read in another file's types, a file's microseconds were taken for
nanoseconds (1970: the row dropped), nanoseconds for a timestamp (a JVM error), a ``bigint``
for an ``int`` (a JVM error on every run). Here every footer is read (in parallel, by the
JVM: any file system Spark reads), the files are grouped by their types, and each group is
read in its own and cast to the folder's:

- nanoseconds (a bigint to Spark, TIMESTAMP(NANOS) in the footer) become timestamps, to the
  microsecond, in the files that hold them only;
- a column of other types in other files is widened when that loses nothing: a smaller
  integer to a larger one, float to double, a timestamp without a time zone to one with
  (read as UTC, as the job reads every naive time); any other difference refuses the
  location, in one line naming the column, its types and a file of each;
- a column some files lack is null in their rows (Spark's own schema merging does the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from jobs.source_errors import SourceUnreadable
from jobs.sql_text import ident

__all__ = ["MixedParquetTypes", "read_parquet"]

_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NANOS_AS = {"timestamp": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType()}


class MixedParquetTypes(SourceUnreadable):
    """Files of one Parquet location hold a column in types that cannot be read as one without loss."""


@dataclass(frozen=True)
class _Types:
    """How Spark reads one file: its columns (nanoseconds as bigint), and which are nanoseconds."""

    fields: tuple[tuple[str, T.DataType], ...]
    nanos: tuple[tuple[str, str], ...]
    """(column, "timestamp" or "timestamp_ntz"): TIMESTAMP(NANOS) in the footer, UTC instants or naive."""

    def effective(self) -> dict[str, T.DataType]:
        """The file's columns as read here: nanoseconds as timestamps."""
        nanos = dict(self.nanos)
        return {name: _NANOS_AS[nanos[name]] if name in nanos else kind for name, kind in self.fields}


def read_parquet(spark: SparkSession, where: str) -> DataFrame:
    """The Parquet file or folder at ``where``, lazily (only footers are read). Raises
    :class:`MixedParquetTypes` when its files hold a column in types not read as one without loss."""
    table = spark.read.format("parquet").load(where)
    relation = table._jdf.queryExecution().analyzed().relation()  # Spark's listing of the files, done by load()
    partitions = T.StructType.fromJson(_json(relation.partitionSchema()))
    groups: dict[_Types, list[str]] = {}
    for path, types in sorted(_file_types(spark, relation, set(partitions.fieldNames())).items()):
        groups.setdefault(types, []).append(path)
    if len(groups) == 1:  # the common case: every file alike, Spark's own read
        (types,) = groups
        nanos = dict(types.nanos)
        return _as_read(table, types, [(f.name, _NANOS_AS.get(nanos.get(f.name), f.dataType)) for f in table.schema.fields])
    target = _merged(groups, where)
    parts = []
    for types, paths in sorted(groups.items(), key=lambda g: g[1][0]):
        schema = T.StructType([T.StructField(n, t) for n, t in types.fields if n not in partitions.fieldNames()] + partitions.fields)
        # basePath: the folder's partition columns as for the whole folder, from each file's path
        group = spark.read.format("parquet").schema(schema).option("basePath", where).load(paths)
        parts.append(_as_read(group, types, target + [(f.name, f.dataType) for f in partitions.fields]))
    out = parts[0]
    for part in parts[1:]:
        out = out.union(part)  # by position: each part selects the columns in one order
    return out


def _json(jvm_struct: Any) -> dict:
    return json.loads(jvm_struct.json())


def _nullable(kind: T.DataType) -> T.DataType:
    """``kind`` with every part nullable: files that differ only there (a required field, a
    list of required elements) are read alike."""
    if isinstance(kind, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType)) for f in kind.fields])
    if isinstance(kind, T.ArrayType):
        return T.ArrayType(_nullable(kind.elementType))
    if isinstance(kind, T.MapType):
        return T.MapType(_nullable(kind.keyType), _nullable(kind.valueType))
    return kind


def _file_types(spark: SparkSession, relation: Any, partitions: set[str]) -> dict[str, _Types]:
    """Each file's types, from its footer; footers are read in parallel (parquet-hadoop's pool)."""
    jvm = spark.sparkContext._jvm
    statuses = jvm.scala.jdk.javaapi.CollectionConverters.asJava(relation.location().allFiles())
    footers = jvm.org.apache.parquet.hadoop.ParquetFileReader.readAllFootersInParallel(
        spark.sparkContext._jsc.hadoopConfiguration(), statuses, True
    )
    converter = jvm.org.apache.spark.sql.execution.datasources.parquet.ParquetToSparkSchemaConverter(
        spark._jsparkSession.sessionState().conf()
    )
    known: dict[str, _Types] = {}  # by the footer's schema text: the few distinct schemas are converted once
    out = {}
    for footer in footers:
        message = footer.getParquetMetadata().getFileMetaData().getSchema()
        text = message.toString()
        if text not in known:
            spark_schema = T.StructType.fromJson(_json(converter.convert(message)))
            known[text] = _Types(
                fields=tuple((f.name, _nullable(f.dataType)) for f in spark_schema.fields if f.name not in partitions),
                nanos=_nanos(message, {f.name for f in spark_schema.fields if isinstance(f.dataType, T.LongType)}),
            )
        out[str(footer.getFile().toString())] = known[text]
    return out


def _nanos(message: Any, longs: set[str]) -> tuple[tuple[str, str], ...]:
    """The top-level bigint columns of a footer that are TIMESTAMP(NANOS): pandas writes them,
    and Spark reads them only as their count (spark.sql.legacy.parquet.nanosAsLong, jobs/spark.py)."""
    found = []
    for field in message.getFields() if longs else []:
        logical = field.getLogicalTypeAnnotation() if field.isPrimitive() else None
        text = str(logical.toString()) if logical is not None else ""
        if field.getName() in longs and text.startswith("TIMESTAMP(NANOS"):
            found.append((str(field.getName()), "timestamp" if text.endswith("true)") else "timestamp_ntz"))  # true: UTC instants
    return tuple(found)


def _as_read(df: DataFrame, types: _Types, columns: list[tuple[str, T.DataType]]) -> DataFrame:
    """``df`` (files of ``types``) with ``columns`` in order: nanoseconds as timestamps, other
    types cast to the column's (a widening :func:`_merged` allowed), a column it lacks null."""
    nanos, present = dict(types.nanos), {f.name: f.dataType for f in df.schema.fields}
    if not nanos and [(n, present.get(n)) for n, _ in columns] == columns:
        return df
    out = []
    for name, kind in columns:
        c = ident(name)
        if name not in present:
            text = f"CAST(NULL AS {kind.simpleString()})"
        elif name in nanos:  # the count of nanoseconds, to the microsecond
            text = f"timestamp_micros(div({c}, 1000))"
            if nanos[name] == "timestamp_ntz":
                text = f"CAST({text} AS TIMESTAMP_NTZ)"
            if _NANOS_AS[nanos[name]] != kind:
                text = f"CAST({text} AS {kind.simpleString()})"
        elif present[name] != kind:
            text = f"CAST({c} AS {kind.simpleString()})"
        else:
            text = c
        out.append(f"{text} AS {c}")
    return df.selectExpr(*out)


def _merged(groups: dict[_Types, list[str]], where: str) -> list[tuple[str, T.DataType]]:
    """The folder's columns (in the order the files first have them, by file name) and the
    type each is read as; raises MixedParquetTypes for types that cannot be one without loss."""
    seen: dict[str, dict[T.DataType, str]] = {}  # column -> type -> the first file holding it so
    for types, paths in sorted(groups.items(), key=lambda g: g[1][0]):
        for name, kind in types.effective().items():
            seen.setdefault(name, {}).setdefault(kind, paths[0])
    columns, problems = [], []
    for name, kinds in seen.items():
        wide = _widest(list(kinds))
        if wide is None:
            found = ", ".join(f"{k.simpleString()} in {_relative(path, where)}" for k, path in kinds.items())
            problems.append(f"column {name!r} is {found}")
        else:
            columns.append((name, wide))
    if problems:
        raise MixedParquetTypes(
            f"the Parquet files of {where} disagree: {'; '.join(problems)}; only a widening that loses nothing is read "
            "(a smaller integer to a larger one, float to double, a timestamp without a time zone to one with): "
            "rewrite the files in one type"
        )
    return columns


def _widest(kinds: list[T.DataType]) -> T.DataType | None:
    """The type all of ``kinds`` widen to without loss, or None."""
    if len(kinds) == 1:
        return kinds[0]
    if all(isinstance(k, _INTEGERS) for k in kinds):
        return max(kinds, key=lambda k: _INTEGERS.index(type(k)))
    if all(isinstance(k, (T.FloatType, T.DoubleType)) for k in kinds):
        return T.DoubleType()
    if all(isinstance(k, (T.TimestampType, T.TimestampNTZType)) for k in kinds):
        return T.TimestampType()
    return None


def _relative(path: str, where: str) -> str:
    """A file's name within the location (the location is named once, in the message)."""
    base = _plain(str(where)).rstrip("/") + "/"
    return _plain(path).removeprefix(base)


def _plain(path: str) -> str:
    """A local path without the scheme Hadoop writes it with (file:/x, file:///x: /x)."""
    return "/" + path.removeprefix("file:").lstrip("/") if path.startswith("file:") else path

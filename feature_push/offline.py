"""Pushed rows appended to a source's offline table (Feast's ``POST /push`` with ``to: offline``
or ``online_and_offline``), without Spark: a Delta table through delta-rs, or a folder of
Parquet files.

All or nothing: every value is checked and cast to the table's own Arrow schema before
anything is written, so a bad value refuses the whole push (400, naming its row and column).
The table's schema never changes (no ``schema_mode``): a push has exactly the table's columns.

Safe beside the nightly Spark run reading the same table:

- Delta: a push is one commit (a new log version), atomic. A Spark reader reads the snapshot
  version it resolved when it started, so a commit made meanwhile is not seen, in part or
  whole: the next run reads it. The commit is made on the snapshot the schema was read from,
  so a schema changed meanwhile fails it (503, transient) instead of appending rows of the old
  one; a concurrent append is no conflict (delta-rs retries on the new version).
- Parquet folder: a push is one new file, written under a ``_``-prefixed name (Spark and
  pyarrow skip those) and renamed to ``part-<uuid>.parquet``: a listing has all of it or none.
  Only on a local disk, where a rename is atomic; object stores have no rename.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import uuid
from pathlib import Path
from typing import Any

from feature_defs import SourceDef
from feature_push.errors import PushError
from fm_config import RunConf
from fm_config.locations import Location

__all__ = ["append_offline"]

UTC = dt.UTC
_FLOAT32_MAX = 3.4028234663852886e38
_S3 = ("s3", "s3a", "s3n")


def append_offline(conf: RunConf, source: SourceDef, columns: dict[str, list], keys: list[str] | None = None) -> int:
    """Append the pushed rows (column name -> values, all lists the same length, as Feast's push
    body `df`) to ``source``'s table; returns rows appended. ``keys``: the table's entity key
    columns, with which a row tied with one the table holds is refused (``on_tie: fail``)."""
    where = _table_location(conf, source)
    rows = _row_count(columns)
    ties = _Ties(source, keys) if keys and source.on_tie == "fail" and source.timestamp_column else None
    if source.format == "parquet":
        return _append_parquet(source, where, columns, rows, ties)
    return _append_delta(conf, source, where, columns, rows, ties)


def _table_location(conf: RunConf, source: SourceDef) -> Location:
    """Where the nightly run reads the source: a URI or absolute path as it is, else under data_root."""
    if source.table is not None:
        raise PushError(
            f"source {source.name!r} reads the catalog table {source.table}: appending to it needs Spark (the catalog knows its "
            "location and format); push to: online, or give the source a 'location' (a Delta table or a folder of Parquet files)",
            501,
            "OfflineUnsupported",
        )
    return conf.table_path(source.location)


def _row_count(columns: dict[str, list]) -> int:
    if not isinstance(columns, dict) or not columns:
        raise PushError("the push has no columns: `df` maps each of the table's columns to a list of values")
    lengths = {}
    for name, values in columns.items():
        if not isinstance(values, list):
            raise PushError(f"column {name}: expected a list of values (one a row), found {_show(values)}")
        lengths[name] = len(values)
    if len(set(lengths.values())) > 1:
        (first, n), *_ = lengths.items()
        other, m = next((c, k) for c, k in lengths.items() if k != n)
        raise PushError(f"column {other} has {m} values and column {first} {n}: every column needs one value a row")
    return next(iter(lengths.values()))


# -- Delta -------------------------------------------------------------------------------


def _append_delta(conf: RunConf, source: SourceDef, where: Location, columns: dict[str, list], rows: int, ties: _Ties | None) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

    uri, options = _delta_uri(conf, where)
    try:
        table = DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        # never created here: a table made from a push would have the push's types, not the ETL's
        hint = " (it holds Parquet files: set format: parquet)" if where.is_local and any(Path(where).glob("*.parquet")) else ""
        raise PushError(f"no Delta table at {where} to append to (a push never creates one){hint}", 500, "OfflineTableMissing") from None
    except (DeltaError, OSError) as exc:
        raise _unavailable(f"cannot open the Delta table at {where}", exc) from None
    data = _cast(source, pa.schema(table.schema().to_arrow()), columns, rows)
    if rows == 0:
        return 0  # no empty commit
    if ties is not None:
        ties.check(table.to_pyarrow_dataset, data, where)
    try:
        write_deltalake(table, data, mode="append")
    except CommitFailedError as exc:
        if "Unsupported table features" in str(exc):
            raise PushError(
                f"the Delta table at {where} uses writer features delta-rs {_deltalake_version()} cannot write "
                f"({_first_line(exc)}): a push cannot append to it; push to: online, or write it with Spark",
                501,
                "OfflineUnsupported",
            ) from None
        raise PushError(f"the append to {where} was not committed: {_first_line(exc)}", 503, "OfflineConflict", transient=True) from None
    except DeltaError as exc:
        if "Invalid data found" in str(exc):  # the table's CHECK constraints (nulls were refused above, by row)
            raise PushError(f"the Delta table at {where} refuses the rows (its constraints): {_first_line(exc)}") from None
        raise _unavailable(f"cannot append to the Delta table at {where}", exc) from None
    except OSError as exc:
        raise _unavailable(f"cannot append to the Delta table at {where}", exc) from None
    return rows


def _delta_uri(conf: RunConf, where: Location) -> tuple[str, dict[str, str] | None]:
    """delta-rs's URI of ``where`` and its storage options: credentials from the environment,
    as the driver's own files (fm_config.locations.Files); the endpoint and region from
    ``storage``."""
    if where.is_local or where.startswith("file:"):
        return str(where.local_path()), None
    scheme, rest = where.split("://", 1)
    if scheme.lower() not in _S3:
        return str(where), None
    options = {}
    if conf.storage.s3_endpoint:
        options["AWS_ENDPOINT_URL"] = conf.storage.s3_endpoint
        if conf.storage.s3_endpoint.startswith("http:"):
            options["AWS_ALLOW_HTTP"] = "true"
    if conf.storage.s3_region:
        options["AWS_REGION"] = conf.storage.s3_region
    return "s3://" + rest, options or None


def _deltalake_version() -> str:
    import deltalake

    return deltalake.__version__


# -- Parquet -----------------------------------------------------------------------------


def _append_parquet(source: SourceDef, where: Location, columns: dict[str, list], rows: int, ties: _Ties | None) -> int:
    import pyarrow.parquet as pq

    folder, files = _parquet_folder(where)
    schema, int96 = _newest_schema(where, files)
    data = _cast(source, schema, columns, rows)
    if rows == 0:
        return 0
    if ties is not None:
        import pyarrow.dataset as ds

        ties.check(lambda: ds.dataset([str(p) for p in files], schema=data.schema, format="parquet"), data, where)
    name = f"part-{uuid.uuid4()}.parquet"
    temp = folder / f"_push-{name}"
    try:
        # a folder Spark wrote keeps its timestamps in INT96: ours alike, so every file reads in one type
        pq.write_table(data, temp, use_deprecated_int96_timestamps=int96)
        os.replace(temp, folder / name)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise _unavailable(f"cannot write to the Parquet folder {where}", exc) from None
    return rows


def _parquet_folder(where: Location) -> tuple[Path, list[Path]]:
    """The folder a push appends to and its Parquet files; PushError where it cannot (not local,
    one file, missing, partitioned, empty)."""
    if not (where.is_local or where.startswith("file:")):
        raise PushError(
            f"the Parquet folder {where} is not on a local disk: a push appends to a Parquet folder by an atomic rename, "
            "which object stores lack; a Delta table works at any location",
            501,
            "OfflineUnsupported",
        )
    folder = where.local_path()
    if folder.is_file():
        raise PushError(
            f"the source's location {where} is one Parquet file, which cannot be appended to; "
            "a folder of Parquet files (the file moved into one) or a Delta table works",
            501,
            "OfflineUnsupported",
        )
    if not folder.is_dir():
        raise PushError(f"no Parquet folder at {where} to append to (a push never creates one)", 500, "OfflineTableMissing")
    visible = [p for p in folder.iterdir() if not p.name.startswith(("_", "."))]
    partitions = sorted(p.name for p in visible if p.is_dir() and "=" in p.name)
    if partitions:
        raise PushError(
            f"the Parquet folder {where} is partitioned ({partitions[0]}/...): a push does not write partition folders; "
            "an unpartitioned folder or a Delta table (partitioned or not) works",
            501,
            "OfflineUnsupported",
        )
    files = [p for p in visible if p.is_file() and p.suffix == ".parquet"]
    if not files:
        raise PushError(f"no Parquet files in {where} to take the table's columns from", 500, "OfflineTableMissing")
    return folder, files


def _newest_schema(where: Location, files: list[Path]):
    """The newest file's schema (the ETL's current one), without its key-value metadata (pandas'
    would describe the other file's index), and whether its timestamps are INT96."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    newest = max(files, key=lambda p: (p.stat().st_mtime_ns, p.name))
    try:
        footer = pq.read_metadata(newest).schema
    except (pa.ArrowException, OSError) as exc:
        raise PushError(
            f"the newest file of the Parquet folder {where}, {newest.name}, is not Parquet ({_first_line(exc)}): the nightly run "
            "reading this folder fails on it too; remove or replace it, then push again",
            409,
            "OfflineTableBroken",
        ) from None
    int96 = any(footer.column(i).physical_type == "INT96" for i in range(len(footer)))
    return footer.to_arrow_schema().remove_metadata(), int96


# -- ties ----------------------------------------------------------------------------------


class _Ties:
    """A pushed row as recent as a row the table holds for its entity (event time and, where
    the source has one, created time) with other feature values is a tie, which the next run
    of the source refuses for all of it (``on_tie: fail``): refused before the append. An
    exact copy is no tie (a retried push): de-duplication keeps one."""

    def __init__(self, source: SourceDef, keys: list[str]):
        self.source = source
        times = [source.timestamp_column, *([source.created_column] if source.created_column else [])]
        self.match = [*keys, *times]
        self.values = [c for f in source.features if (c := f.source_column or f.name) not in self.match]

    def check(self, dataset, data, where) -> None:
        """``dataset``: makes the table's pyarrow dataset. A table that cannot be read is refused
        as the nightly run would find it: a file that is not what its table says, 409; storage
        that did not answer, 503."""
        import pyarrow as pa

        try:
            self._check(dataset, data, where)
        except pa.ArrowInvalid as exc:
            raise PushError(
                f"the table at {where} cannot be read to look for ties ({_first_line(exc)}): the nightly run reading it "
                "fails too; mend the table, then push again",
                409,
                "OfflineTableBroken",
            ) from None
        except (OSError, pa.ArrowException) as exc:
            raise _unavailable(f"cannot read the table at {where} to look for ties", exc) from None

    def _check(self, dataset, data, where) -> None:
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        match = [c for c in self.match if c in data.column_names]
        names = [*match, *(c for c in self.values if c in data.column_names)]
        ts = self.source.timestamp_column
        held = dataset().to_table(columns=names, filter=ds.field(ts).isin(pc.unique(data.column(ts))))
        if held.num_rows == 0:
            return
        pushed = {tuple(r[c] for c in match): r for r in data.select(names).to_pylist()}
        for row in held.to_pylist():
            mine = pushed.get(tuple(row[c] for c in match))
            if mine is not None and any(mine[c] != row[c] for c in names if c not in match):
                shown = ", ".join(f"{c}={mine[c]}" for c in match)
                raise PushError(
                    f"the table at {where} holds a row as recent as the pushed one ({shown}) with other values: a tie, "
                    f"which the next run of source {self.source.name!r} refuses whole (on_tie: fail); push a later event "
                    "time, or to: online",
                    409,
                    "Tie",
                )


# -- values --------------------------------------------------------------------------------


def _cast(source: SourceDef, schema, columns: dict[str, list], rows: int):
    """The pushed columns as a pyarrow Table of ``schema``, or a PushError naming the first bad
    value (the lowest row; of those, the table's first column)."""
    import pyarrow as pa

    missing = [f.name for f in schema if f.name not in columns]
    unknown = [c for c in columns if c not in schema.names]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"lacks the table's column{'s' * (len(missing) > 1)} {', '.join(missing)}")
        if unknown:
            parts.append(f"has column{'s' * (len(unknown) > 1)} the table does not: {', '.join(unknown)}")
        raise PushError(f"the push {' and '.join(parts)} (a push has exactly the table's columns: {', '.join(schema.names)})")
    problems: list[tuple[int, int, str]] = []  # (row, column's position, message)
    arrays = []
    for position, field in enumerate(schema):
        values, problem = _column(source, field, columns[field.name])
        if problem is None:
            try:
                arrays.append(pa.array(values, type=field.type))
                continue
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                problem = _arrow_problem(field, values)
        problems.append((problem[0], position, problem[1]))
    if problems:
        raise PushError(min(problems)[2])
    return pa.Table.from_arrays(arrays, schema=schema)


def _column(source: SourceDef, field, values: list) -> tuple[list, tuple[int, str] | None]:
    """The column's values as pyarrow takes them for ``field``, or its first bad one: (row, message)."""
    out = []
    for row, value in enumerate(values):
        if value is None:
            if not field.nullable:
                return out, (row, _at(row, field, "no value, and the table's column takes no nulls"))
            if field.name == source.timestamp_column:
                return out, (row, _at(row, field, "no value: every pushed row needs its event time"))
            out.append(None)
            continue
        try:
            out.append(_value(value, field.type))
        except _Bad as bad:
            return out, (row, _at(row, field, str(bad)))
    return out, None


def _arrow_problem(field, values: list) -> tuple[int, str]:
    """The first value pyarrow refuses, one at a time (what it refused a whole column for)."""
    import pyarrow as pa

    for row, value in enumerate(values):
        try:
            pa.array([value], type=field.type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            return row, _at(row, field, f"{_show(value)} does not fit {field.type}: {_first_line(exc)}")
    return 0, f"column {field.name}: does not fit {field.type}"


def _at(row: int, field, message: str) -> str:
    return f"row {row}, column {field.name}: {message}"


class _Bad(ValueError):
    """A value that does not fit its column's type (the message says why)."""


def _value(value: Any, kind) -> Any:
    """``value`` (as JSON decoded it) as a Python value of the Arrow type ``kind``; raises _Bad.
    Stricter than pyarrow's own conversion, which truncates 3.5 to an integer 3, takes true for
    1.0 and a too large float32 for infinity."""
    import pyarrow.types as t

    if t.is_timestamp(kind):
        return _timestamp(value, kind)
    if t.is_date(kind):
        return _date(value)
    if t.is_boolean(kind):
        if isinstance(value, bool):
            return value
        raise _Bad(f"expected true or false, found {_show(value)}")
    if t.is_integer(kind):
        return _integer(value, kind)
    if t.is_floating(kind):
        return _float(value, kind)
    if t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        if isinstance(value, str):
            return value
        raise _Bad(f"expected a string, found {_show(value)}")
    if t.is_decimal(kind):
        return _decimal(value)
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        return _list(value, kind)
    if t.is_struct(kind):
        return _struct(value, kind)
    return value  # any other type: pyarrow's own conversion, checked value by value on failure


def _date(value: Any) -> dt.date:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise _Bad(f"expected a date (YYYY-MM-DD), found {_show(value)}")


def _integer(value: Any, kind) -> int:
    """An integer, or a float with no fraction, within the range of the integer type ``kind``."""
    import pyarrow.types as t

    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None:
        raise _Bad(f"expected an integer, found {_show(value)}")
    bits = kind.bit_width
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if t.is_signed_integer(kind) else (0, 2**bits - 1)
    if not low <= number <= high:
        raise _Bad(f"{number} is out of the range of {kind} ({low} .. {high})")
    return number


def _float(value: Any, kind) -> float:
    """A finite number (not a boolean) within the range of the floating type ``kind``."""
    import pyarrow.types as t

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"expected a number, found {_show(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise _Bad(f"{value} is out of the range of {kind}") from None
    if not math.isfinite(number):
        raise _Bad("NaN and infinities are not taken (as a push to the online store)")
    if t.is_float32(kind) and abs(number) > _FLOAT32_MAX:
        raise _Bad(f"{value} is out of the range of float32")
    return number


def _decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, decimal.Decimal)):
        raise _Bad(f"expected a decimal number, found {_show(value)}")
    try:
        return decimal.Decimal(str(value))
    except decimal.InvalidOperation:
        raise _Bad(f"expected a decimal number, found {_show(value)}") from None


def _list(value: Any, kind) -> list:
    """A list, each element (None kept) as a value of the list type's element type."""
    if not isinstance(value, list):
        raise _Bad(f"expected a list, found {_show(value)}")
    out = []
    for i, item in enumerate(value):
        try:
            out.append(None if item is None else _value(item, kind.value_type))
        except _Bad as bad:
            raise _Bad(f"element {i}: {bad}") from None
    return out


def _struct(value: Any, kind) -> dict:
    """An object with no key that is not a field of the struct type; each field's value (None
    for a missing one) as a value of its type."""
    if not isinstance(value, dict):
        raise _Bad(f"expected an object, found {_show(value)}")
    names = [kind.field(i).name for i in range(kind.num_fields)]
    extra = [k for k in value if k not in names]
    if extra:
        raise _Bad(f"the object has {_show(extra[0])}, not a field of {kind}")
    out = {}
    for i, name in enumerate(names):
        item = value.get(name)
        try:
            out[name] = None if item is None else _value(item, kind.field(i).type)
        except _Bad as bad:
            raise _Bad(f"field {name}: {bad}") from None
    return out


def _timestamp(value: Any, kind) -> dt.datetime:
    """An ISO-8601 text (naive: UTC) or epoch seconds as a UTC time: aware or naive as the column is."""
    if isinstance(value, str):
        try:
            when = dt.datetime.fromisoformat(value)
        except ValueError:
            raise _Bad(f"expected an ISO-8601 time (2026-11-28T10:00:00Z) or epoch seconds, found {_show(value)}") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            when = dt.datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            raise _Bad(f"{value} is out of the range of epoch seconds (a time in seconds since 1970-01-01 UTC)") from None
    elif isinstance(value, dt.datetime):
        when = value
    else:
        raise _Bad(f"expected an ISO-8601 time (2026-11-28T10:00:00Z) or epoch seconds, found {_show(value)}")
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    return when if kind.tz else when.replace(tzinfo=None)


def _unavailable(what: str, exc: BaseException) -> PushError:
    """The table could not be reached or written (storage, a concurrent commit): a retry may do."""
    return PushError(f"{what}: {_first_line(exc)}", 503, "OfflineUnavailable", transient=True)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]

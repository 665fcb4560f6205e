"""Spark SQL text for expressions built in bulk (``selectExpr``: one call for hundreds).

A ``Column`` built in Python costs a round trip to the JVM per function and operator, and
another when Python frees it: the gate's 405 aggregates took about 1 s of the driver to
build that way, longer than Spark took to plan and run them on 10,000 rows."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import numpy as np


def ident(name: str) -> str:
    """A column name, quoted: any character may appear in it."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: object) -> str:
    """A Python value as a Spark SQL literal of the type ``F.lit`` gives it (bool, bigint,
    double, decimal, string, date, timestamp; numpy scalars as their Python values)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"{value} does not fit a 64-bit integer")
        return f"{value}L"
    if isinstance(value, float):
        if math.isnan(value):
            return "CAST('NaN' AS DOUBLE)"
        if math.isinf(value):
            return f"CAST('{'' if value > 0 else '-'}Infinity' AS DOUBLE)"
        return f"{value!r}D"  # repr: the shortest text that reads back the same double; D: not a decimal
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, Decimal) and value.is_finite():
        return f"{value}BD"
    if isinstance(value, dt.datetime):  # before date: a datetime is a date
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    raise TypeError(f"no SQL literal for {type(value).__name__} {value!r}")

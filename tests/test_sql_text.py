"""SQL text built by jobs/sql_text.py reads back, in Spark itself, as the Python value it came from."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import numpy as np
import pytest

from jobs.sql_text import ident, literal

VALUES = [
    None, True, False, 0, -7, 2**63 - 1, -(2**63), 0.5, -0.0, 1e20, 1e-05, 3.4028234663852886e38, 5e-324, 0.1 + 0.2,
    "", "it's", "back\\slash", "quote\\'mix", "ünïcødé ✓", "line\nbreak", "tab\tand `tick`", "100%_like",
]  # fmt: skip


def test_literals_read_back_as_the_same_values_and_types(spark):
    row = spark.range(1).selectExpr(*[f"{literal(v)} AS {ident(f'v{i}')}" for i, v in enumerate(VALUES)]).first()
    types = dict(spark.range(1).selectExpr(*[f"{literal(v)} AS {ident(f'v{i}')}" for i, v in enumerate(VALUES)]).dtypes)
    for i, v in enumerate(VALUES):
        got = row[f"v{i}"]
        assert got == v and type(got) is type(v), (v, got)
        if isinstance(v, float):
            assert types[f"v{i}"] == "double" and math.copysign(1, got) == math.copysign(1, v)
        if isinstance(v, int) and not isinstance(v, bool):
            assert types[f"v{i}"] == "bigint"


def test_dates_timestamps_decimals_and_numpy_scalars(spark):
    values = [
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 13, 5, 7, 123456),
        Decimal("12.340"),
        Decimal("-1E+3"),
        np.int64(7),
        np.float64(0.25),
        np.bool_(True),
    ]
    row = spark.range(1).selectExpr(*[f"{literal(v)} AS v{i}" for i, v in enumerate(values)]).first()
    assert list(row) == [
        dt.date(2024, 2, 29),
        dt.datetime(2024, 2, 29, 13, 5, 7, 123456),
        Decimal("12.340"),
        Decimal("-1E+3"),
        7,
        0.25,
        True,
    ]
    assert [type(v) for v in row] == [dt.date, dt.datetime, Decimal, Decimal, int, float, bool]


def test_non_finite_doubles_and_refusals(spark):
    row = spark.range(1).selectExpr(f"{literal(math.inf)} AS a", f"{literal(-math.inf)} AS b", f"{literal(math.nan)} AS c").first()
    assert row["a"] == math.inf and row["b"] == -math.inf and math.isnan(row["c"])
    with pytest.raises(ValueError, match="64-bit"):
        literal(2**63)
    with pytest.raises(TypeError, match="no SQL literal"):
        literal(object())


def test_any_column_name_is_quoted(spark):
    names = ["plain", "with space", "p|a|b", "dot.ted", "back`tick", "ünï"]
    df = spark.createDataFrame([tuple(range(len(names)))], [*names])
    assert list(df.selectExpr(*[f"{ident(n)} AS {ident(n + '!')}" for n in names]).first()) == list(range(len(names)))

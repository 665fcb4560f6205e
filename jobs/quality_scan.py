"""The gate's checks and the profile in one Spark job: one aggregation over the snapshot.

great-expectations computes each expectation's metrics with Spark jobs of its own; the
checks derived from the definitions are of five kinds whose metrics are counts, so
they are computed here as columns of a single aggregation, together with the profile,
with great-expectations' semantics (what ``element_count``, ``unexpected_count``,
``missing_count`` and the percentages mean, how ``mostly`` and nulls count, pinned by
tests/test_quality_scan.py against great-expectations itself). Expectations of any other
kind (declared in a definition's ``expectations``) are left to great-expectations.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from feature_defs import SourceDef

NUMERIC = ("float", "int")
LISTS = ("embedding", "int_list", "string_list")
EXAMPLES = 20
"""Unexpected values listed per failed check (great-expectations' partial_unexpected_list)."""

SCANNED = frozenset(
    {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_be_of_type",
        "expect_table_row_count_to_be_between",
    }
)
"""Expectation types computed here; any other runs in great-expectations."""

_ARGS = {
    "expect_column_values_to_not_be_null": {"column", "mostly"},
    "expect_column_values_to_be_between": {"column", "min_value", "max_value", "mostly"},
    "expect_column_values_to_be_in_set": {"column", "value_set", "mostly"},
    "expect_column_values_to_be_of_type": {"column", "type_"},
    "expect_table_row_count_to_be_between": {"min_value", "max_value"},
}


def scanned(check) -> bool:
    """Whether the scan computes this check (its type, and only arguments the scan knows)."""
    return check.type in SCANNED and set(check.kwargs) <= _ARGS[check.type]


def _unexpected(check) -> Column | None:
    """True on a non-null value the check does not accept (None: not a per-value check)."""
    k = check.kwargs
    c = F.col(k["column"]) if "column" in k else None
    if check.type == "expect_column_values_to_be_between":
        bad = F.lit(False)
        if k.get("min_value") is not None:
            bad = bad | (c < F.lit(k["min_value"]))
        if k.get("max_value") is not None:
            bad = bad | (c > F.lit(k["max_value"]))
        return c.isNotNull() & bad
    if check.type == "expect_column_values_to_be_in_set":
        return c.isNotNull() & ~c.isin(list(k["value_set"]))
    if check.type == "expect_column_values_to_not_be_null":
        return c.isNull()
    return None


def _profile_aggs(source: SourceDef) -> list[Column]:
    aggs: list[Column] = []
    for f in source.features:
        c = F.col(f.name)
        aggs.append(F.count(c).alias(f"p|{f.name}|n"))
        if f.type in NUMERIC:
            valid = c.cast("double")  # NaN/inf are already null in the validation frame
            aggs += [
                F.sum((c == 0).cast("long")).alias(f"p|{f.name}|zero"),
                F.min(valid).alias(f"p|{f.name}|min"),
                F.max(valid).alias(f"p|{f.name}|max"),
                F.avg(valid).alias(f"p|{f.name}|mean"),
            ]
        elif f.type == "bool":
            aggs.append(F.sum((~c).cast("long")).alias(f"p|{f.name}|zero"))
        elif f.type in LISTS:
            size = F.when(c.isNotNull(), F.size(c))
            aggs += [F.min(size).alias(f"p|{f.name}|len_min"), F.max(size).alias(f"p|{f.name}|len_max"), F.avg(size).alias(f"p|{f.name}|len_mean")]
    return aggs


def _profile(row: dict, rows: int, source: SourceDef) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in source.features:
        stats: dict[str, Any] = {"null_fraction": (rows - row[f"p|{f.name}|n"]) / rows if rows else 0.0}
        if f"p|{f.name}|zero" in row:
            stats["zero_fraction"] = (row[f"p|{f.name}|zero"] or 0) / rows if rows else 0.0
        for key in ("min", "max", "mean", "len_min", "len_max", "len_mean"):
            if f"p|{f.name}|{key}" in row:
                stats[key] = row[f"p|{f.name}|{key}"]
        out[f.name] = stats
    return out


def scan(df: DataFrame, checks: list, source: SourceDef) -> tuple[dict[int, tuple[bool, dict]], dict[str, dict[str, Any]]]:
    """(success, great-expectations' result dict) per index of a scanned check, and the
    profile: every figure from one aggregation of ``df``."""
    aggs = [F.count(F.lit(1)).alias("rows"), *_profile_aggs(source)]
    for i, check in enumerate(checks):
        if not scanned(check) or "column" not in check.kwargs:
            continue
        aggs.append(F.count(F.col(check.kwargs["column"])).alias(f"c|{i}|present"))
        bad = _unexpected(check)
        if bad is not None:
            aggs.append(F.sum(bad.cast("long")).alias(f"c|{i}|bad"))
    row = df.agg(*aggs).first().asDict()
    rows = row["rows"]
    types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
    out = {i: _result(check, row, i, rows, types) for i, check in enumerate(checks) if scanned(check)}
    return out, _profile(row, rows, source)


def _result(check, row: dict, i: int, rows: int, types: dict[str, str]) -> tuple[bool, dict]:
    k = check.kwargs
    if check.type == "expect_table_row_count_to_be_between":
        ok = (k.get("min_value") is None or rows >= k["min_value"]) and (k.get("max_value") is None or rows <= k["max_value"])
        return ok, {"observed_value": rows}
    if check.type == "expect_column_values_to_be_of_type":
        observed = types.get(k["column"])
        return observed == k["type_"], {"observed_value": observed}
    present, bad = row[f"c|{i}|present"], row[f"c|{i}|bad"] or 0
    mostly = k.get("mostly", 1.0)
    if check.type == "expect_column_values_to_not_be_null":
        # nulls are the unexpected values: counted over every row
        ok = rows == 0 or (rows - bad) / rows >= mostly
        return ok, {"element_count": rows, "unexpected_count": bad, "unexpected_percent": 100.0 * bad / rows if rows else None}
    # other column checks ignore nulls: percentages of the values present
    missing = rows - present
    ok = present == 0 or (present - bad) / present >= mostly
    return ok, {
        "element_count": rows,
        "unexpected_count": bad,
        "unexpected_percent": 100.0 * bad / present if present else None,
        "missing_count": missing,
        "missing_percent": 100.0 * missing / rows if rows else None,
        "unexpected_percent_total": 100.0 * bad / rows if rows else None,
        "unexpected_percent_nonmissing": 100.0 * bad / present if present else None,
    }


def unexpected_examples(df: DataFrame, check) -> list:
    """A few unexpected values of a failed per-value check (a small job, on failure only)."""
    bad = _unexpected(check)
    if bad is None:
        return []
    return [r[0] for r in df.where(bad).select(check.kwargs["column"]).limit(EXAMPLES).collect()]

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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from feature_defs import SourceDef
from jobs.sql_text import ident, literal

NUMERIC = ("float", "int")
LISTS = ("embedding", "int_list", "string_list", "float_list")
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


def _unexpected(check) -> str | None:
    """SQL: true on a non-null value the check does not accept (None: not a per-value check)."""
    k = check.kwargs
    c = ident(k["column"]) if "column" in k else None
    if check.type == "expect_column_values_to_be_between":
        bad = [f"{c} {op} {literal(k[bound])}" for op, bound in (("<", "min_value"), (">", "max_value")) if k.get(bound) is not None]
        return f"({c} IS NOT NULL AND ({' OR '.join(bad) or 'false'}))"
    if check.type == "expect_column_values_to_be_in_set":
        values = list(k["value_set"])
        inside = f"{c} IN ({', '.join(literal(v) for v in values)})" if values else "false"
        return f"({c} IS NOT NULL AND NOT ({inside}))"
    if check.type == "expect_column_values_to_not_be_null":
        return f"({c} IS NULL)"
    return None


def _profile_aggs(source: SourceDef) -> dict[str, str]:
    """The profile's aggregates: SQL text -> name (quoted)."""
    aggs: list[tuple[str, str]] = []
    for f in source.features:
        c = ident(f.name)

        def named(text: str, key: str, f=f) -> tuple[str, str]:  # called in this iteration only
            return text, ident(f"p|{f.name}|{key}")

        aggs.append(named(f"count({c})", "n"))
        if f.type in NUMERIC:
            valid = f"CAST({c} AS DOUBLE)"  # NaN/inf are already null in the validation frame
            aggs += [
                named(f"sum(CAST(({c} = 0) AS BIGINT))", "zero"),
                named(f"min({valid})", "min"),
                named(f"max({valid})", "max"),
                named(f"avg({valid})", "mean"),
            ]
        elif f.type == "bool":
            aggs.append(named(f"sum(CAST((NOT {c}) AS BIGINT))", "zero"))
        elif f.type in LISTS:
            size = f"CASE WHEN {c} IS NOT NULL THEN size({c}) END"
            aggs += [named(f"min({size})", "len_min"), named(f"max({size})", "len_max"), named(f"avg({size})", "len_mean")]
    return dict(aggs)


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
    profile: every figure from one aggregation of ``df``.

    Each aggregate is computed once however many checks read it (a column's count of values
    is the profile's), and a not-null check's nulls are the rows less that count: the plan
    grows by the features, not by the checks on them (1,000 features made about 6,000
    aggregates, each costing the planner and the code generator, before the data counted)."""
    aggs = {"count(1)": "rows", **_profile_aggs(source)}

    def aggregate(text: str, name: str) -> str:
        """The name of the aggregate ``text`` (added under ``name`` when it is new)."""
        return aggs.setdefault(text, ident(name))

    names: dict[int, tuple[str, str | None]] = {}
    for i, check in enumerate(checks):
        if not scanned(check) or "column" not in check.kwargs:
            continue
        present = aggregate(f"count({ident(check.kwargs['column'])})", f"c|{i}|present")
        bad = _unexpected(check) if check.type != "expect_column_values_to_not_be_null" else None
        names[i] = (present, bad and aggregate(f"sum(CAST({bad} AS BIGINT))", f"c|{i}|bad"))
    # SQL text: one call to the JVM (jobs/sql_text.py)
    row = df.selectExpr(*[f"{text} AS {name}" for text, name in aggs.items()]).first().asDict()
    rows = row["rows"]
    types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
    out = {}
    for i, check in enumerate(checks):
        if not scanned(check):
            continue
        counts = None
        if i in names:
            present, bad = names[i]
            counts = (row[_unquoted(present)], None if bad is None else row[_unquoted(bad)] or 0)
        out[i] = _result(check, counts, rows, types)
    return out, _profile(row, rows, source)


def _unquoted(name: str) -> str:
    """An aggregate's name as the result row has it (ident() quotes it in the SQL text)."""
    return name[1:-1].replace("``", "`") if name.startswith("`") else name


def _result(check, counts: tuple[int, int | None] | None, rows: int, types: dict[str, str]) -> tuple[bool, dict]:
    """A check's outcome from ``counts``: (values present, unexpected values present; None for a
    not-null check, whose unexpected values are the nulls)."""
    k = check.kwargs
    if check.type == "expect_table_row_count_to_be_between":
        ok = (k.get("min_value") is None or rows >= k["min_value"]) and (k.get("max_value") is None or rows <= k["max_value"])
        return ok, {"observed_value": rows}
    if check.type == "expect_column_values_to_be_of_type":
        observed = types.get(k["column"])
        return observed == k["type_"], {"observed_value": observed}
    present, bad = counts
    mostly = k.get("mostly", 1.0)
    if check.type == "expect_column_values_to_not_be_null":
        # nulls are the unexpected values: counted over every row
        bad = rows - present
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
    return [r[0] for r in df.where(F.expr(bad)).select(F.col(ident(check.kwargs["column"]))).limit(EXAMPLES).collect()]

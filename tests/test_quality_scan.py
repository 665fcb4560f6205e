"""The gate's one-pass scan against great-expectations itself: the same checks on the same
Spark DataFrame, computed by the scan (one aggregation) and by great-expectations' own
Spark engine, give the same success and the same result figures."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.pipeline.gate.checks import Expectation, _gx_context, _run_with_gx, run_gate
from jobs.pipeline.gate.scan import SCANNED, scan, scanned

FIGURES = ("element_count", "unexpected_count", "unexpected_percent", "missing_count", "missing_percent",
           "unexpected_percent_total", "unexpected_percent_nonmissing", "observed_value")  # fmt: skip

CHECKS = [
    Expectation("a not null", "expect_column_values_to_not_be_null", {"column": "a"}),
    Expectation("a mostly not null", "expect_column_values_to_not_be_null", {"column": "a", "mostly": 0.75}),
    Expectation("a too strict", "expect_column_values_to_not_be_null", {"column": "a", "mostly": 0.9}),
    Expectation("b in [0, 1]", "expect_column_values_to_be_between", {"column": "b", "min_value": 0.0, "max_value": 1.0}),
    Expectation(
        "b mostly in [0, 1]", "expect_column_values_to_be_between", {"column": "b", "min_value": 0.0, "max_value": 1.0, "mostly": 0.8}
    ),
    Expectation("b at most 1", "expect_column_values_to_be_between", {"column": "b", "min_value": None, "max_value": 1.0}),
    Expectation("b at least 0.45", "expect_column_values_to_be_between", {"column": "b", "min_value": 0.45}),
    Expectation("n in [3, 3]", "expect_column_values_to_be_between", {"column": "n", "min_value": 3, "max_value": 3}),
    Expectation("c in set", "expect_column_values_to_be_in_set", {"column": "c", "value_set": ["x", "y", "z"]}),
    Expectation("c mostly in set", "expect_column_values_to_be_in_set", {"column": "c", "value_set": ["x", "y", "z"], "mostly": 0.5}),
    Expectation("n in set", "expect_column_values_to_be_in_set", {"column": "n", "value_set": [0]}),
    Expectation("a is long", "expect_column_values_to_be_of_type", {"column": "a", "type_": "LongType"}),
    Expectation("b is float", "expect_column_values_to_be_of_type", {"column": "b", "type_": "FloatType"}),
    Expectation("rows in [1, 5]", "expect_table_row_count_to_be_between", {"min_value": 1, "max_value": 5}),
    Expectation("rows in [5, 50]", "expect_table_row_count_to_be_between", {"min_value": 5, "max_value": 50}),
]
ROWS = [
    (1, 0.5, "x", 3), (None, 2.0, "y", 3), (3, None, "z", 3), (4, 0.1, None, 3), (None, 0.2, "x", 0),
    (6, 0.3, "x", 3), (7, 0.4, "x", 3), (8, 0.5, "x", None), (9, 0.6, "x", 3), (10, 0.7, "q", 3),
]  # fmt: skip


# the scan reads a source's feature names and types (for the profile)
SOURCE = SimpleNamespace(features=[SimpleNamespace(name=n, type=t) for n, t in (("a", "int"), ("b", "float"), ("c", "string"))])


@pytest.fixture(scope="module")
def frame(spark):
    return spark.createDataFrame(ROWS, "a long, b double, c string, n long").cache()


def test_every_derived_check_kind_is_scanned():
    assert {c.type for c in CHECKS} == SCANNED and all(scanned(c) for c in CHECKS)
    # an argument the scan does not know (strict bounds) leaves the check to great-expectations
    assert not scanned(Expectation("x", "expect_column_values_to_be_between", {"column": "b", "min_value": 0, "strict_min": True}))


def test_the_scan_gives_what_great_expectations_gives(frame):
    found, profile = scan(frame, CHECKS, SOURCE)
    assert profile["a"]["null_fraction"] == 0.2 and (profile["b"]["min"], profile["b"]["max"]) == (0.1, 2.0)
    assert profile["c"] == {"null_fraction": 0.1}
    by_gx = _run_with_gx(_gx_context(), frame, CHECKS, "scan by great-expectations")
    assert len(by_gx) == len(CHECKS)
    outcomes = set()
    for i, (check, theirs) in enumerate(zip(CHECKS, by_gx)):
        success, ours = found[i]
        assert success == theirs.success, check.name
        outcomes.add(success)
        for figure in FIGURES:
            if figure in theirs.result:
                assert ours.get(figure) == pytest.approx(theirs.result[figure]), (check.name, figure)
    assert outcomes == {True, False}  # both outcomes covered


def test_other_kinds_run_in_great_expectations_and_keep_their_place(frame, tmp_path):
    checks = [CHECKS[0], Expectation("a unique", "expect_column_values_to_be_unique", {"column": "a"}), CHECKS[-1]]
    result = run_gate(frame, checks, source=SOURCE, suite_name="mixed", run_name="mixed run", docs_dir=tmp_path / "docs")
    assert [r.name for r in result.results] == ["a not null", "a unique", "rows in [5, 50]"]
    assert [r.success for r in result.results] == [False, True, True]
    assert result.results[1].element_count == 10 and result.results[0].unexpected_count == 2
    assert result.data_docs == str(tmp_path / "docs" / "index.html")


def test_a_failed_range_check_lists_unexpected_values(frame, tmp_path):
    result = run_gate(frame, [CHECKS[3]], source=SOURCE, suite_name="examples", run_name="examples", docs_dir=None)
    assert result.data_docs is None and not result.results[0].success
    assert result.results[0].unexpected_count == 1 and result.results[0].unexpected_percent == pytest.approx(100 / 9)

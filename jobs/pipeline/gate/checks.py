"""The data-quality gate: great-expectations checks derived from the feature definitions.

No suite is written by hand: :func:`derive_checks` turns a source's definition (keys,
types, embedding dimensions, null limits, declared ranges and allowed values, extra
expectations from its YAML) and the previous successful run's size into expectations.
:func:`run_gate` validates the snapshot: the derived checks and the profile in one Spark
job (jobs/pipeline/gate/scan.py, great-expectations' semantics), a definition's expectations of
other kinds with great-expectations 1.x itself; great-expectations renders the HTML data
docs from the results. :func:`profile` is the profile alone.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import math
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.sql import DataFrame

from feature_defs import EntityDef, SourceDef
from feature_defs.models import expectation_class_name
from fm_config import QualityConf
from fm_config.locations import Files, Location
from jobs.pipeline.gate.scan import scan, unexpected_examples
from jobs.sql_text import ident
from jobs.transforms import CONFLICTS, finite_sql, key_columns, spark_type

log = logging.getLogger(__name__)

DIM_PREFIX = "_dim_"


class QualityGateError(RuntimeError):
    """A blocking expectation failed: nothing was written."""


class VerificationError(RuntimeError):
    """Values read back from a store differ from the source rows."""


@dataclass(frozen=True)
class Expectation:
    """One expectation: a readable name, the great-expectations type and its arguments."""

    name: str
    type: str
    kwargs: dict[str, Any]
    severity: str = "blocking"

    @property
    def class_name(self) -> str:
        return expectation_class_name(self.type)


@dataclass
class CheckResult:
    name: str
    expectation: str
    severity: str
    success: bool
    column: str | None = None
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    observed_value: Any = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.unexpected_count is not None and self.element_count:
            pct = 100.0 * self.unexpected_count / self.element_count
            return f"{self.name}: {self.unexpected_count:,} of {self.element_count:,} unexpected ({pct:.2f}%)"
        if self.observed_value is not None:
            return f"{self.name}: observed {self.observed_value}"
        return self.name


@dataclass
class GateResult:
    results: list[CheckResult]
    docs: Future[str | None] | None = None
    """The data docs' index page, rendered in a thread of its own (the run goes on meanwhile)."""
    profile: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def data_docs(self) -> str | None:
        """The data docs' index page, once rendered (waits for them)."""
        return self.docs.result() if self.docs else None

    @property
    def blocking_failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success and r.severity == "blocking"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success and r.severity == "warning"]

    @property
    def success(self) -> bool:
        return not self.blocking_failures

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.results]


_TYPE_NAMES = {
    "float": None,
    "int": "LongType",
    "bool": "BooleanType",
    "string": "StringType",
    "embedding": "ArrayType",
    "int_list": "ArrayType",
    "string_list": "ArrayType",
    "float_list": "ArrayType",
    "json": "StringType",  # canonical JSON text by then (jobs/json_values.py): no range or set checks apply
}


def _type_name(feature) -> str:
    return type(spark_type(feature)).__name__ if feature.type == "float" else _TYPE_NAMES[feature.type]


def derive_checks(source: SourceDef, entity: EntityDef, quality: QualityConf, previous: tuple[str, int] | None = None) -> list[Expectation]:
    """The expectations of one source, from its definition (see the table in feature_defs/README.md "Data quality")."""
    tolerance = 1.0 - quality.max_bad_fraction  # rows the bad-row quarantine may take out
    checks = [
        Expectation(f"{c} not null", "expect_column_values_to_not_be_null", {"column": c, "mostly": tolerance})
        for c in key_columns(source, entity)
    ]
    checks.append(_unique_check(source))
    for f in source.features:
        checks.append(
            Expectation(f"{f.name} is {f.type}", "expect_column_values_to_be_of_type", {"column": f.name, "type_": _type_name(f)})
        )
        if f.type == "embedding":
            checks.append(
                Expectation(f"{f.name} has dimension {f.dimension}", "expect_column_values_to_be_between",
                      {"column": DIM_PREFIX + f.name, "min_value": f.dimension, "max_value": f.dimension, "mostly": tolerance})
            )  # fmt: skip
        limit = quality.max_null_fraction if f.max_null_fraction is None else f.max_null_fraction
        if limit < 1:
            checks.append(
                Expectation(
                    f"{f.name} null at most {limit:.0%}",
                    "expect_column_values_to_not_be_null",
                    {"column": f.name, "mostly": round(1 - limit, 6)},
                )
            )
        if f.min_value is not None or f.max_value is not None:
            low, high = f.min_value, f.max_value
            if f.precision == "float32":  # compare float32 values with float32 bounds: 0.1 is float32(0.1)
                low, high = (None if v is None else float(np.float32(v)) for v in (low, high))
            checks.append(
                Expectation(f"{f.name} in [{f.min_value}, {f.max_value}]", "expect_column_values_to_be_between",
                      {"column": f.name, "min_value": low, "max_value": high}, f.severity)
            )  # fmt: skip
        if f.allowed_values is not None:
            checks.append(
                Expectation(
                    f"{f.name} in allowed values",
                    "expect_column_values_to_be_in_set",
                    {"column": f.name, "value_set": f.allowed_values},
                    f.severity,
                )
            )
    if previous is not None and quality.row_count_band is not None:
        date, count = previous
        low, high = math.floor(count * (1 - quality.row_count_band)), math.ceil(count * (1 + quality.row_count_band))
        checks.append(
            Expectation(f"entities within {quality.row_count_band:.0%} of the {count:,} on {date}", "expect_table_row_count_to_be_between",
                  {"min_value": max(0, low), "max_value": high})
        )  # fmt: skip
    for extra in source.expectations:
        label = f"{extra.type}({', '.join(f'{k}={v}' for k, v in extra.kwargs.items())})"
        checks.append(Expectation(label, extra.type, dict(extra.kwargs), extra.severity))
    return checks


def _unique_check(source: SourceDef) -> Expectation:
    """No key with tied versions (_conflicts: jobs/transforms.latest_per_key). With ``on_tie:
    keep_one`` a tie keeps one row: the check passes (mostly 0) and still counts the keys."""
    name, kwargs = "entity key unique after de-duplication", {"column": CONFLICTS, "value_set": [0]}
    if source.on_tie == "keep_one":
        return Expectation(
            f"{name} (on_tie: keep_one: a tie keeps one row)", "expect_column_values_to_be_in_set", {**kwargs, "mostly": 0.0}
        )
    return Expectation(name, "expect_column_values_to_be_in_set", kwargs)


def validation_frame(snapshot: DataFrame, source: SourceDef) -> DataFrame:
    """The snapshot as the stores will see it, plus the derived columns some checks read.

    NaN and ±inf floats are never written, so here they are null: they count against
    the null limit and are not judged by range checks. Embedding lengths are added."""
    columns: list[str] = []
    for name in snapshot.columns:
        f = next((f for f in source.features if f.name == name), None)
        c = ident(name)
        if f is not None and f.type == "float":
            columns.append(f"CASE WHEN {finite_sql(c)} THEN {c} END AS {c}")
        else:
            columns.append(c)
    dims = [
        f"CASE WHEN {ident(f.name)} IS NOT NULL THEN size({ident(f.name)}) END AS {ident(DIM_PREFIX + f.name)}"
        for f in source.features
        if f.type == "embedding"
    ]
    return snapshot.selectExpr(*columns, *dims)  # SQL text: one call to the JVM (jobs/sql_text.py)


def previous_success(reports_path: str, source: str, date: dt.date, files: Files | None = None) -> tuple[str, int] | None:
    """(date, snapshot entities) of the latest successful run of ``source`` before ``date``,
    from the reports where runs wrote them (a local folder or a URI). A run of 0 entities (an
    empty date that older versions recorded as a success) anchors nothing: the search goes
    on to the run before it, since no band around 0 admits a later date with rows."""
    files = files or Files()
    folder = Location(reports_path) / source
    try:
        days = files.folders(folder)
    except OSError as exc:  # the band needs the history: fail (and be retried) rather than skip it quietly
        raise OSError(f"cannot list the earlier reports of {source} at {folder} for the row-count band: {exc}") from None
    for day in sorted(days, reverse=True):
        # single dates only: a range's report counts one row per entity and date
        if len(day) != 10 or day >= date.isoformat():
            continue
        try:
            report = json.loads(files.read_bytes(folder / day / "summary.json"))
        except (OSError, ValueError):
            continue
        if report.get("status") == "succeeded" and report.get("snapshot_entities"):
            return day, int(report["snapshot_entities"])
    return None


def run_gate(
    df: DataFrame,
    checks: list[Expectation],
    *,
    source: SourceDef,
    suite_name: str,
    run_name: str,
    docs_dir: str | None,
    files: Files | None = None,
) -> GateResult:
    """Validate ``df`` against ``checks`` and profile it: the checks the scan knows and the
    profile in one Spark job (jobs/pipeline/gate/scan.py), any other expectation with
    great-expectations; the HTML data docs rendered from the results by great-expectations
    (no Spark work) into ``docs_dir``, in the background (see :attr:`GateResult.docs`)."""
    found, profile = scan(df, checks, source)
    for i, (success, result) in found.items():
        if not success and "unexpected_count" in result and checks[i].type != "expect_column_values_to_not_be_null":
            result["partial_unexpected_list"] = [_plain(v) for v in unexpected_examples(df, checks[i])]
    with _GX_LOCK:
        context = _gx_context()
        suite = _gx_suite(context, suite_name, checks)
        configs = [e.configuration for e in suite.expectations]
        outcomes: dict[int, Any] = {i: _gx_result(success, configs[i], result) for i, (success, result) in found.items()}
        rest = [i for i in range(len(checks)) if i not in found]
        if rest:
            outcomes |= dict(zip(rest, _run_with_gx(context, df, [checks[i] for i in rest], f"{suite_name} (great-expectations)")))
    ordered = [outcomes[i] for i in range(len(checks))]
    docs = _DOCS.submit(_render_docs, context, suite_name, run_name, ordered, docs_dir, files or Files()) if docs_dir is not None else None
    return GateResult(results=[_check_result(r) for r in ordered], docs=docs, profile=profile)


# Renders data docs while Spark writes (pure Python, about 1 s a source): one at a time
_DOCS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="data-docs")
# great-expectations keeps process-wide state (its current project): sources gated at once
# (parallel_sources) use it one at a time
_GX_LOCK = threading.RLock()


def prefetch() -> None:
    """Import great-expectations in the background (about 2.5 s of the driver's time), while
    Spark reads and prepares the snapshot: the gate then finds it imported."""

    def load() -> None:
        try:
            _gx()
            for module in ("great_expectations.expectations", "great_expectations.render.renderer"):  # the suite, the data docs
                importlib.import_module(module)
        except Exception:  # the gate imports it again and reports what is wrong
            log.debug("prefetching great-expectations failed", exc_info=True)

    threading.Thread(target=load, name="prefetch-great-expectations", daemon=True).start()


def _gx():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # no network calls from a nightly job
    import great_expectations as gx

    # great_expectations.data_context.types.base sets its own logger to INFO on import
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return gx


def _gx_context():
    """An ephemeral great-expectations context: nothing read from or written to disk but the data docs."""
    gx = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


def _gx_suite(context, suite_name: str, checks: list[Expectation]):
    """The suite of ``checks``, added to ``context``."""
    gx = _gx()
    import great_expectations.expectations as gxe

    # notes carry our name into the data docs; meta carries it into the results. Added in
    # one go: add_expectation stores the whole suite again each time (quadratic: 4.7 s for 103)
    expectations = [
        getattr(gxe, c.class_name)(**c.kwargs, meta={"name": c.name, "severity": c.severity}, notes=f"{c.name} ({c.severity})")
        for c in checks
    ]
    return context.suites.add(gx.ExpectationSuite(name=suite_name, expectations=expectations))


def _run_with_gx(context, df: DataFrame, checks: list[Expectation], suite_name: str) -> list:
    """Checks the scan does not compute (a definition's own expectations of other kinds),
    validated by great-expectations on the Spark DataFrame."""
    gx = _gx()
    suite = _gx_suite(context, suite_name, checks)
    # persist=False: the snapshot is cached by the job already, and released by it
    asset = context.data_sources.add_spark(name="feature_materializer", persist=False).add_dataframe_asset(name=suite_name)
    validation = gx.ValidationDefinition(name=suite_name, data=asset.add_batch_definition_whole_dataframe("snapshot"), suite=suite)
    outcome = validation.run(batch_parameters={"dataframe": df}, result_format={"result_format": "SUMMARY"})
    by_id = {r.expectation_config.id: r for r in outcome.results}  # great-expectations reorders them
    return [by_id[e.id] for e in suite.expectations]


def _gx_result(success: bool, config, result: dict):
    from great_expectations.core import ExpectationValidationResult

    return ExpectationValidationResult(success=success, expectation_config=config, result=result)


def _render_docs(context, suite_name: str, run_name: str, results: list, docs_dir: str, files: Files) -> str | None:
    """The data docs site (index, suite page, validation page) from the results: no Spark
    work. Rendered in a local folder; a URI's copy is uploaded from there."""
    where = Location(docs_dir)
    if where.is_local:
        return _render_docs_in(context, suite_name, run_name, results, Path(where))
    with tempfile.TemporaryDirectory(prefix="fm-data-docs-") as tmp:
        index = _render_docs_in(context, suite_name, run_name, results, Path(tmp))
        if index is None:
            return None
        files.upload(Path(tmp), where)
    return where / "index.html"


def _render_docs_in(context, suite_name: str, run_name: str, results: list, docs_dir: Path) -> str | None:
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier, ValidationResultIdentifier

    with _GX_LOCK:  # see _GX_LOCK
        context.add_data_docs_site(
            site_name="reports",
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        passed = sum(1 for r in results if r.success)
        run_id = RunIdentifier(run_name=run_name)
        validation = ExpectationSuiteValidationResult(
            success=passed == len(results),
            results=results,
            suite_name=suite_name,
            statistics={
                "evaluated_expectations": len(results),
                "successful_expectations": passed,
                "unsuccessful_expectations": len(results) - passed,
                "success_percent": 100.0 * passed / len(results) if results else None,
            },
            meta={"run_id": run_id},
        )
        key = ValidationResultIdentifier(
            expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite_name), run_id=run_id, batch_identifier="snapshot"
        )
        context.validation_results_store.set(key, validation)
        context.build_data_docs(site_names=["reports"])
        index = docs_dir / "index.html"
        return str(index) if index.is_file() else None


def _check_result(r) -> CheckResult:
    config = r.expectation_config
    meta = config.meta or {}
    res = r.result or {}
    return CheckResult(
        name=meta.get("name", config.type),
        expectation=config.type,
        severity=meta.get("severity", "blocking"),
        success=bool(r.success),
        column=config.kwargs.get("column"),
        element_count=res.get("element_count"),
        unexpected_count=res.get("unexpected_count"),
        unexpected_percent=res.get("unexpected_percent"),
        observed_value=_plain(res.get("observed_value")),
        kwargs={k: _plain(v) for k, v in config.kwargs.items() if k not in ("batch_id",)},
    )


def _plain(value: Any) -> Any:
    """JSON-friendly copy of a result value (numpy and Spark types become Python ones)."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def profile(df: DataFrame, source: SourceDef) -> dict[str, dict[str, Any]]:
    """Per feature: null and zero fractions, min/max/mean of numbers, list length stats, in
    one aggregation (the gate computes it with its checks; this is the profile alone).
    Give it the :func:`validation_frame`, where NaN/inf (never written) are null."""
    return scan(df, [], source)[1]

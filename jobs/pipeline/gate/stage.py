"""Stage 4, gate: profile, expectations (jobs/pipeline/gate/checks.py) and the bad-row limit; a failure writes nothing."""

from __future__ import annotations

from concurrent.futures import Future

from jobs.pipeline.context import RunContext
from jobs.pipeline.gate import checks as quality
from jobs.pipeline.gate.checks import QualityGateError
from jobs.pipeline.prepare import Prepared
from jobs.pipeline.report.stage import report_dir
from jobs.pipeline.report.summary import RunSummary
from jobs.progress import progress


class BadInputError(QualityGateError, ValueError):
    """Too much of the snapshot is bad input: nothing was written to the stores."""


def check_quality(
    ctx: RunContext, prepared: Prepared, summary: RunSummary, *, expectations: bool, docs_folder: str = "data_docs"
) -> Future | None:
    """Profile the snapshot, run the expectations, apply the bad-row limit.

    Raises QualityGateError (BadInputError when only the bad-row limit is passed) before
    anything is written; warning-level failures only go to the summary. Returns the data
    docs still being rendered (pass them to :func:`docs_rendered` once the writes are under way).
    """
    spark, conf, source, entity, date, end = ctx.spark, ctx.conf, ctx.source, ctx.entity, ctx.date, ctx.end
    failures: list[str] = []
    docs = None
    with progress(spark, f"quality checks {source.name}"):
        frame = quality.validation_frame(prepared.snapshot, source)
        if not expectations:
            summary.profile = quality.profile(frame, source)
        else:
            # a range's size, or an incremental window's, is not comparable with one date's: no row-count band then
            incremental = ctx.window is not None and ctx.window.incremental
            previous = None if end or incremental else quality.previous_success(conf.reports_path, source.name, date, conf.files)
            checks = quality.derive_checks(source, entity, conf.quality, previous)
            name = ctx.window.report_name if ctx.window else None
            docs = report_dir(conf, source.name, date, end, name=name) / docs_folder if conf.quality.data_docs else None
            result = quality.run_gate(
                frame, checks, source=source, suite_name=source.name, run_name=f"{source.name} {date}", docs_dir=docs, files=conf.files
            )
            summary.profile = result.profile
            summary.expectations = result.as_dicts()
            docs = result.docs
            summary.warnings.extend(f"expectation failed (warning): {r.describe()}" for r in result.warnings)
            failures = [r.describe() for r in result.blocking_failures]
    too_bad = summary.bad_fraction > conf.quality.max_bad_fraction
    bad_text = (
        f"{summary.bad_rows:,} of {summary.rows_read:,} rows are bad input ({summary.bad_fraction:.2%} > "
        f"quality.max_bad_fraction {conf.quality.max_bad_fraction:.2%}); reasons: {summary.bad_reasons}"
    )
    if failures or too_bad:
        docs_rendered(summary, docs)
    if failures:
        lines = failures + ([bad_text] if too_bad else [])
        docs_line = f"\n  report: {summary.data_docs}" if summary.data_docs else ""
        raise QualityGateError(
            f"source {source.name!r} {date}: {len(failures)} blocking expectation(s) failed; nothing was written:\n  "
            + "\n  ".join(lines)
            + docs_line
        )
    if too_bad:
        raise BadInputError(
            f"source {source.name!r} {date}: {bad_text}; nothing was written. "
            f"Rows kept in {summary.quarantine_table or 'quarantine (not written by validate)'}"
        )
    return docs


def docs_rendered(summary: RunSummary, docs: Future | None) -> None:
    """Wait for the data docs the gate is rendering; a failure to render them is a warning
    (the gate's results are in the summary either way)."""
    if docs is None:
        return
    try:
        summary.data_docs = docs.result()
    except Exception as exc:  # great-expectations' renderer: not a reason to fail a written run
        summary.warnings.append(f"data docs not rendered: {type(exc).__name__}: {exc}")

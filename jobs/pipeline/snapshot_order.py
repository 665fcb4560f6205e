"""What the writes' snapshot-order guard tells the run (serializers/FORMAT.md, "Writes").

A store leaves an entity whose stored snapshot of the source is newer than the run's, and
replaces one whose stored as-of time is beyond the horizon (later than any date a run
accepts: corrupt, serializers/horizon.py). Both are counted by the writers; here they
become the summary's warnings, and a run most of whose entities were left fails: it is a
run of a date older than what the stores hold (a date run again by hand, or tomorrow's
written early) that succeeded in the sense that nothing broke, and changed almost nothing.
Backfills, which apply older dates on purpose, are not checked."""

from __future__ import annotations

from jobs.pipeline.context import RunContext
from jobs.pipeline.report.summary import RunSummary

SKIPPED = {"redis": ("skipped_newer", "entities"), "sql": ("rows_skipped_newer", "rows")}
"""Per store: the summary's counter of entities left as they were, and what it counts."""


class MostlySkippedNewer(RuntimeError):
    """More than ``quality.max_skipped_newer`` of a run's entities held a newer snapshot in a store."""


def future_warning(store: str, replaced: int, what: str, ctx: RunContext) -> str:
    return (
        f"{store}: {replaced:,} {what} held an as-of time of {ctx.source.name} later than any date a run accepts "
        "(past tomorrow, UTC: written by mistake, e.g. a date typed wrong) and were replaced by this run's"
    )


def newer_kept(ctx: RunContext, store: str, count: int, what: str) -> str:
    """The summary's warning for ``count`` entities a store kept because it held newer values."""
    if ctx.source.push_source:  # what pushes are for: values newer than the table's, between nights
        return f"{store}: {count:,} {what} of {ctx.source.name} hold a newer pushed value (push_source) and were left as they are"
    return f"{store}: {count:,} {what} already hold a newer snapshot of {ctx.source.name} than {ctx.date} and were left as they are"


def check_mostly_newer(ctx: RunContext, summary: RunSummary) -> None:
    """Fail when a store left more than ``quality.max_skipped_newer`` of the run's entities,
    unless the source takes pushes: there newer values are the pushes', counted, never a failure."""
    limit, entities = ctx.conf.quality.max_skipped_newer, summary.entities
    if not entities or ctx.source.push_source:
        return
    over = []
    for store, (counter, what) in SKIPPED.items():
        skipped = summary.sinks.get(store, {}).get(counter, 0)
        if skipped > limit * entities:
            over.append(f"{store}: {skipped:,} of {entities:,} {what} ({skipped / entities:.0%})")
    if not over:
        return
    source = ctx.source.name
    raise MostlySkippedNewer(
        f"{'; '.join(over)} already hold a newer snapshot of {source} than {ctx.date} and were left as they are, "
        f"more than quality.max_skipped_newer ({limit:.0%}): this run changed almost nothing. "
        f"`materialize runs --source {source}` shows which later date was written. To apply an older date on purpose, "
        f"run `materialize backfill --source {source} --mode replay` from it (it applies the later dates again after it); "
        "a later date written early (at most tomorrow's: later ones are replaced) stays until the runs reach it"
    )

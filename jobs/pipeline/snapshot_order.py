"""What the writes' snapshot-order guard tells the run (serializers/FORMAT.md, "Writes").

A store leaves an entity whose stored snapshot of the source is newer than the run's, and
replaces one whose stored as-of time is beyond the horizon (later than any date a run
accepts: corrupt, serializers/horizon.py). Both are counted by the writers; here they
become the summary's warnings."""

from __future__ import annotations

from jobs.pipeline.context import RunContext


def future_warning(store: str, replaced: int, what: str, ctx: RunContext) -> str:
    return (
        f"{store}: {replaced:,} {what} held an as-of time of {ctx.source.name} later than any date a run accepts "
        "(past tomorrow, UTC: written by mistake, e.g. a date typed wrong) and were replaced by this run's"
    )

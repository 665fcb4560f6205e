"""Does each store still hold what the ledger says was written to it?

After its write, every write step records in the ledger's ``stores`` column, per store,
what identified the store and what it held (sinks/redis/identity.py,
sinks/sql/identity.py) and a sample of the entities it wrote (``after``), and what it
found before writing (``before``). A run or backfill step before its write, a backfill
plan and ``doctor`` compare the store as it is now with the last such record:

- The sample decides: when fewer than LOST_BELOW of the entities the last write sampled
  still hold the source's data (Redis: its freshness field; SQL: its row), the store lost
  what was written before. It needs no scan, so it costs the same at a billion keys. Keys
  with a TTL count only while the last write is younger than the TTL (then every key it
  wrote must still be there, whatever later steps did).
- Key and row counts, run ids, persistence, server and table ids only explain: "2 keys
  where the run of 2026-11-19 left 400,007; another run id (restarted or failed over);
  AOF off, no save points: restarted without persistence".

A loss found is recorded in the step that found it (``stores.<sink>.lost``: the dates
whose data is gone). From then on the ledger counts a date as written to that store only
if a step wrote it again after the loss, so backfill plans never call a lost date
"already written", and every run, backfill and doctor keeps naming the loss (with the
backfill that restores it) until that backfill has run.

Which dates: the dates the ledger shows written to the store whose last write's own sample
is gone too (a restart from an older RDB snapshot lost only the writes since), or cannot
tell; except, for an entity type with a TTL (Redis keys, SQL rows alike), dates whose last write is older than the TTL (with
its jitter): their keys had expired anyway. The restoring backfill writes them in one latest-mode pass (each
entity's latest row, as the store held it), with the dates written since applied in the
same pass so no entity ends older. It needs no ``--force``: its plan finds the loss as the
run did (recorded, or in the store itself), so the dates lost are its dates to write, and
once it has run the same command finds nothing to write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jobs.operations.ledger.events import WRITE_KINDS, aware, loss_events, lost_later, on_target, stores_of

LOST_BELOW = 0.5
"""Fewer than this share of the sample still there: the store lost the data. A few missing
(deleted by hand, a partial eviction) is a warning."""


@dataclass
class Finding:
    """One store's answer for one source: OK, a warning, or the dates whose data it lost."""

    source: str
    sink: str
    target: str
    lost: list[dt.date] = field(default_factory=list)
    """Dates written to the store whose data it no longer holds (found now, or recorded before and not written again)."""
    found_now: list[dt.date] = field(default_factory=list)
    """Of those, the ones this comparison found (not in the ledger yet)."""
    evidence: str = ""
    """What was compared, in one line."""
    warning: str | None = None
    seen: dict[str, Any] | None = None
    """The store as observed now."""

    def recorded(self) -> dict[str, Any]:
        """What the step that found the loss records under stores.<sink>.lost."""
        return {"dates": [d.isoformat() for d in self.found_now], "evidence": self.evidence}

    def explained(self, earlier: list[str]) -> Finding:
        """A loss recorded before and not restored yet: its evidence is what was found then."""
        if earlier:
            self.evidence = f"{earlier[-1]} (not written again since; now: {self.evidence})"
        return self

    def text(self) -> str:
        return f"{self.sink} at {self.target} lost {self.source}'s data of {date_ranges(self.lost)}: {self.evidence}"


def date_ranges(days: Iterable[dt.date]) -> str:
    """'2026-11-16..2026-11-18, 2026-11-20' (consecutive dates joined)."""
    days = sorted(set(days))
    spans: list[list[dt.date]] = []
    for d in days:
        if spans and (d - spans[-1][1]).days == 1:
            spans[-1][1] = d
        else:
            spans.append([d, d])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in spans) or "none"


def restore_command(
    env: str,
    source: str,
    lost: Iterable,
    sinks: Iterable[str],
    all_sinks: list[str],
    redis_url: str | None = None,
    *,
    by_event_time: bool = False,
) -> str:
    """The command that writes every ``lost`` date again, into the ``sinks`` that lost them: a
    backfill of those dates; for a source selected by event time (which refuses backfills), a
    run of the last one, which writes each entity's latest row up to that date's end."""
    lost, sinks = sorted(set(lost)), sorted(set(sinks))
    if by_event_time:
        parts = ["materialize run", f"--env {env}", f"--source {source}", f"--date {lost[-1]}"]
    else:
        parts = ["materialize backfill", f"--env {env}", f"--source {source}", f"--start {lost[0]}", f"--end {lost[-1]}"]
    if len(sinks) == 1 and len(all_sinks) > 1:
        parts.append(f"--sink {sinks[0]}")
    if redis_url and "redis" in sinks:
        parts.append(f"--redis-url {redis_url}")
    return " ".join(parts)


def compare(
    rows: Iterable[Mapping[str, Any]],
    source: str,
    sink: str,
    target: str,
    seen: dict[str, Any],
    holding: Callable[[list[str]], int | None],
    *,
    ttl_seconds: float | None = None,
    ttl_jitter: float = 0.0,
    now: dt.datetime | None = None,
) -> Finding:
    """The store ``seen`` now against the ledger's steps of ``source`` (latest states);
    ``holding(sample)``: how many of a write's sampled entities hold the source's data now
    (None: the table is gone). ``ttl_seconds``: the keys' TTL (Redis), None if they never expire."""
    now = now or dt.datetime.now(dt.UTC)
    mine = [r for r in rows if r["source"] == source and r["kind"] in WRITE_KINDS and on_target(r, sink, target)]
    events = loss_events(mine, sink, target)
    held: dict[dt.date, Mapping[str, Any]] = {}  # date -> the last step that wrote it, not lost since
    for r in mine:
        if r["status"] != "succeeded":
            continue
        for day in r["dates"] or []:
            if not lost_later(events, day, r["started_at"]) and (day not in held or aware(r["ended_at"]) > aware(held[day]["ended_at"])):
                held[day] = r
    finding = Finding(source, sink, target, seen=seen)
    finding.lost = sorted(set().union(*(dates for _, dates, _ in events)) - set(held))
    earlier = [_found(at, step, sink) for at, dates, step in events if dates - set(held)]  # losses not restored yet
    recorded = [r for r in mine if r["status"] == "succeeded" and stores_of(r).get(sink, {}).get("after")]
    if not recorded:
        finding.evidence = "no write of it recorded what the store held (written by an older version, or never)"
        return finding.explained(earlier)
    last = max(recorded, key=lambda r: aware(r["ended_at"]))
    after = stores_of(last)[sink]["after"]
    sample = after.get("sample") or []
    what = f"the {last['kind']} of {date_ranges(last['dates'] or [])}"
    if not _tells(last, sink, ttl_seconds, now):
        finding.evidence = f"{describe(sink, after, seen, what)} (its sample cannot tell: " + (
            "it wrote no entity)" if not sample else "older than the keys' TTL)"
        )
        return finding.explained(earlier)
    present = holding(sample)
    count = f"{present or 0} of {len(sample)} {source} entities sampled by {what} still hold its data"
    finding.evidence = f"{count}; {describe(sink, after, seen, what)}"
    if present is None or present < LOST_BELOW * len(sample):
        finding.found_now = _lost_dates(held, last, sink, holding, ttl_seconds, ttl_jitter, now)
        finding.lost = sorted(set(finding.lost) | set(finding.found_now))
    elif present < len(sample):
        finding.warning = f"{sink} at {target}: {count} (deleted by hand, or evicted?)"
    return finding if finding.found_now else finding.explained(earlier)


def _lost_dates(
    held: dict[dt.date, Mapping[str, Any]],
    last: Mapping[str, Any],
    sink: str,
    holding: Callable[[list[str]], int | None],
    ttl_seconds: float | None,
    ttl_jitter: float,
    now: dt.datetime,
) -> list[dt.date]:
    """Which dates a store found short of its last write lost: those whose last write's own
    sample is gone too (a restart that loaded an older RDB snapshot lost only the writes
    since), or cannot tell; not those whose keys had expired anyway (older than the TTL and
    its jitter)."""
    window = dt.timedelta(seconds=ttl_seconds * (1 + ttl_jitter)) if ttl_seconds else None
    verdicts = {last["run_id"]: True}

    def gone(step: Mapping[str, Any]) -> bool:
        if step["run_id"] not in verdicts:
            keys = stores_of(step)[sink].get("after", {}).get("sample") or []
            found = holding(keys) if _tells(step, sink, ttl_seconds, now) else None
            verdicts[step["run_id"]] = found is None or found < LOST_BELOW * len(keys)
        return verdicts[step["run_id"]]

    recent = {d: r for d, r in held.items() if window is None or aware(r["ended_at"]) + window >= now}
    return sorted(d for d, r in recent.items() if gone(r))


def _tells(step: Mapping[str, Any], sink: str, ttl_seconds: float | None, now: dt.datetime) -> bool:
    """Whether the step's sample can tell: it has one, and its keys cannot have expired yet."""
    sample = stores_of(step).get(sink, {}).get("after", {}).get("sample")
    return bool(sample) and not (ttl_seconds and now - aware(step["started_at"]) >= dt.timedelta(seconds=ttl_seconds))


def _found(at: dt.datetime, step: Mapping[str, Any], sink: str) -> str:
    what = f"the {step['kind']} of {date_ranges(step['dates'] or [step.get('start_date')])}"
    return f"found at {at:%Y-%m-%d %H:%M} UTC by {what}: {stores_of(step)[sink]['lost']['evidence']}"


def describe(sink: str, after: dict[str, Any], seen: dict[str, Any], what: str) -> str:
    """The store's counts and identity now against what the last write left."""
    if sink == "redis":
        from sinks.redis.identity import persistence_text

        text = f"db {seen['db']} holds {seen['keys']:,} keys, {what} left {after.get('keys', 0):,}"
        before, now = after.get("servers") or {}, seen.get("servers") or {}
        if before and before != now:
            changed = ", ".join(f"{a} {before.get(a, '-')[:8]} -> {now.get(a, '-')[:8]}" for a in sorted(set(before) | set(now)))
            text += (
                f"; another run id ({changed}): the server restarted or another took its place "
                f"{seen.get('uptime', 0):,} s ago and loaded {seen.get('keys_loaded', 0):,} keys ({persistence_text(seen)})"
            )
        return text
    rows, gone = seen.get("rows"), seen.get("table_oid") is None
    about = lambda seen: "about " if seen.get("rows_estimated") else ""  # noqa: E731
    if gone:
        text = "its table is gone"
    else:
        text = "rows of it now unknown" if rows is None else f"{about(seen)}{rows:,} rows of it now"
    text += f", {what} left " + ("?" if after.get("rows") is None else f"{about(after)}{after['rows']:,}")
    if seen.get("server") and after.get("server") and seen["server"] != after["server"]:
        text += f"; another server or cluster (id {after['server']} -> {seen['server']})"
    elif seen.get("started") and after.get("started") and seen["started"] != after["started"]:
        text += f"; the server restarted at {seen['started']}"
    if not gone and after.get("table_oid") and seen["table_oid"] != after["table_oid"]:
        text += "; the table was dropped and made again"
    elif not gone and after.get("filenode") and seen.get("filenode") != after["filenode"]:
        text += "; the table was emptied or rewritten since (TRUNCATE, VACUUM FULL)"
    return text


def check_stores(conf, defs, source_name: str, steps: list[dict], redis_url: str | None = None) -> list[Finding]:
    """Each configured store of ``source_name`` now against the ledger's ``steps`` of it
    (Ledger.source_steps). A store nothing was recorded for is not asked anything."""
    from jobs.operations.ledger.events import sink_targets

    source = defs.source(source_name)
    entity = defs.entity_of(source)
    out = []
    for sink, target in sink_targets(conf, redis_url).items():
        mine = [r for r in steps if r["source"] == source.name and r["kind"] in WRITE_KINDS and on_target(r, sink, target)]
        if not any(stores_of(r).get(sink) for r in mine):
            out.append(Finding(source.name, sink, target, evidence="nothing recorded about this store yet"))
        elif sink == "redis":
            out.append(_check_redis(conf, source, entity, target, mine, redis_url))
        else:
            out.append(_check_sql(conf, source, entity, target, mine))
    return out


def _check_redis(conf, source, entity, target: str, steps: list[dict], redis_url: str | None) -> Finding:
    from serializers.keys import freshness_field
    from sinks.redis import identity
    from sinks.redis.config import redis_sink_config
    from sinks.redis.preflight import detect_cluster

    config = redis_sink_config(conf, url=redis_url)
    cluster = detect_cluster(conf.redis, config)
    seen = identity.observe(config, cluster)
    field_id = freshness_field(source.name)
    return compare(
        steps, source.name, "redis", target, seen, lambda sample: identity.holding(config, cluster, sample, field_id),
        ttl_seconds=entity.ttl_seconds, ttl_jitter=conf.redis.ttl_jitter,
    )  # fmt: skip


def _check_sql(conf, source, entity, target: str, steps: list[dict]) -> Finding:
    from sinks.sql import identity
    from sinks.sql.config import sql_sink_config
    from sinks.sql.preflight import dialect_of
    from stores.sql import connect

    config = sql_sink_config(conf, source, entity)
    with connect(config) as conn:
        config = replace(config, dialect=dialect_of(conf.sql, conn))
        seen = identity.observe(conn, config)
        # rows expire with the entity's TTL too (expires_at): dates older than it tell nothing
        return compare(
            steps, source.name, "sql", target, seen, lambda sample: identity.holding(conn, config, sample),
            ttl_seconds=entity.ttl_seconds, ttl_jitter=conf.redis.ttl_jitter,
        )  # fmt: skip


def outstanding(findings: list[Finding], writing: Iterable[dt.date], env: str, all_sinks: list[str], redis_url: str | None) -> list[dict]:
    """The losses a step leaves after writing ``writing`` (its dates, or a backfill's), for
    the run summary's ``store_loss``: per store, the dates, evidence and restoring backfill."""
    writing = set(writing)
    left = [replace(f, lost=[d for d in f.lost if d not in writing]) for f in findings]
    left = [f for f in left if f.lost]
    if not left:
        return []
    command = restore_command(env, left[0].source, [d for f in left for d in f.lost], [f.sink for f in left], all_sinks, redis_url)
    return [
        {"sink": f.sink, "target": f.target, "dates": [d.isoformat() for d in f.lost], "ranges": date_ranges(f.lost),
         "evidence": f.evidence, "restore": command}
        for f in left
    ]  # fmt: skip

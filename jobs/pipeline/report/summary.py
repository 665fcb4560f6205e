"""The run summary: a readable table on the console and the same facts as JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fm_config.locations import Files


class SummaryError(ValueError):
    """A summary.json this version cannot read: truncated, edited, or written in another format."""


@dataclass
class RunSummary:
    source: str
    entity: str
    date: str
    env: str
    as_of: int
    window: str | None = None
    """select_by event_time: the event times the run covered (each entity is as of its row's)."""
    status: str = "running"
    error: str | None = None
    rows_read: int = 0
    bad_rows: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)
    superseded_rows: int = 0
    earlier_dates: int = 0
    """Range runs: entity rows of an earlier date that a later date of the range replaces."""
    ignored_rows: int = 0
    """Long layout: rows of feature names that are not defined."""
    entities: int = 0
    """Entities in the snapshot that passed the checks (the ones written)."""
    snapshot_entities: int = 0
    """Entities after de-duplication, bad ones included: what the expectations count."""
    conflicting_keys: int = 0
    """Keys with differing versions as recent as the one kept (on_tie: fail, the default)."""
    tied_keys_kept: int = 0
    """on_tie: keep_one: keys whose latest versions tied with different values; one of them was kept."""
    expectations: list[dict[str, Any]] = field(default_factory=list)
    """Each great-expectations check: name, expectation, severity, success, counts."""
    data_docs: str | None = None
    """The great-expectations HTML report of this run."""
    profile: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per feature: null/zero fractions, min/max/mean, list lengths."""
    verification: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per store: entities read back, mismatches found, the first ones listed."""
    quarantine_table: str = ""
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    store_loss: list[dict[str, Any]] = field(default_factory=list)
    """Stores that lost data written before this run and not written again since: per store,
    the dates, the evidence and the backfill that restores them (jobs/operations/ledger/store_state.py)."""
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    """Wall seconds per stage, in run order: read, prepare, quarantine, gate (with the wait, if
    any, for its data docs, rendered while the stores are written), write <store>, verify, report."""

    def record(self, counts: Any) -> None:
        """Take the counts of a stage (a dataclass whose fields are named as the summary's)."""
        for f in fields(counts):
            setattr(self, f.name, getattr(counts, f.name))

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage (also when it fails): its own seconds, less those of the stages timed
        inside it, add to ``stages[name]``."""
        inner = self.__dict__.setdefault("_nested", [])  # per open stage: its nested stages' seconds (not a field: not reported)
        inner.append(0.0)
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            nested = inner.pop()
            if inner:
                inner[-1] += took
            self.stages[name] = self.stages.get(name, 0.0) + took - nested

    @property
    def bad_fraction(self) -> float:
        return self.bad_rows / self.rows_read if self.rows_read else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bad_fraction": self.bad_fraction}

    def write_json(self, path: str | Path, files: Files | None = None) -> str | Path:
        """Write the JSON to a local path or a URI (``files``: how the driver reaches it)."""
        (files or Files()).write_bytes(str(path), (json.dumps(self.as_dict(), indent=2, sort_keys=True) + "\n").encode())
        return path

    @classmethod
    def read_json(cls, path: str | Path, files: Files | None = None) -> RunSummary:
        """The summary ``write_json`` wrote; anything else is a one-line SummaryError naming the file."""
        try:
            data = json.loads((files or Files()).read_bytes(str(path)))
        except OSError as exc:
            raise SummaryError(f"{path}: cannot read: {exc.strerror or str(exc).splitlines()[0]}") from None
        except json.JSONDecodeError as exc:
            raise SummaryError(
                f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}): truncated? run the date again to rewrite it"
            ) from None
        except UnicodeDecodeError as exc:
            raise SummaryError(f"{path}: not UTF-8 JSON ({exc.reason} at byte {exc.start})") from None
        if not isinstance(data, dict):
            raise SummaryError(f"{path}: expected a JSON object, found a JSON {type(data).__name__}")
        data.pop("bad_fraction", None)  # derived: written for readers of the JSON
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise SummaryError(
                f"{path}: keys this version does not know ({', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}): "
                "written by a newer feature-materializer? read it with that version, or read the JSON itself"
            )
        missing = [n for n, f in known.items() if n not in data and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise SummaryError(f"{path}: lacks {', '.join(missing)}: not a run summary of this job")
        summary = cls(**data)
        try:
            summary.table()  # every value the table shows has the shape it needs
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise SummaryError(
                f"{path}: a value is not in the format this version writes ({type(exc).__name__}: {exc}): written by another version?"
            ) from None
        return summary

    def table(self) -> str:
        rows: list[tuple[str, str]] = [
            ("source", f"{self.source} ({self.entity})"),
            ("date / as-of", f"{self.date} / {self.as_of}" if self.window is None else f"{self.date} / each entity's event time"),
            *([("event-time window", self.window)] if self.window else []),
            ("status", self.status + (f": {self.error}" if self.error else "")),
            ("rows read", f"{self.rows_read:,}"),
            ("bad rows (quarantined)", f"{self.bad_rows:,} ({self.bad_fraction:.2%})"),
        ]
        rows += [(f"  {reason}", f"{n:,}") for reason, n in sorted(self.bad_reasons.items())]
        rows += [("superseded rows", f"{self.superseded_rows:,}")]
        if self.earlier_dates:
            rows.append(("rows of earlier dates replaced", f"{self.earlier_dates:,}"))
        if self.ignored_rows:
            rows.append(("rows of undefined features", f"{self.ignored_rows:,}"))
        rows.append(("entities", f"{self.entities:,}"))
        if self.conflicting_keys:
            rows.append(("keys with conflicting versions", f"{self.conflicting_keys:,}"))
        if self.tied_keys_kept:
            rows.append(("keys with tied versions, one kept (on_tie: keep_one)", f"{self.tied_keys_kept:,}"))
        if self.expectations:
            failed = [e for e in self.expectations if not e["success"]]
            blocking = sum(e["severity"] == "blocking" for e in failed)
            rows.append(
                ("expectations", f"{len(self.expectations) - len(failed)} of {len(self.expectations)} passed, {blocking} blocking failed")
            )
            for e in failed:
                counts = (
                    f"{e['unexpected_count']:,} of {e['element_count']:,}"
                    if e.get("unexpected_count") is not None
                    else f"observed {e.get('observed_value')}"
                )
                rows.append((f"  FAILED ({e['severity']})", f"{e['name']}: {counts}"))
        for name, stats in self.sinks.items():
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    text = f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
                elif isinstance(value, str):
                    text = value
                else:
                    continue
                rows.append((f"{name}: {key.replace('_', ' ')}", text))
        for name, check in self.verification.items():
            newer = f" ({check['newer']:,} hold a newer snapshot)" if check.get("newer") else ""
            rows.append((f"{name}: verified", f"{check['checked']:,} entities read back{newer}, {check['mismatches']:,} mismatches"))
        if self.data_docs:
            rows.append(("data docs", self.data_docs))
        rows.append(("seconds", f"{self.seconds:,.1f}"))
        if self.stages:
            rows.append(("stage seconds", ", ".join(f"{name} {s:,.1f}" for name, s in self.stages.items())))
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"  warning: {w}" for w in self.warnings]
        for loss in self.store_loss:
            lines.append(f"  STORE LOST DATA: {loss['sink']} at {loss['target']} no longer holds {self.source}'s data of {loss['ranges']}")
            lines.append(f"    evidence: {loss['evidence']}")
        if self.store_loss:
            lines.append(f"    restore it: {self.store_loss[0]['restore']}")
        rule = "-" * (width + 30)
        return "\n".join([rule, *lines, rule])

"""``stored.lock``: what the stores hold under each stored name, so a definition change
can never make a reader decode old bytes as something else.

A feature's values are stored under its stored name (its ``stored_as``, else its name):
the Redis field id is xxh32 of it and the SQL JSON key is it. The lock records, per entity
type and stored name, the source and feature it belongs to and its encoding (type plus
the options that change the bytes), and the stored names of removed features (retired).
It is written by ``materialize defs --lock`` and committed with the definitions; loading
refuses definitions that disagree with it, one line per feature, naming the change and
the way forward. Without the file nothing is checked (``materialize defs`` says so).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from serializers import field_id_int
from serializers.description import COMPATIBLE

LOCK_NAME = "stored.lock"
HEADER = """\
# What the stores hold under each stored name (the Redis field id is xxh32 of it, the SQL
# JSON key is it), per entity type. Written by `materialize defs --lock`: commit it with the
# definitions. Loading refuses definitions that disagree with it (feature_defs/README.md).
"""


@dataclass(frozen=True)
class Stored:
    source: str
    feature: str
    encoding: str
    retired: str | None = None
    """The date the feature was removed: its values may still be in the stores, never served."""


@dataclass
class Lock:
    entities: dict[str, dict[str, Stored]] = field(default_factory=dict)

    def text(self) -> str:
        doc = {
            entity: {
                name: {"source": s.source, "feature": s.feature, "encoding": s.encoding, **({"retired": s.retired} if s.retired else {})}
                for name, s in sorted(names.items())
            }
            for entity, names in sorted(self.entities.items())
        }
        body = yaml.safe_dump({"entities": doc}, sort_keys=False, default_flow_style=None, width=200)
        return HEADER + body


class LockFileError(ValueError):
    """A stored.lock that cannot be read."""


def read_lock(directory: Path) -> Lock | None:
    path = directory / LOCK_NAME
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        entities = data["entities"] or {}
        held = {e: {n: Stored(**{k: str(v) for k, v in s.items()}) for n, s in (names or {}).items()} for e, names in entities.items()}
        return Lock(held)
    except (yaml.YAMLError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        raise LockFileError(f"{path}: not a stored.lock ({problem}); regenerate it with `materialize defs --lock`") from None


def write_lock(directory: Path, lock: Lock) -> Path:
    path = directory / LOCK_NAME
    path.write_text(lock.text(), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Change:
    """One difference between the definitions and the lock."""

    entity: str
    where: str
    """``file:line: source 'S': feature 'F'`` (or the lock's place for a removed feature)."""
    text: str
    lockable: bool
    """True: ``materialize defs --lock`` records it; False: the definition must change."""

    def line(self) -> str:
        fix = "; record it with `materialize defs --lock`" if self.lockable else ""
        return f"{self.where}: {self.text}{fix}"


def next_stored_name(name: str, taken: set[str]) -> str:
    """``name@N`` with N one past every version of ``name`` taken (at least 2)."""
    base = name.partition("@")[0]
    versions = [int(m.group(1)) for t in taken if (m := re.fullmatch(re.escape(base) + r"@(\d+)", t))]
    return f"{base}@{max([1, *versions]) + 1}"


def changes(defs, lock: Lock | None) -> list[Change]:
    """Every difference between the definitions and the lock (none yet: every feature is new)."""
    lock = lock or Lock()
    out: list[Change] = []
    lock_path = Path(next(iter(defs.files.values()), "")).parent / LOCK_NAME
    for entity in defs.entities:
        held = lock.entities.get(entity, {})
        used = {f.stored_name for s in defs.sources_of(entity) for f in s.features}
        orphans = {n: e for n, e in held.items() if not e.retired and n not in used}
        defined = {(s.name, f.name) for s in defs.sources_of(entity) for f in s.features}  # a name is unique per source
        retired_ids = {field_id_int(n): n for n, s in held.items() if s.retired}
        for source in defs.sources_of(entity):
            for f in source.features:
                change = _feature_change(source, f, held, orphans, retired_ids)
                if change is not None:
                    out.append(Change(entity, defs.place(source, f), *change))
        for name, entry in orphans.items():
            gone = "removed" if (entry.source, entry.feature) not in defined else f"no longer stored as {name!r}"
            out.append(
                Change(
                    entity,
                    f"{lock_path}: source {entry.source!r}: feature {entry.feature!r}",
                    f"{gone}: its stored name {name!r} is retired (never served again; `materialize cleanup` deletes the values)",
                    True,
                )
            )
    return out


def _feature_change(source, f, held: dict[str, Stored], orphans: dict[str, Stored], retired_ids: dict) -> tuple[str, bool] | None:
    """(what changed, lockable) for one defined feature against its entity type's part of the
    lock (``held``), or None when the lock holds it as it is."""
    name, enc = f.stored_name, f.encoding
    entry = held.get(name)
    fresh = f"`stored_as: {next_stored_name(name, set(held))}`"
    if entry is None:
        other = retired_ids.get(f.field_id)
        if other is not None:
            return f"stored name {name!r} has the field id of {other!r}, retired: set {fresh}", False
        was = sorted(n for n, e in orphans.items() if e.source == source.name and e.encoding == enc)
        hint = f"; if it is {orphans[was[0]].feature!r} renamed, keep its values with `stored_as: {was[0]}`" if was else ""
        return f"new, stored as {name!r} ({enc}){hint}", True
    if entry.retired:
        return (
            f"stored name {name!r} was retired on {entry.retired} (feature {entry.feature!r} of source "
            f"{entry.source!r} removed) and its old values may still be in the stores: give it fresh "
            f"storage with {fresh}",
            False,
        )
    if entry.source != source.name:
        return (
            f"stored name {name!r} holds values of source {entry.source!r}: a feature moved to another "
            f"source needs fresh storage: set {fresh}",
            False,
        )
    if entry.encoding != enc and (entry.encoding, enc) not in COMPATIBLE:
        return (
            f"{entry.encoding} -> {enc}: the values stored as {entry.encoding} would be read as {enc}; "
            f"store it under a new name with {fresh} (it reads NULL_VALUE for each entity until a run "
            f"writes it), or change it back",
            False,
        )
    what = []
    if entry.encoding != enc:
        what.append(f"{entry.encoding} -> {enc} (the stored values read unchanged)")
    if entry.feature != f.name:
        what.append(f"renamed from {entry.feature!r}, keeping its stored values")
    return (", ".join(what), True) if what else None


def locked(defs, lock: Lock | None, today: dt.date | None = None) -> Lock:
    """The lock after recording the definitions (call only when every change is lockable)."""
    today = today or dt.datetime.now(dt.UTC).date()
    out = Lock({e: dict(names) for e, names in (lock.entities if lock else {}).items()})
    for entity in defs.entities:
        held = out.entities.setdefault(entity, {})
        used = set()
        for source in defs.sources_of(entity):
            for f in source.features:
                held[f.stored_name] = Stored(source.name, f.name, f.encoding)
                used.add(f.stored_name)
        for name, entry in list(held.items()):
            if name not in used and not entry.retired:
                held[name] = Stored(entry.source, entry.feature, entry.encoding, today.isoformat())
    return out

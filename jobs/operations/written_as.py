"""What the ledger says each stored name was written as: the writers' own check that a
source's definitions store nothing under a name whose stored bytes they would read
differently, whatever feature_defs/stored.lock says (a lock deleted, reverted or
regenerated from scratch knows no history; the ledger does)."""

from __future__ import annotations

from feature_defs import SourceDef
from feature_defs.stored_lock import COMPATIBLE, next_stored_name


def written_as_problems(source: SourceDef, steps: list[dict]) -> list[str]:
    """One line per feature of ``source`` that the write ``steps`` of its entity type (the
    ledger's, any status: a failed step may have written some entities; oldest first) say
    would read stored bytes differently: written with an encoding it cannot read, written by
    another source, or dropped by a later write of this source (a re-add)."""
    problems = []
    taken = {name for step in steps for name in step["features"] or []}
    for f in source.features:
        name, fresh = f.stored_name, next_stored_name(f.stored_name, taken)
        writes = [s for s in steps if name in (s["features"] or [])]
        if not writes:
            continue
        last = writes[-1]
        when = f"the {last['kind']} of {last['start_date']} (run {last['run_id'][:12]})"
        where = f"source {source.name!r}: feature {f.name!r}"
        if last["source"] != source.name:
            problems.append(f"{where}: {name!r} holds values of source {last['source']!r} ({when}): set `stored_as: {fresh}`")
            continue
        was = (last["encodings"] or {}).get(name)
        if was is not None and was != f.encoding and (was, f.encoding) not in COMPATIBLE:
            problems.append(
                f"{where}: the stores hold {name!r} as {was} ({when}), defined now as {f.encoding}: its values would be read "
                f"as {f.encoding}; set `stored_as: {fresh}`, or change it back"
            )
            continue
        dropped = [s for s in steps[steps.index(last) + 1 :] if s["source"] == source.name and name not in (s["features"] or [])]
        if dropped:
            d = dropped[0]
            problems.append(
                f"{where}: {name!r} was left out by the {d['kind']} of {d['start_date']} (run {d['run_id'][:12]}) and is back: "
                f"the values written before are still stored (with that newer as-of); set `stored_as: {fresh}`"
            )
    if problems:
        problems.append("the ledger shows what the stores hold; feature_defs/stored.lock did not catch this (missing or regenerated?)")
    return problems

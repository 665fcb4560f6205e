"""The import's files: rendered in a fixed order (the same repository gives the same bytes),
checked as the job would load them before anything is written, then written file by file
where they changed.

The output folder belongs to the import: each file it writes starts with ``MARKER``. An
earlier output is read first for what the next import keeps (mapping.Previous); its files the
new import no longer writes (a view removed in Feast) are removed, and its ``stored.lock`` is
honoured: a change that would make stored values read as something else is refused, naming
the way forward, as ``materialize defs --lock`` does. Other ``*.yaml`` files in the folder
are not the import's: they are loaded with its files in the check, as the job would load
them, and left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from feature_defs.feast_import.errors import FeastImportError
from feature_defs.feast_import.mapping import EARLIER_TTL, KEPT_FEATURE_KEYS, KEPT_SOURCE_KEYS, OLD_MAX_AGE, Plan, Previous
from feature_defs.loader import DefinitionError, load_definitions
from feature_defs.stored_lock import LOCK_NAME, Lock, LockFileError, changes, locked, next_stored_name, read_lock

MARKER = "# Imported from Feast by `materialize import-feast`"
SUMMARY = "IMPORTED.md"
SUMMARY_MARKER = "# Imported from Feast"
ENTITIES = "entities.yaml"
SERVICES = "feature_services.yaml"


def _flow(value) -> str:
    """One YAML value on one line (flow style), quoted where YAML needs it."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1_000_000, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _header(repo: Path, project: str) -> list[str]:
    return [
        MARKER,
        f"# from the Feast repository {repo} (project {project}): edit the repository and import again;",
        f"# {SUMMARY} lists every choice.",
    ]


def source_file_name(name: str) -> str:
    # a view named like the other files keeps its own file
    return f"{name}.source.yaml" if f"{name}.yaml" in (ENTITIES, SERVICES) else f"{name}.yaml"


def render(plan: Plan, repo: Path) -> dict[str, str]:
    """File name -> text of every definition file of ``plan`` (the lock comes later)."""
    head = _header(repo, plan.project)
    files = {}
    lines = [*head, "entities:"]
    for entity in plan.entities:
        data = entity.model_dump(exclude_defaults=True, exclude_none=True)
        lines.append(f"  - name: {_flow(data.pop('name'))}")
        for key, value in data.items():
            if key == "keys":
                lines.append("    keys:")
                lines += [f"      - {_flow(k)}" for k in value]
            else:
                lines.append(f"    {key}: {_flow(value)}")
    files[ENTITIES] = "\n".join(lines) + "\n"
    for source in plan.sources:
        full, data = source.model_dump(exclude_none=True), source.model_dump(exclude_defaults=True, exclude_none=True)
        # on_tie is said even as the default (fail, set by hand): the next import keeps it
        data = {k: data.get(k, v) for k, v in full.items() if k in data or k == "on_tie"}
        if source.location is not None:  # the format is said, Delta (the default) too
            data = {**{k: v for k, v in data.items() if k in ("name", "entity", "location")}, "format": source.format, **data}
        lines = [*head, "source:"]
        for key, value in data.items():
            if key in ("features", "expectations"):
                lines.append(f"  {key}:")
                lines += [f"    - {_flow(item)}" for item in value]
            else:
                lines.append(f"  {key}: {_flow(value)}")
        files[source_file_name(source.name)] = "\n".join(lines) + "\n"
    if plan.services:
        lines = [*head, "feature_services:"]
        for service in plan.services:
            lines.append(f"  - name: {_flow(service.name)}")
            lines.append("    features:")
            lines += [f"      - {_flow(ref)}" for ref in service.features]
            if service.description:
                lines.append(f"    description: {_flow(service.description)}")
        files[SERVICES] = "\n".join(lines) + "\n"
    return files


def _managed(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return False
    return first == (SUMMARY_MARKER if path.name == SUMMARY else MARKER)


def read_previous(out: Path) -> Previous:
    """What the import's files in ``out`` (an earlier import) hold that the next one keeps."""
    if not out.is_dir():
        return Previous()
    entities, sources = {}, {}
    for path in sorted(out.glob("*.yaml")):
        if not _managed(path):
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise FeastImportError(
                [f"{path}: an earlier import's file that is no longer YAML ({' '.join(str(exc).split())}): fix or remove it"]
            ) from None
        if not isinstance(data, dict):
            continue
        for e in data.get("entities") or []:
            if isinstance(e, dict) and isinstance(e.get("name"), str):
                entities[e["name"]] = e
        source = data.get("source")
        if isinstance(source, dict) and isinstance(source.get("name"), str):
            features = {
                f["name"]: {k: f[k] for k in KEPT_FEATURE_KEYS if k in f}
                for f in source.get("features") or []
                if isinstance(f, dict) and isinstance(f.get("name"), str)
            }
            kept = {k: source[k] for k in KEPT_SOURCE_KEYS if k in source}
            if "feast_ttl_seconds" not in source and "max_age_seconds" in kept:  # maybe an earlier import's, from Feast's ttl
                kept[OLD_MAX_AGE] = kept.pop("max_age_seconds")
            if isinstance(source.get("feast_ttl_seconds"), int):
                kept[EARLIER_TTL] = source["feast_ttl_seconds"]
            sources[source["name"]] = {"entity": source.get("entity"), "features": features, **kept}
    try:
        lock = read_lock(out)
    except LockFileError:
        lock = None  # said when the output is checked (check_and_write)
    held = {entity: set(names) for entity, names in lock.entities.items()} if lock else {}
    return Previous(entities=entities, sources=sources, held=held)


def summary(plan: Plan, repo: Path, out: Path) -> str:
    """IMPORTED.md: what was carried over and how, what was left out and why."""
    lines = [
        SUMMARY_MARKER,
        "",
        f"Written by `materialize import-feast` from the Feast repository `{repo}` (project `{plan.project}`,",
        f"read with Feast {plan.feast_version}). The files here are the import's: edit the Feast repository and",
        "import again. An import keeps what an earlier one wrote that must not move (the entity types' prefixes",
        "and tables, the entity type of each source) and what was added by hand: `stored_as`, checks",
        "(`max_null_fraction`, `min_value`, `max_value`, `allowed_values`, `severity`, `max_length`), `compression`,",
        "`max_bytes`, and a source's `schedule`, `lookback_seconds`, `on_tie`, `max_age_seconds` and `expectations`.",
        "",
        f"The job reads these definitions with `definitions_dir: {out}` in the env's config (conf/README.md).",
        "The first `materialize run --env ENV --incremental` loads every row up to now, as",
        "`feast materialize 1990-01-01T00:00:00 NOW` does; each later one continues from where the last stopped.",
        "",
        "## Carried over",
        "",
        *[f"- {line.strip()}" if not line.startswith("  ") else f"  - {line.strip()}" for line in plan.lines],
        "",
        "## Left out",
        "",
        *([f"- {line}" for line in plan.left_out] or ["- nothing"]),
    ]
    if plan.warnings:
        lines += ["", "## Warnings", "", *[f"- {line}" for line in plan.warnings]]
    return "\n".join(lines) + "\n"


@dataclass
class Written:
    """What an import did to its output folder."""

    out: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    lock_changes: list[str] = field(default_factory=list)


def _definition_problems(exc: DefinitionError, stage: Path, out: Path) -> list[str]:
    return [p.replace(str(stage), str(out)) for p in exc.problems]


def _fresh_storage(plan: Plan, lock: Lock, managed: set[str]) -> None:
    """A view new to the output (or back in Feast after an import removed it) has no file in
    which to set a ``stored_as``: a feature of it whose stored name the lock holds (retired, or
    another source's) gets fresh storage, said in the plan's lines, as the lock requires."""
    for i, source in enumerate(plan.sources):
        held = lock.entities.get(source.entity, {})
        if source_file_name(source.name) in managed or not held:
            continue
        taken, features = set(held), []
        for f in source.features:
            entry = held.get(f.stored_name)
            if f.stored_as is None and entry is not None and (entry.retired or entry.source != source.name):
                fresh = next_stored_name(f.stored_name, taken)
                taken.add(fresh)
                why = f"retired on {entry.retired}" if entry.retired else f"held by source {entry.source!r}"
                line = f"  {source.name}:{f.name}: stored as {fresh}: stored.lock has {f.stored_name!r} {why} (fresh storage)"
                mapped = [i for i, text in enumerate(plan.lines) if text.startswith(f"  {source.name}:{f.name}: ")]
                plan.lines.insert(mapped[0] + 1 if mapped else len(plan.lines), line)  # under the feature's own line
                f = f.model_copy(update={"stored_as": fresh})
            features.append(f)
        plan.sources[i] = source.model_copy(update={"features": features})


def check_and_write(plan: Plan, repo: Path, out: Path) -> Written:
    """Check the plan's files as the job would load them, with ``out``'s other definition files
    and its stored.lock; then write what changed. Nothing is written when a check fails."""
    if out.exists() and not out.is_dir():
        raise FeastImportError([f"--out {out}: not a folder"])
    existing = sorted(out.glob("*.y*ml")) if out.is_dir() else []
    managed = {p.name for p in existing if _managed(p)}
    try:
        lock = read_lock(out) if out.is_dir() else None
    except LockFileError as exc:
        raise FeastImportError([str(exc)]) from None
    if lock is not None:
        _fresh_storage(plan, lock, managed)
    files = render(plan, repo)
    others = [p for p in existing if p.name not in managed]
    clash = sorted(p.name for p in others if p.name in files)
    if clash:
        raise FeastImportError(
            [f"{out / name}: exists and was not written by an import: move it, or import into another --out" for name in clash]
        )
    if (out / SUMMARY).exists() and not _managed(out / SUMMARY):
        raise FeastImportError([f"{out / SUMMARY}: exists and was not written by an import: move it, or import into another --out"])

    lock_changes = _check_staged(files, others, lock, out)
    files[SUMMARY] = summary(plan, repo, out)
    return _write_changed(files, managed, out, Written(out, lock_changes=lock_changes))


def _check_staged(files: dict[str, str], others: list[Path], lock: Lock | None, out: Path) -> list[str]:
    """Load the new files beside ``out``'s other definition files and its lock, in a scratch
    folder, as every command will; add the lock they make to ``files``. The lock's changes,
    one line each; a FeastImportError naming ``out``'s files when a check fails."""
    with tempfile.TemporaryDirectory(prefix="feast-import-") as scratch:
        stage = Path(scratch)
        for path in others:
            shutil.copyfile(path, stage / path.name)
        for name, text in files.items():
            (stage / name).write_text(text, encoding="utf-8")
        if lock is not None:
            shutil.copyfile(out / LOCK_NAME, stage / LOCK_NAME)
        try:
            defs = load_definitions(stage, check_lock=False)
            found = changes(defs, lock) if lock is not None else []
            refused = [c for c in found if not c.lockable]
            if refused:
                fix = "set the `stored_as` it names on the feature in that file (the next import keeps it), or undo the change in Feast"
                raise FeastImportError([c.line().replace(str(stage), str(out)) + f"; {fix}" for c in refused])
            lock_changes = [f"{c.where.replace(str(stage) + os.sep, '')}: {c.text}" for c in found]
            files[LOCK_NAME] = locked(defs, lock).text()
            (stage / LOCK_NAME).write_text(files[LOCK_NAME], encoding="utf-8")
            load_definitions(stage)  # what every command will load: strict, with the lock
        except DefinitionError as exc:
            raise FeastImportError(_definition_problems(exc, stage, out)) from None
    return lock_changes


def _write_changed(files: dict[str, str], managed: set[str], out: Path, done: Written) -> Written:
    """Write each of ``files`` whose text changed, and remove the import's files it no longer makes."""
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted(files):
        path = out / name
        if path.is_file() and path.read_text(encoding="utf-8") == files[name]:
            done.unchanged.append(name)
            continue
        scratch_file = out / f".{name}.import"
        scratch_file.write_text(files[name], encoding="utf-8")
        os.replace(scratch_file, path)  # a reader sees the old file or the new one, never half
        done.written.append(name)
    for name in sorted(managed - set(files)):
        (out / name).unlink()
        done.removed.append(name)
    return done

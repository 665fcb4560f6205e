"""``materialize import-feast``: a Feast repository to definition files, end to end.

In order, each step able to stop the import with one line per object and nothing written:
the repository (its ``feature_store.yaml``), the Feast interpreter, Feast reading the
repository (feast_env), the mapping (mapping), the source paths, the check of the files as
the job loads them and against an earlier output's ``stored.lock``, the write (output).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from feature_defs.feast_import.errors import FeastImportError
from feature_defs.feast_import.feast_env import TESTED_FEAST, find_python, read_repo
from feature_defs.feast_import.mapping import Plan, map_repo
from feature_defs.feast_import.output import Written, check_and_write, read_previous

DEFAULT_OUT = Path("feast_defs")
"""Under the working directory: ``feast_defs/<project>``, one folder per Feast project."""
DEFAULT_TIMEOUT = 300.0


@dataclass
class Imported:
    plan: Plan
    written: Written
    python: Path | None
    repo: Path


def read_store_yaml(repo: Path) -> tuple[str, int | None]:
    """(project, Feast's Redis ``key_ttl_seconds``) of the repository's feature_store.yaml."""
    path = repo / "feature_store.yaml"
    if not path.is_file():
        raise FeastImportError(
            [
                f"{repo}: no feature_store.yaml: REPO is the folder of a Feast repository's feature_store.yaml "
                "(`feast init NAME` writes it in NAME/feature_repo)"
            ]
        )
    try:
        data = yaml.safe_load(os.path.expandvars(path.read_text(encoding="utf-8")))  # Feast expands ${VARS} too
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FeastImportError([f"{path}: not YAML: {' '.join(str(exc).split())}"]) from None
    project = data.get("project") if isinstance(data, dict) else None
    if not isinstance(project, str) or not project:
        raise FeastImportError([f"{path}: no `project:` (Feast needs one too)"])
    online = data.get("online_store")
    ttl = online.get("key_ttl_seconds") if isinstance(online, dict) and online.get("type") == "redis" else None
    return project, ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else None


def default_out(project: str) -> Path:
    folder = project if re.fullmatch(r"[A-Za-z0-9_.-]+", project) and project not in (".", "..") else "feast"
    return DEFAULT_OUT / folder


def import_feast(
    repo: str | os.PathLike,
    out: str | os.PathLike | None = None,
    feast_python: str | None = None,
    allow_missing_data: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> Imported:
    """Import the Feast repository ``repo`` into ``out`` (default ``feast_defs/<project>``)."""
    if not timeout > 0:
        raise FeastImportError([f"--timeout {timeout:g}: give Feast more than 0 seconds"])
    repo = Path(repo).expanduser().absolute()
    if not repo.is_dir():
        raise FeastImportError([f"{repo}: no such folder"])
    repo = repo.resolve()
    project, key_ttl = read_store_yaml(repo)
    python = find_python(feast_python)
    dump = read_repo(repo, python, timeout)
    target = Path(out).expanduser() if out else default_out(project)
    return import_dump(dump, repo, target, project, key_ttl, allow_missing_data, python)


def import_dump(
    dump: dict,
    repo: Path,
    out: Path,
    project: str,
    key_ttl_seconds: int | None = None,
    allow_missing_data: bool = False,
    python: Path | None = None,
) -> Imported:
    """The import's steps after Feast has read the repository: ``dump`` is what feast_dump.py
    printed for ``repo``."""
    out = out.absolute()
    plan = map_repo(dump, repo, project, read_previous(out), key_ttl_seconds)
    if not plan.feast_version.startswith(TESTED_FEAST):
        plan.warnings.append(f"read with Feast {plan.feast_version}; the import is tested with Feast {TESTED_FEAST}x")
    if dump.get("config_error"):
        plan.warnings.append(
            f"Feast could not load feature_store.yaml ({dump['config_error']}; `feast plan` in the repository says why): "
            "nothing was inferred from the sources"
        )
    if plan.missing and not allow_missing_data:
        raise FeastImportError([f"{m}: nothing imported (--allow-missing-data imports before the data exists)" for m in plan.missing])
    plan.warnings += [f"{m} (imported: --allow-missing-data)" for m in plan.missing]
    if not plan.sources:
        kinds = ("feature view ", "stream feature view ", "on-demand feature view ", "label view ")
        views = [line for line in plan.left_out if line.startswith(kinds)]
        raise FeastImportError([f"{repo}: no feature view can be carried over", *views])
    return Imported(plan, check_and_write(plan, repo, out), python, repo)


def report(done: Imported) -> list[str]:
    """What the command prints: every choice, what was left out, what was written, what next."""
    plan, out = done.plan, done.written
    by = f" by {done.python}" if done.python else ""
    lines = [f"Feast repository {done.repo} (project {plan.project}), read with Feast {plan.feast_version}{by}"]
    lines += plan.lines
    if plan.left_out:
        lines.append(f"left out ({len(plan.left_out)}):")
        lines += [f"  {line}" for line in plan.left_out]
    lines += [f"warning: {line}" for line in plan.warnings]
    lines += [f"stored.lock: {line}" for line in out.lock_changes]
    wrote = f"wrote {', '.join(out.written)}" if out.written else "nothing changed"
    if out.written and out.unchanged:
        wrote += f"; unchanged: {', '.join(out.unchanged)}"
    if out.removed:
        wrote += f"; removed: {', '.join(out.removed)}"
    lines.append(f"{out.out}: {wrote}")
    lines.append(
        f"The job reads these definitions with `definitions_dir: {out.out}` in the env's config (conf/<env>/*.yaml); "
        "`materialize defs --env <env>` then lists them, and `materialize run --env <env> --incremental` loads them: the first "
        "run every row up to now, as `feast materialize 1990-01-01T00:00:00 NOW`, each later one from where the last stopped."
    )
    return lines

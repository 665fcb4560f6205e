"""The docs cannot drift from the code.

Every ``materialize`` command and flag the ``*.md`` files show exists in the CLI, every
config key of the reference in conf/README.md exists in the config model and every key
of the model is listed there, and every relative link and ``#anchor`` resolves. No Spark,
no servers: the parser and the pydantic models are read as they are.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from fm_config import RunConf
from jobs.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CONF_DOC = ROOT / "conf" / "README.md"
SKIPPED_DIRS = {"jars", "data", "reports", "dist", "node_modules", "__pycache__"}
"""Not docs: generated data and artifacts (and every hidden folder: .venv, .run, .git)."""


@dataclass(frozen=True)
class Code:
    """A piece of code in a doc: an inline code span, or one (joined) line of a code block."""

    path: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        found.extend(Path(folder) / f for f in sorted(files) if f.endswith(".md"))
    return found


_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def _blocks_and_prose(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, inside a fenced code block) of every line but the fences."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        match = _FENCE.match(line)
        if match and (fence is None or match.group(1) == fence):
            fence = match.group(1) if fence is None else None
            continue
        yield number, line, fence is not None


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each paragraph outside code blocks, so that a code span
    or a link wrapped over two lines is read whole."""
    start, lines = 0, []
    for number, line, in_block in [*_blocks_and_prose(path), (0, "", True)]:
        if in_block or not line.strip():
            if lines:
                yield start, "\n".join(lines)
            start, lines = 0, []
        else:
            start, lines = start or number, [*lines, line]


def _line(start: int, text: str, pos: int) -> int:
    return start + text.count("\n", 0, pos)


def code_of(path: Path) -> list[Code]:
    """Code spans of the prose, and code-block lines with their continuations joined: a
    line after one ending in a backslash, or an indented line starting with an option
    (``    [--redis-url URL] ...`` under a usage line)."""
    out: list[Code] = []
    for start, text in prose(path):
        out.extend(Code(path, _line(start, text, m.start()), " ".join(m.group(2).split())) for m in _SPAN.finditer(text))
    joining, previous = False, -1
    for number, line, in_block in _blocks_and_prose(path):
        if not in_block:
            joining, previous = False, -1
            continue
        text = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # shell and usage comments
        continues = joining or (line[:1].isspace() and text.lstrip().startswith(("[-", "--")))
        if continues and previous >= 0:
            joined = out[previous].text.rstrip("\\").rstrip()
            out[previous] = Code(path, out[previous].line, f"{joined} {text.strip()}")
        else:
            out.append(Code(path, number, text))
            previous = len(out) - 1
        joining = text.endswith("\\")
    return out


# `materialize <command> ...`, `.venv/bin/materialize ...`; `jobs/materialize.py ...` is `materialize run`
_INVOCATION = re.compile(r"(?<![\w.-])(?<!feast )(?:materialize|(?P<entry>jobs/materialize\.py))(?=\s|$)(?P<rest>.*)")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


@dataclass(frozen=True)
class Invocation:
    code: Code
    command: str | None
    """None: no command named (``materialize --help``)."""
    flags: tuple[str, ...]


def invocations(docs: list[Path]) -> list[Invocation]:
    found = []
    for path in docs:
        for code in code_of(path):
            for segment in re.split(r"\s(?:\|\||&&|\|)\s|;", code.text):  # one command each
                match = _INVOCATION.search(segment)
                if not match:
                    continue
                rest = match.group("rest")
                words = rest.split()
                if match.group("entry"):
                    command = "run"
                elif words and re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
                    command = words[0]
                elif not words or words[0].startswith("-"):
                    command = None
                else:
                    continue  # a placeholder such as <command>
                found.append(Invocation(code, command, tuple(_FLAG.findall(rest))))
    return found


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "the materialize parser should have one set of subcommands"
    return dict(actions[0].choices)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _nested_model(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_nested_model, typing.get_args(annotation)) if m]
        return models[0] if models else None
    return None


def model_keys(model: type[BaseModel], prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaf keys, section keys) of a config model, dotted, aliases included."""
    leaves: set[str] = set()
    sections: set[str] = set()
    for name, field in model.model_fields.items():
        names = {name} | {a for a in (field.alias, field.validation_alias) if isinstance(a, str)}
        nested = _nested_model(field.annotation)
        for key in names:
            if nested is None:
                leaves.add(prefix + key)
            else:
                sections.add(prefix + key)
                more_leaves, more_sections = model_keys(nested, f"{prefix}{key}.")
                leaves |= more_leaves
                sections |= more_sections
    return leaves, sections


def documented_keys(path: Path = CONF_DOC) -> dict[str, int]:
    """Keys named in the first column of the tables whose header starts with ``key``
    (``| `redis.max_fill` / `redis.hard_fill` | ...`` names two), with their line."""
    keys: dict[str, int] = {}
    in_table = False
    for number, line, in_block in _blocks_and_prose(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") and not in_block else []
        if not cells:
            in_table = False
        elif cells[0].lower() == "key":
            in_table = True
        elif in_table and not re.fullmatch(r":?-+:?", cells[0]):
            for name in re.findall(r"`([^`]+)`", cells[0]):
                keys.setdefault(name, number)
    return keys


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line, in_block in _blocks_and_prose(path):
        if in_block:
            continue
        out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^[ \t]*\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:\s|$)", re.M)


def links(path: Path) -> Iterator[tuple[int, str]]:
    """Link targets of the prose (not inside code), with their line."""
    for start, text in prose(path):
        text = _SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # keeps the offsets
        for m in [*_LINK.finditer(text), *_REF_LINK.finditer(text)]:
            yield _line(start, text, m.start()), m.group(1)


def link_problems(docs: list[Path]) -> list[str]:
    problems = []
    cache: dict[Path, set[str]] = {}
    for path in docs:
        for number, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            where = f"{path.relative_to(ROOT)}:{number}: link {target!r}"
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                problems.append(f"{where}: no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
                continue
            if anchor:
                if resolved.suffix != ".md" or resolved.is_dir():
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                    continue
                if anchor not in cache.setdefault(resolved, anchors(resolved)):
                    problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(ROOT)}")
    return problems


def command_problems(found: list[Invocation], commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    return [
        f"{i.code.where()}: `materialize {i.command}` is not a command (commands: {', '.join(sorted(commands))}) in {i.code.text!r}"
        for i in found
        if i.command is not None and i.command not in commands
    ]


def flag_problems(found: list[Invocation], commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    global_flags = options(build_parser())
    problems = []
    for i in found:
        if i.command is not None and i.command not in commands:
            continue  # reported as an unknown command
        known = global_flags | (options(commands[i.command]) if i.command else set())
        problems.extend(
            f"{i.code.where()}: {flag} is not an option of `materialize{' ' + i.command if i.command else ''}` in {i.code.text!r}"
            for flag in i.flags
            if flag not in known
        )
    return problems


def key_problems(documented: dict[str, int], model: type[BaseModel] = RunConf, doc: Path = CONF_DOC) -> tuple[list[str], list[str]]:
    """(keys documented but not in the model, keys of the model not documented)."""
    leaves, sections = model_keys(model)
    where = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc
    unknown = [
        f"{where}:{line}: `{key}` is not a key of the config model ({model.__name__})"
        for key, line in sorted(documented.items())
        if key not in leaves | sections
    ]
    missing = [
        f"{where}: config key `{key}` ({model.__name__}) is missing from the configuration table"
        for key in sorted(leaves - set(documented))
    ]
    return unknown, missing


# --- the checks -----------------------------------------------------------------------


def test_the_checks_see_the_docs():
    """Guards the guards: the docs are found and parsed, so the checks below cannot pass on nothing."""
    docs = doc_files()
    named = {p.relative_to(ROOT).as_posix() for p in docs}
    assert {"README.md", "conf/README.md", "serializers/FORMAT.md"} <= named, f"docs found: {sorted(named)}"
    assert not any(part.startswith(".") or part in SKIPPED_DIRS for p in named for part in Path(p).parts[:-1])
    found = invocations(docs)
    assert {"run", "backfill", "validate", "schema"} <= {i.command for i in found}, (
        f"commands seen in the docs: {sorted({str(i.command) for i in found})}"
    )
    assert "--redis-url" in {f for i in found for f in i.flags}, "the usage line's continuation was not joined"
    assert len(documented_keys()) >= 40, f"config keys read from {CONF_DOC.relative_to(ROOT)}: {sorted(documented_keys())}"
    assert sum(1 for p in docs for _ in links(p)) >= 20, "links found in the docs"


def test_every_materialize_command_in_the_docs_exists():
    problems = command_problems(invocations(doc_files()), subcommands())
    assert not problems, "commands in the docs that the CLI does not have:\n  " + "\n  ".join(problems)


def test_every_flag_shown_with_a_command_is_an_option_of_it():
    problems = flag_problems(invocations(doc_files()), subcommands())
    assert not problems, "flags in the docs that the command does not take:\n  " + "\n  ".join(problems)


def test_every_config_key_in_the_reference_exists_in_the_config_model():
    unknown, _ = key_problems(documented_keys())
    assert not unknown, "config keys documented but not in fm_config/run.py:\n  " + "\n  ".join(unknown)


def test_every_key_of_the_config_model_is_documented():
    _, missing = key_problems(documented_keys())
    assert not missing, "config keys not documented in conf/README.md:\n  " + "\n  ".join(missing)


def test_every_relative_link_and_anchor_resolves():
    problems = link_problems(doc_files())
    assert not problems, "broken links in the docs:\n  " + "\n  ".join(problems)


def test_anchors_follow_githubs_rules():
    assert slug("Online format (version 1)") == "online-format-version-1"
    assert slug("Backfills, the run ledger and cleanup") == "backfills-the-run-ledger-and-cleanup"
    assert slug("SQL layout (CockroachDB; PostgreSQL on the same wire)") == "sql-layout-cockroachdb-postgresql-on-the-same-wire"
    assert slug("Snapshot-order guard") == "snapshot-order-guard"


def test_the_delta_jars_the_docs_show_are_the_ones_set_up():
    """Docs show the Delta jars in example commands: each name and Maven coordinate is one of
    jobs/jars.py's (which the set-up, the Makefile and the job use), as is the pinned Python package."""
    from jobs.jars import ARTIFACTS, DELTA_JARS, DELTA_VERSION

    shown = [
        (path.relative_to(ROOT), m)
        for path in doc_files()
        for m in re.findall(r"delta-(?:spark|storage)[\w.-]*?\.jar|io\.delta:[\w.-]+:[\w.-]*\w", path.read_text(encoding="utf-8"))
    ]
    assert len(shown) >= 8, shown
    stale = [f"{where}: {name}" for where, name in shown if name not in {*DELTA_JARS, *ARTIFACTS}]
    assert not stale, f"not jobs/jars.py's Delta jars ({', '.join(DELTA_JARS)}):\n  " + "\n  ".join(stale)
    for pins in ("requirements.txt", "pyproject.toml"):
        assert f"delta-spark=={DELTA_VERSION}" in (ROOT / pins).read_text(), pins


def _submit_args(block: str) -> list[str]:
    """The arguments of the spark-submit command in a bash block (continuation lines joined)."""
    line = next(line for line in block.replace("\\\n", " ").splitlines() if "submit" in line and "make" not in line)
    tokens = shlex.split(line)
    return tokens[next(i for i, t in enumerate(tokens) if t.endswith(("spark-submit", "submit-cluster.sh"))) + 1 :]


def test_cluster_mode_templates_use_the_tested_arguments():
    """sinks/README.md's cluster deploy mode: the standalone line is what tests/test_spark_cluster.py
    submits; the YARN and Kubernetes templates keep each of its arguments, in order, bar the
    master, the bundle's path and name, the jars' paths and standalone's waitAppCompletion."""
    from tests.support.cli import ROOT
    from tests.support.spark_submit import DELTA_JARS, cluster_mode_args

    text = (ROOT / "sinks" / "README.md").read_text()
    section = text[text.index("#### Cluster deploy mode") :]
    section = section[: section.index("\n### ")]
    standalone, yarn, k8s = (_submit_args(b) for b in re.findall(r"```bash\n(.*?)```", section, re.S))
    job = ["run", "--env", "prod", "--date", "2026-11-20"]
    tested = cluster_mode_args("spark://MASTER:7077", Path("dist/feature_materializer-0.1.0-job.jar"), job, sizing=[])
    jars = ",".join(map(str, DELTA_JARS))
    assert standalone == [a.replace(jars, jars.replace(f"{ROOT}/", "")) for a in tested]
    varying = {"spark://MASTER:7077", "dist/feature_materializer-0.1.0-job.jar", "feature_materializer-0.1.0-job.jar", jars}
    wait = tested.index("spark.standalone.submit.waitAppCompletion=true")
    kept = [a for a in tested[: wait - 1] + tested[wait + 1 :] if a not in varying]
    for name, template in (("YARN", yarn), ("Kubernetes", k8s)):
        rest = iter(template)
        missing = [a for a in kept if a not in rest]  # a subsequence: the same order
        assert not missing, f"{name} template lacks {missing} (in this order: {kept})"
        assert template[-len(job) - 1] == "" and template[-len(job) :] == job, name

"""The user's Feast environment: which interpreter runs Feast, and reading a repository with it.

This project never imports Feast (it pins its own protobuf, pandas and FastAPI). The dump
script (feast_dump.py, standard library and Feast only) is fed on stdin to the interpreter of
the user's Feast, in a fresh process whose working directory is the repository: Feast's own
code reads the repository exactly as ``feast apply`` would, and the process prints JSON.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from feature_defs.feast_import.errors import FeastImportError

DUMP_SCRIPT = Path(__file__).with_name("feast_dump.py")
DUMP_FORMAT = 1
"""The JSON shape feast_dump.py prints (its FORMAT)."""
TESTED_FEAST = "0.67."
HOW_TO_PASS = "pass the Python of your Feast environment with --feast-python (e.g. --feast-python ~/venvs/feast/bin/python)"


def find_python(explicit: str | None = None) -> Path:
    """``explicit`` (``--feast-python``), else the interpreter of the ``feast`` command on PATH."""
    if explicit:
        found = shutil.which(os.path.expanduser(explicit))
        if found is None:
            raise FeastImportError([f"--feast-python {explicit}: no such executable"])
        # absolute, since it runs from the repository's folder; not resolved: a venv's python is a symlink
        return Path(os.path.abspath(found))
    feast = shutil.which("feast")
    if feast is None:
        raise FeastImportError([f"no `feast` command on PATH to find Feast's Python by: {HOW_TO_PASS}"])
    return interpreter_of(Path(feast))


def interpreter_of(script: Path) -> Path:
    """The interpreter a ``feast`` console script runs with: its shebang (pip writes the
    venv's python there, or, for a long path, an ``exec`` line), else the python beside it."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        head = []
    if head and head[0].startswith("#!"):
        words = head[0][2:].split()
        if words and "python" in Path(words[0]).name:
            return Path(words[0])
        if words and Path(words[0]).name == "env" and len(words) > 1 and "python" in words[-1]:
            found = shutil.which(words[-1], path=str(script.parent) + os.pathsep + os.environ.get("PATH", ""))
            if found:
                return Path(found)
        for line in head[1:3]:  # pip's form for a long interpreter path: '''exec' /path/python "$0" "$@"
            match = re.match(r"^'''exec' (\S+) ", line)
            if match:
                return Path(match.group(1))
    for name in ("python", "python3"):
        beside = script.resolve().parent / name
        if beside.exists():
            return beside
    raise FeastImportError([f"cannot tell which Python runs {script}: {HOW_TO_PASS}"])


def read_repo(repo: Path, python: Path, timeout: float) -> dict:
    """Feast's objects of ``repo`` as feast_dump.py prints them; a FeastImportError of one line
    naming the file and line (a repository that does not load) or the interpreter otherwise."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")  # no __pycache__ left in the user's repository
    try:
        done = subprocess.run(
            [str(python), "-", str(repo)],
            input=DUMP_SCRIPT.read_text(encoding="utf-8"),
            capture_output=True,
            text=True,
            cwd=repo,
            env=env,
            timeout=timeout,
        )
    except OSError as exc:
        raise FeastImportError([f"cannot run the Feast interpreter {python}: {exc.strerror or exc}; {HOW_TO_PASS}"]) from None
    except subprocess.TimeoutExpired:
        raise FeastImportError(
            [f"{repo}: reading the repository with Feast took over {timeout:g} s (its Python files run on import): see --timeout"]
        ) from None
    last = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), "")
    try:
        out = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else None
    except (ValueError, IndexError):
        out = None
    if not isinstance(out, dict) or out.get("format") != DUMP_FORMAT:
        raise FeastImportError(
            [f"the Feast interpreter {python} failed reading {repo} (exit code {done.returncode}): {last or 'no output'}"]
        )
    error = out.get("error")
    if error:
        kind, message = error.get("kind"), error.get("message", "")
        if kind == "no_feast":
            raise FeastImportError([f"{message}: {HOW_TO_PASS}"])
        if kind == "load":
            where = repo / error["file"] if error.get("file") else repo
            line = f":{error['line']}" if error.get("line") else ""
            raise FeastImportError([f"{where}{line}: the Feast repository does not load: {message}"])
        raise FeastImportError([f"{repo}: Feast failed reading the repository: {message}"])
    return out

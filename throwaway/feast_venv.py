"""Feast in a venv of its own (``.run/feast-venv``), for the tests, the benchmarks and the
checks beside Feast: the one place that makes it.

Feast is pinned with everything it pulls in ``scripts/feast/feast-requirements.txt``
(``feast[redis]==0.67.0``, frozen). ``scripts/setup.sh --test`` (``make test``) makes the
venv up front, so no test pays for the install; ``python -m throwaway.feast_venv`` makes or
refreshes it by hand. As the S3 test server's venv, it is stamped with the requirement file's
hash: a changed pin reinstalls it. Feast's own stack (pandas, dask, FastAPI, its own protobuf
pins) stays out of the project's venv, as it stays out of the product. Development tooling:
not in the wheel.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from throwaway.venvs import clean_env

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "scripts" / "feast" / "feast-requirements.txt"
VENV = ROOT / ".run" / "feast-venv"
SETUP_HINT = "bash scripts/setup.sh --test (make test does), or python -m throwaway.feast_venv"


def pinned() -> str:
    """Feast's pin as the requirement file holds it, e.g. ``feast==0.67.0``."""
    (line,) = [x for x in REQUIREMENTS.read_text().splitlines() if x.startswith("feast==")]
    return line


def _stamp() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    return VENV / f".installed-{digest}"


def installed() -> bool:
    return _stamp().is_file() and (VENV / "bin" / "feast").exists()


def python() -> Path:
    """The venv's interpreter; the venv must have been made (the suite never installs it)."""
    if not installed():
        raise RuntimeError(f"Feast's venv is missing or out of date ({VENV}): run {SETUP_HINT}")
    return VENV / "bin" / "python"


def feast() -> Path:
    """The venv's ``feast`` command (see :func:`python`)."""
    return python().parent / "feast"


def ensure() -> Path:
    """Make or refresh the venv when its stamp does not match the requirements; its interpreter."""
    if not installed():
        print(f"installing Feast into {VENV} from {REQUIREMENTS.relative_to(ROOT)} (about 30 s, once)", flush=True)
        VENV.parent.mkdir(parents=True, exist_ok=True)
        env = clean_env()
        if not (VENV / "bin" / "python").exists():
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(VENV)], check=True, env=env, timeout=300)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)]
        subprocess.run(pip, check=True, env=env, timeout=1800)
        for old in VENV.glob(".installed-*"):
            old.unlink()
        _stamp().touch()
    return python()


if __name__ == "__main__":
    print(ensure())

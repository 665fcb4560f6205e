"""Throwaway venvs of the project's wheel and its extras, for the install tests
(tests/test_install.py) and the size benchmark (bench/install_size.py): the wheel built
from this checkout, a wheelhouse pinned by constraints.txt (`.run/wheelhouse`, downloaded
from the index on a first run, offline after), venvs installed from it alone, and their
size on disk. Development tooling: not in the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".run" / "wheelhouse"
CONSTRAINTS = ROOT / "constraints.txt"
PRODUCT_PACKAGES = tuple(
    sorted({p.split(".")[0] for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]})
)
"""The wheel's top-level packages, as pyproject.toml lists them."""
# what only the Spark job (or the development venv) needs: never in a reader's or a server's install
SPARK_ONLY = (
    "pyspark",
    "pyspark-client",
    "py4j",
    "delta-spark",
    "great-expectations",
    "pandas",
    "pyarrow",
    "apache-airflow",
    "apache-airflow-core",
)
GOAL_MIB = 150
MIB = 1 << 20


def clean_env() -> dict[str, str]:
    """The environment without PYTHONPATH (a checkout on it would shadow the installed wheel)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _pip(*args: str, python: str = sys.executable, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, env=clean_env(), timeout=1800)
    if check and done.returncode:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def build_wheel(out_dir: Path) -> Path:
    """The project's wheel, built from a copy of the checkout's files (tracked and new, not
    ignored): the build writes nothing into the checkout."""
    out_dir.mkdir(parents=True, exist_ok=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="fm-wheel-") as scratch:
        src = Path(scratch) / "src"
        for name in filter(None, listed.decode().split("\0")):
            path = ROOT / name
            if path.is_file() and not name.startswith(".venv"):
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, src / name)
        _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out_dir), str(src))
    (wheel,) = out_dir.glob("feature_materializer-*.whl")
    return wheel


def requirement(wheel: Path, extras: str = "") -> str:
    return f"{wheel}[{extras}]" if extras else str(wheel)


def fill_wheelhouse(wheel: Path, extras: str = "", house: Path = WHEELHOUSE) -> Path:
    """``house`` holding every wheel ``wheel[extras]`` needs, at constraints.txt's pins:
    checked offline first; what is missing is downloaded from the index (a first run), and
    a package published only as source (pyspark) is built into a wheel once."""
    house.mkdir(parents=True, exist_ok=True)
    common = ["wheel", "-q", "-w", str(house), "-c", str(CONSTRAINTS), requirement(wheel, extras)]
    if _pip(*common, "--no-index", "--find-links", str(house), check=False).returncode:
        _pip(*common, "--find-links", str(house))
    for copied in house.glob("feature_materializer-*"):  # pip wheel copies the project's own wheel too
        copied.unlink()
    return house


def resolve(wheel: Path, extras: str = "", house: Path = WHEELHOUSE) -> dict[str, str]:
    """What ``pip install wheel[extras]`` would install in an empty venv (nothing installed),
    resolved offline against the wheelhouse: {normalized name: version}."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        _pip(
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--report",
            str(report),
            "--no-index",
            "--find-links",
            str(house),
            requirement(wheel, extras),
        )
        installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in installs}


def make_venv(path: Path, wheel: Path, extras: str = "", house: Path = WHEELHOUSE, with_pip: bool = False) -> Path:
    """A fresh venv at ``path`` holding ``wheel[extras]`` installed offline from ``house``.
    Without pip: the venv holds what the install brings and nothing else (this
    interpreter's pip installs into it)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)], check=True, env=clean_env(), timeout=300)
    python = str(path / "bin" / "python")
    args = ["install", "-q", "--no-index", "--find-links", str(house), requirement(wheel, extras)]
    if with_pip:
        _pip(*args, python=python)
    else:
        _pip("--python", python, *args)
    return path


def disk_usage(path: Path) -> int:
    """Bytes of disk ``path`` takes, as ``du -s`` counts them (allocated blocks, each inode once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total + os.lstat(path).st_blocks * 512


def distribution_sizes(venv: Path) -> dict[str, int]:
    """Disk bytes of each installed distribution (the files its RECORD lists, compiled .pyc included), largest first."""
    (site,) = (p.resolve() for p in (venv / "lib").glob("python3*/site-packages"))
    sizes = {}
    for record in site.glob("*.dist-info/RECORD"):
        total = 0
        for line in record.read_text().splitlines():
            name = line.rsplit(",", 2)[0]
            file = (site / name).resolve()
            if file.is_file() and site in file.parents:
                total += os.lstat(file).st_blocks * 512
        sizes[record.parent.name.split("-")[0].lower().replace("_", "-")] = total
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))

"""`python -m bench.install_size`: how much disk each kind of install takes.

Builds the project's wheel, fills a wheelhouse with what each install needs (pinned by
constraints.txt; `.run/wheelhouse`, downloaded from the index on a first run, offline
after), installs into fresh venvs and measures them (disk usage, as `du`):

- ``server``: ``feature-materializer[server]``, what the feature server's host installs,
  with only the packages that install brings (the venv made ``--without-pip``);
- ``server, with pip``: the same in a venv as ``python -m venv`` makes it (Python 3.11 puts
  pip and setuptools in every venv);
- ``base``: ``feature-materializer``, what a model service that reads features installs;
- ``spark`` (``--spark``, downloads about 700 MB once): the nightly job's driver;
- the baseline: the development ``.venv`` (requirements.txt: everything, with Airflow and
  the test tools), which every install was before the extras.

The wheel, wheelhouse and venv helpers are throwaway/venvs.py's, which the tests use too.
Development tooling: not in the wheel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from throwaway.venvs import (
    GOAL_MIB,
    MIB,
    ROOT,
    build_wheel,
    disk_usage,
    distribution_sizes,
    fill_wheelhouse,
    make_venv,
)  # noqa: F401


def _mib(n: int) -> float:
    return round(n / MIB, 1)


def measure_install(name: str, wheel: Path, extras: str, work: Path, with_pip: bool = False) -> dict:
    fill_wheelhouse(wheel, extras)
    start = time.perf_counter()
    venv = make_venv(work / name.replace(" ", "-").replace(",", ""), wheel, extras, with_pip=with_pip)
    seconds = time.perf_counter() - start
    size = disk_usage(venv)
    dists = distribution_sizes(venv)
    result = {
        "install": f"feature-materializer[{extras}]" if extras else "feature-materializer",
        "pip_and_setuptools_in_venv": with_pip, "mib": _mib(size), "bytes": size, "install_seconds": round(seconds, 1),
        "distributions": len(dists), "largest_mib": {k: _mib(v) for k, v in list(dists.items())[:8]},
    }  # fmt: skip
    shutil.rmtree(venv)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.install_size", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spark", action="store_true", help="also measure a venv of the [spark] extra (downloads about 700 MB once)")
    parser.add_argument("--baseline", default=str(ROOT / ".venv"), help="the venv measured as the baseline (default: .venv)")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "install_size.json"), help="the JSON written (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    installs = {}
    with tempfile.TemporaryDirectory(prefix="fm-install-size-") as scratch:
        work = Path(scratch)
        wheel = build_wheel(work / "dist")
        plan = [("server", "server", False), ("server, with pip", "server", True), ("base", "", False)]
        plan += [("spark", "spark", False)] if args.spark else []
        for name, extras, with_pip in plan:
            installs[name] = measure_install(name, wheel, extras, work, with_pip)
            print(
                f"{name:<18} {installs[name]['mib']:>8.1f} MiB  {installs[name]['distributions']:>3} distributions  "
                f"(installed in {installs[name]['install_seconds']} s)",
                flush=True,
            )
    baseline = Path(args.baseline).resolve()
    base_size = disk_usage(baseline)
    print(f"{'baseline':<18} {_mib(base_size):>8.1f} MiB  {baseline} (the development venv: requirements.txt)")
    server = installs["server"]["mib"]
    ratio = server / _mib(base_size)
    print(
        f"server / baseline: {ratio:.3f} ({_mib(base_size) / server:.1f}x smaller); "
        f"goal: server at most {GOAL_MIB} MiB: {'met' if server <= GOAL_MIB else 'NOT met'}"
    )
    out = {
        "python": sys.version.split()[0], "platform": sys.platform, "unit": "MiB of disk (du)", "goal_mib": GOAL_MIB,
        "installs": installs, "baseline": {"venv": "the development .venv (requirements.txt)", "mib": _mib(base_size), "bytes": base_size},
        "server_over_baseline": round(ratio, 4), "goal_met": server <= GOAL_MIB,
    }  # fmt: skip
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

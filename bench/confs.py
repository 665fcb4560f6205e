"""A benchmark's own config folder: the project's conf/base and one env of its settings."""

from __future__ import annotations

import shutil
from pathlib import Path

from fm_config import PROJECT_ROOT


def bench_conf(workdir: Path, env: str, settings: str) -> Path:
    """``workdir/conf`` (point FM_CONF_DIR at it): conf/base as the project has it and ``env`` with ``settings`` (YAML)."""
    conf = workdir / "conf"
    shutil.rmtree(conf, ignore_errors=True)
    shutil.copytree(PROJECT_ROOT / "conf" / "base", conf / "base")
    (conf / env).mkdir()
    (conf / env / "materialize.yaml").write_text(settings)
    return conf


def redis_only(workdir: Path, defs: Path, redis_url: str) -> str:
    """Settings of a run (or server) of ``defs`` into Redis alone, its files under ``workdir``."""
    return (
        f"redis:\n  url: {redis_url}\n  password_env: null\n"
        f"definitions_dir: {defs}\ndata_root: {workdir / 'data'}\nreports_dir: {workdir / 'reports'}\n"
        "sinks: [redis]\n"
    )

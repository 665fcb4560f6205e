"""Config folders of a test's own."""

from __future__ import annotations

from pathlib import Path


def env_conf(folder: Path, env: str, settings: str) -> Path:
    """A conf folder of its own (point FM_CONF_DIR at it): an empty base and ``env`` with these settings (YAML)."""
    (folder / "base").mkdir(parents=True)
    (folder / env).mkdir()
    (folder / env / "m.yaml").write_text(settings)
    return folder

"""Config folders of a test's own, and the reader's conf on one Redis."""

from __future__ import annotations

from pathlib import Path

from fm_config import RunConf
from fm_config.reader import CacheSettings, ReaderSettings
from fm_config.redis import RedisSettings


def env_conf(folder: Path, env: str, settings: str) -> Path:
    """A conf folder of its own (point FM_CONF_DIR at it): an empty base and ``env`` with these settings (YAML)."""
    (folder / "base").mkdir(parents=True)
    (folder / env).mkdir()
    (folder / env / "m.yaml").write_text(settings)
    return folder


def reader_conf(url: str, **cache) -> RunConf:
    """A reader's conf on the standalone Redis at ``url``, its L1 cache settings updated by ``cache``."""
    # a deadline no busy machine reaches (the 1,000 reads of a paused Redis missed 5 s beside a second suite):
    # the tests of timeouts set their own (test_reader.py's _timeout_conf)
    return RunConf(
        env="test", sinks=["redis"], redis=RedisSettings(url=url, password_env=None, mode="standalone"),
        reader=ReaderSettings(timeout_ms=30_000, cache=CacheSettings(**{"ttl_seconds": 60, "early_refresh_beta": 0, **cache})),
    )  # fmt: skip

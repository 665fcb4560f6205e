"""Loading the run configuration: ``conf/base/*.yaml`` overlaid by ``conf/<env>/*.yaml``.

The env comes from ``--env``, else ``FM_ENV``, else ``local``; the folder from
``FM_CONF_DIR``, else the project's ``conf/``. A duplicate key, an unknown key or a literal
secret is an error that names the file and line.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from feature_defs.yamlio import YamlFileError, describe_validation_error, line_of, load_yaml
from fm_config.base import ConfigError
from fm_config.run import DEFAULT_ENV, PROJECT_ROOT, RunConf

ENV_VAR = "FM_ENV"
CONF_DIR_VAR = "FM_CONF_DIR"


def _deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _merge_layer(merged: dict, layer: dict) -> dict:
    """Overlay one layer. A layer that names where a password is (env var or file) replaces
    the other way a lower layer named: conf/prod's password_file wins over base's password_env."""
    out = _deep_merge(merged, layer)
    ways = {"password_env", "password_file"}
    for path in (("redis",), ("sql",), ("reader", "redis"), ("reader", "sql")):
        part, into = layer, out
        for key in path[:-1]:
            part = part.get(key) if isinstance(part, dict) else None
            into = into.get(key) if isinstance(into, dict) else None
        part = part.get(path[-1]) if isinstance(part, dict) else None
        named = ways & set(part) if isinstance(part, dict) else set()
        if len(named) == 1 and isinstance(into, dict) and isinstance(into.get(path[-1]), dict):
            into[path[-1]] = {**into[path[-1]], (ways - named).pop(): None}
    return out


def conf_dir() -> Path:
    return Path(os.environ.get(CONF_DIR_VAR) or PROJECT_ROOT / "conf")


def load_config(env: str | None = None, overrides: dict | None = None) -> RunConf:
    """Read base + env config; ``overrides`` (from CLI flags) win over both."""
    env = env or os.environ.get(ENV_VAR) or DEFAULT_ENV
    root = conf_dir()
    folders = [root / "base", root / env]
    if not (root / env).is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "base") if root.is_dir() else []
        raise ConfigError(f"unknown env {env!r}: no folder {root / env} (envs: {', '.join(known) or 'none'})")
    merged: dict = {}
    read: list[Path] = []
    problems: list[str] = []
    for folder in folders:
        for path in sorted(folder.glob("*.yaml")):
            try:
                data, node = load_yaml(path)
            except YamlFileError as exc:
                problems.append(str(exc))
                continue
            if not isinstance(data, dict):
                problems.append(f"{path}:{line_of(node, [])}: expected a mapping at the top level")
                continue
            try:
                RunConf.model_validate({k: v for k, v in data.items()})  # per-file check for line numbers
            except ValidationError as exc:
                problems.extend(m for m in describe_validation_error(exc, path, node) if "required" not in m)
            merged = _merge_layer(merged, data)
            read.append(path)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    merged = _merge_layer(merged, {"env": env, **(overrides or {})})
    try:
        return RunConf.model_validate(merged)
    except ValidationError as exc:
        where = ", ".join(str(p) for p in read) or f"{root}/base and {root}/{env} (no files)"
        # Never echo input values: a flag or file may hold a secret where it does not belong.
        problems = [
            f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors(include_url=False, include_input=False)
        ]
        raise ConfigError(f"invalid configuration (read {where}):\n  " + "\n  ".join(problems)) from None

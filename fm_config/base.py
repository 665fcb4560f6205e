"""What every section of the run configuration shares: strict, frozen, no secrets in it.

Each section has its module here (``redis.py``, ``sql.py``, ``reader.py``); the run
configuration (``run.py``) assembles them and ``load.py`` reads them from ``conf/``. A
secret is never a value in these files: a section names the environment variable or the
file that holds it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from feature_defs.yamlio import KeyProblem

_SECRET_KEYS = ("password", "secret", "token")


class ConfigError(ValueError):
    """Configuration that cannot be used; says which files (or which setting) were read."""


class Settings(BaseModel):
    """A configuration section: unknown keys refused, immutable, no literal secrets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_literal_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if any(s in str(key).lower() for s in _SECRET_KEYS) and not str(key).endswith(("_env", "_file")):
                    raise KeyProblem(
                        key,
                        f"'{key}': secrets are never read from config files; "
                        f"name the env var that holds it with '{key}_env' or a file with '{key}_file'",
                    )
        return data


@dataclass(frozen=True)
class SecretRef:
    """Where a password is, never the password: what write plans carry to the executors,
    each reading the secret from its own environment or mounted file when it connects. No
    password is pickled into a task, broadcast, or set in Spark conf (the UI and the event
    log show those)."""

    section: str
    env: str | None = None
    file: str | None = None

    def value(self) -> str | None:
        secret = read_secret(self.section, self.env, Path(self.file) if self.file else None)
        return secret.get_secret_value() if secret else None


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """How a store connection authenticates, carried to wherever it is made (an executor):
    never the conf's password itself, only where it is (``secret``)."""

    password: str | None = field(default=None, repr=False)
    """A literal password (programs that build a config themselves); the conf's is ``secret``."""
    secret: SecretRef | None = None
    """Where the password is (env var or mounted file), read where the connection is made."""

    def auth_password(self) -> str | None:
        """The password to connect with: the literal one, else the secret's, read here (an
        executor reads its own environment or mounted file)."""
        return self.password if self.password is not None else self.secret.value() if self.secret else None


def read_secret(section: str, env_name: str | None, file: Path | None) -> SecretStr | None:
    """The secret named by ``<section>.password_env`` or ``<section>.password_file``.

    Messages name the variable or file, never what is in it."""
    if env_name and file:
        raise ConfigError(f"{section}.password_env and {section}.password_file are both set: keep one")
    if env_name:
        value = os.environ.get(env_name)
        if value is None:
            # a name that does not look like one may be the secret itself, put there by mistake
            shown = repr(env_name) if re.fullmatch(r"[A-Z_][A-Z0-9_]{0,127}", env_name) else "a variable"
            raise ConfigError(f"{section}.password_env names {shown}, but that environment variable is not set")
        return SecretStr(value)
    if file:
        try:
            return SecretStr(file.read_text(encoding="utf-8").rstrip("\r\n"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{section}.password_file {str(file)!r} cannot be read: {getattr(exc, 'strerror', None) or type(exc).__name__}"
            ) from None
    return None

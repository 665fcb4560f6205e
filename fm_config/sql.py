"""The ``sql:`` section of the run configuration (conf/README.md documents every key),
and what a connection to that store is made from (:class:`SqlConnection`: frozen and
picklable, the writers' configs extend it; ``stores/sql.py`` makes the connections and pools)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from feature_defs.yamlio import KeyProblem
from fm_config.base import Credentials, Settings, read_secret


class SqlSettings(Settings):
    """The SQL store: CockroachDB, or PostgreSQL (its wire-compatible stand-in)."""

    dsn: str = "postgresql://root@127.0.0.1:26257/features?sslmode=disable"
    """libpq connection string or postgresql:// URL, without a password."""
    password_env: str | None = None
    """Env var holding the password; unset means none (certificates, trust)."""
    password_file: str | None = None
    """Or: a file holding the password (e.g. a mounted secret); trailing newline ignored."""
    db_schema: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")] | None = None
    """Schema of the entity tables; None means the connection's current schema."""
    dialect: Literal["auto", "postgres", "cockroach"] = "auto"
    """'auto' asks the server (SELECT version())."""
    batch_rows: int = Field(25, ge=1, le=1000)
    """Rows per upsert statement."""
    statements_per_transaction: int = Field(20, ge=1, le=1000)
    """Statements pipelined in one transaction; 1 makes each statement its own transaction."""
    statement_timeout_ms: int = Field(30_000, ge=100)
    connect_timeout: int = Field(10, ge=1)
    retries: int = Field(5, ge=0)
    """Further attempts of a transaction after a transient error (40001, 40P01, dropped connection)."""
    retry_base_delay: float = Field(0.2, ge=0)
    retry_max_delay: float = Field(5.0, ge=0)
    max_map_bytes: int = Field(512 * 1024, ge=2)
    """A features JSON object larger than this is bad input (quarantined)."""
    pre_split: int = Field(16, ge=0)
    """CockroachDB: split the table at this many key quantiles before a large write (0: never)."""
    pre_split_min_rows: int = Field(100_000, ge=0)
    """Only pre-split writes of at least this many rows."""
    split_expiration_hours: float = Field(24.0, gt=0)
    """Splits expire after this long, so CockroachDB can merge the ranges again."""

    @model_validator(mode="after")
    def _no_password_in_dsn(self) -> SqlSettings:
        from psycopg.conninfo import conninfo_to_dict

        try:
            parts = conninfo_to_dict(self.dsn)
        except Exception:
            # libpq quotes the offending token, which may be a secret: do not repeat it
            raise KeyProblem("dsn", "dsn is not a valid libpq connection string or postgresql:// URL") from None
        if any("password" in key and value for key, value in parts.items()):  # password, sslpassword
            raise KeyProblem(
                "dsn",
                "dsn contains a password: secrets are never read from config or flags; name the env var that holds it with 'password_env'",
            )
        return self

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        """The password from password_env or password_file (``resolve`` places a relative file)."""
        return read_secret("sql", self.password_env, resolve(self.password_file) if self.password_file else None)


@dataclass(frozen=True, kw_only=True)
class SqlConnection(Credentials):
    """How to reach the SQL store: what readers and writers connect with.

    The password is not carried here: ``secret`` names where it is (env var or mounted
    file), read wherever the connection is made (``auth_password()``, :class:`Credentials`)."""

    dsn: str
    """libpq connection string or postgresql:// URL, without a password."""
    schema: str | None = None
    statement_timeout_ms: int = 30_000
    connect_timeout: int = 10
    application_name: str = "feature-materializer"

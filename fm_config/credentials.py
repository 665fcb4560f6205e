"""``reader.redis`` and ``reader.sql``: the credentials the read side (the reader library,
``materialize serve``) connects with, apart from the writer's (``redis:``, ``sql:``); and
``server.push.redis`` / ``server.push.sql``: those the server's pushes write with.

Only who connects and where the password is: the server, TLS and timeouts are the store
section's. Unset, the readers connect as the store section says (the writer's user):
``materialize doctor`` warns about that (conf/README.md "Least privilege").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from fm_config.base import Settings, read_secret


class ReaderRedisCredentials(Settings):
    """``reader.redis``: the Redis ACL user reads run as (conf/base/redis-acl.txt: fm_reader)."""

    username: str | None = None
    """ACL user; None: the default user (with this password)."""
    password_env: str | None = None
    """Env var holding that user's password."""
    password_file: str | None = None
    """Or: a file holding it (a mounted secret); trailing newline ignored."""

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        return read_secret("reader.redis", self.password_env, resolve(self.password_file) if self.password_file else None)


class ReaderSqlCredentials(Settings):
    """``reader.sql``: the SQL role reads run as (conf/base/sql-grants.sql: fm_reader), on
    the database ``sql.dsn`` names."""

    user: str | None = None
    """Role name, in place of sql.dsn's user; None: sql.dsn's user (with this password)."""
    password_env: str | None = None
    password_file: str | None = None

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        return read_secret("reader.sql", self.password_env, resolve(self.password_file) if self.password_file else None)


class PushRedisCredentials(ReaderRedisCredentials):
    """``server.push.redis``: the Redis ACL user pushes write as (a writer, like the run's)."""

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        return read_secret("server.push.redis", self.password_env, resolve(self.password_file) if self.password_file else None)


class PushSqlCredentials(ReaderSqlCredentials):
    """``server.push.sql``: the SQL role pushes write as (INSERT and UPDATE on the entity tables)."""

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        return read_secret("server.push.sql", self.password_env, resolve(self.password_file) if self.password_file else None)

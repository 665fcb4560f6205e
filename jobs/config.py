"""Run configuration: ``conf/base/*.yaml`` overlaid by ``conf/<env>/*.yaml``.

The env comes from ``--env``, else ``FM_ENV``, else ``local``. Secrets never live in
these files: a config names the environment variable that holds one (``password_env``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from feature_defs.yamlio import KeyProblem, YamlFileError, describe_validation_error, line_of, load_yaml



def _project_root() -> Path:
    """The checkout: FM_PROJECT_ROOT, else this file's, else (imported from the --py-files
    zip, as a spark-submit driver does) the working directory."""
    if os.environ.get("FM_PROJECT_ROOT"):
        return Path(os.environ["FM_PROJECT_ROOT"]).resolve()
    here = Path(__file__).resolve().parent
    return here.parent if here.is_dir() else Path.cwd().resolve()


PROJECT_ROOT = _project_root()
ENV_VAR = "FM_ENV"
CONF_DIR_VAR = "FM_CONF_DIR"
DEFAULT_ENV = "local"
_SECRET_KEYS = ("password", "secret", "token")


class ConfigError(ValueError):
    """Configuration that cannot be used; says which files were read."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_literal_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if any(s in str(key).lower() for s in _SECRET_KEYS) and not str(key).endswith(("_env", "_file")):
                    raise KeyProblem(
                        key, f"'{key}': secrets are never read from config files; name the env var that holds it with '{key}_env' or a file with '{key}_file'"
                    )
        return data


Fraction = Annotated[float, Field(gt=0, le=1)]


class SparkConf(_Strict):
    master: str = "local[2]"
    """Used when the job is not started by spark-submit (which sets its own master)."""
    app_name: str = "feature-materializer"
    shuffle_partitions: int = Field(4, ge=1)
    arrow_batch_rows: int = Field(5000, ge=1)
    """Rows per Arrow batch handed to the writers: bounds executor memory per task."""
    max_partition_bytes: Annotated[str, Field(pattern=r"^[0-9]+[kmg]?$")] = "16m"
    """Input split size (spark.sql.files.maxPartitionBytes): bounds the rows of each read
    task and of the snapshot's cached blocks, whatever the size of the ETL table's files."""
    rows_per_partition: int = Field(50_000, ge=1000)
    """The de-duplication spreads a snapshot over one partition per this many rows read (at
    least shuffle_partitions), so a task's memory does not grow with the snapshot."""
    extra: dict[str, str] = {}
    """Any further spark.* settings."""


class RedisConf(_Strict):
    url: str = "redis://127.0.0.1:6379/0"
    password_env: str | None = None
    """Env var holding the Redis password (AUTH); unset means no password."""
    password_file: str | None = None
    """Or: a file holding the password (e.g. a mounted secret); trailing newline ignored."""

    @model_validator(mode="after")
    def _no_password_in_url(self) -> RedisConf:
        from urllib.parse import parse_qs, urlsplit

        try:
            parts = urlsplit(self.url)
            secret = parts.password
        except ValueError:
            raise KeyProblem("url", "url is not a valid redis:// or rediss:// URL") from None
        # redis-py also takes credentials from query arguments (?password=...)
        if secret or {"password", "username", "credential_provider"} & set(parse_qs(parts.query)):
            raise KeyProblem("url", "url contains a password: secrets are never read from config or flags; name the env var that holds it with 'password_env'")
        return self
    username: str | None = None
    mode: Literal["auto", "standalone", "cluster"] = "auto"
    """cluster: the url is a seed node of a Redis Cluster; auto: ask the server (INFO cluster)."""
    wait_replicas: int = Field(0, ge=0)
    """After each chunk, WAIT for this many replicas (at most those attached): a primary that
    dies mid-write loses nothing it acknowledged. 0: asynchronous replication, fastest."""
    wait_timeout_ms: int = Field(5000, ge=1)
    failover_timeout: float = Field(60.0, gt=0)
    """Cluster: seconds to wait for a replica to take over a lost primary's slots (Redis's
    cluster-node-timeout, 15 s by default, plus the election)."""
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")] | None = None
    """Optional deployment namespace put in front of every key."""
    pipeline_entities: int = Field(500, ge=1)
    """Entities per pipeline round trip (each is HSET + HDEL? + EXPIRE)."""
    max_fill: Fraction = 0.85
    """Refuse a write whose projection passes this fraction of capacity."""
    hard_fill: Fraction = 0.95
    """Stop a running write when used memory passes this fraction of capacity."""
    capacity_bytes: int | None = Field(None, gt=0)
    """Capacity when the server has no maxmemory; required then."""
    hash_max_listpack_entries: int | None = Field(None, ge=1)
    hash_max_listpack_value: int | None = Field(None, ge=1)
    """The server's hash-max-listpack-* for the capacity check when CONFIG GET is refused
    (a least-privilege user); unset: Redis's defaults 512 / 64 are assumed."""
    recheck_every: int = Field(20, ge=1)
    """Re-read used memory (and evicted_keys) every N pipeline chunks during the write."""
    eviction: Literal["refuse", "warn"] = "refuse"
    """When the server's maxmemory-policy may evict this run's keys (allkeys-*, or volatile-*
    for an entity type with a TTL): refuse to write, or write with a warning. Either way a
    run during which such a server evicted keys fails."""
    sample_entities: int = Field(1000, ge=10)
    """Entities encoded on the driver to project the write's memory growth."""
    ttl_jitter: float = Field(0.1, ge=0, le=1)
    socket_timeout: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=0)
    """Retries of a chunk after a dropped connection (writes are idempotent)."""
    cleanup_keys_per_second: float | None = Field(50_000, gt=0)
    """`materialize cleanup`: keys visited per second per Spark task at most (None: no limit)."""
    tls_ca_file: str | None = None
    """rediss:// only: PEM bundle of the CA(s) the server's certificate is verified with
    (hostname included), on top of the system trust store; unset: the system trust store."""
    tls_cert_file: str | None = None
    """rediss:// only: client certificate (PEM), for servers that ask for one."""
    tls_key_file: str | None = None
    """Unencrypted PEM key of tls_cert_file, when the key is not in that file."""


class SqlConf(_Strict):
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
    def _no_password_in_dsn(self) -> SqlConf:
        from psycopg.conninfo import conninfo_to_dict

        try:
            parts = conninfo_to_dict(self.dsn)
        except Exception:
            # libpq quotes the offending token, which may be a secret: do not repeat it
            raise KeyProblem("dsn", "dsn is not a valid libpq connection string or postgresql:// URL") from None
        if any("password" in key and value for key, value in parts.items()):  # password, sslpassword
            raise KeyProblem("dsn", "dsn contains a password: secrets are never read from config or flags; name the env var that holds it with 'password_env'")
        return self


class QualityConf(_Strict):
    max_bad_fraction: float = Field(0.01, ge=0, le=1)
    """Fail the run when more than this fraction of rows read is bad input."""
    expectations: bool = True
    """Run the great-expectations gate before writing (validate always runs it)."""
    max_null_fraction: float = Field(0.25, ge=0, le=1)
    """Default per-feature limit of entities without a value (a feature may set its own)."""
    row_count_band: float | None = Field(0.5, ge=0)
    """Entities may differ from the previous successful run by at most this fraction; None: no check."""
    verify_sample: int = Field(1000, ge=0)
    """Entities read back from each store after the write and compared with the source (0: off)."""
    data_docs: bool = True
    """Write the great-expectations HTML data docs next to each run's summary."""


class RunConf(_Strict):
    env: str = DEFAULT_ENV
    data_root: str = "data"
    """Where source Delta tables live (relative paths are under the project root)."""
    quarantine_root: str | None = None
    """Delta tables of bad rows; defaults to <data_root>/_quarantine."""
    ledger_root: str | None = None
    """The run ledger (a Delta table); defaults to <data_root>/_ledger."""
    reports_dir: str = "reports"
    definitions_dir: str | None = None
    """Feature definitions folder; defaults to the project's feature_defs/."""
    sinks: Annotated[list[Literal["redis", "cockroach"]], Field(min_length=1)] = ["redis", "cockroach"]
    """The stores a run writes when no --sink is given (same as --sink all)."""
    spark: SparkConf = SparkConf()
    redis: RedisConf = RedisConf()
    sql: SqlConf = SqlConf()
    quality: QualityConf = QualityConf()
    sources: list[str] | None = None
    """Sources a run materializes when none is named; None means all defined."""

    def path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() or "://" in value else PROJECT_ROOT / p

    @property
    def data_path(self) -> Path:
        return self.path(self.data_root)

    @property
    def quarantine_path(self) -> Path:
        return self.path(self.quarantine_root) if self.quarantine_root else self.data_path / "_quarantine"

    @property
    def ledger_path(self) -> Path:
        return self.path(self.ledger_root) if self.ledger_root else self.data_path / "_ledger"

    @property
    def reports_path(self) -> Path:
        return self.path(self.reports_dir)

    def redis_password(self) -> SecretStr | None:
        return _secret("redis", self.redis.password_env, self.path(self.redis.password_file))

    def sql_password(self) -> SecretStr | None:
        return _secret("sql", self.sql.password_env, self.path(self.sql.password_file))


def _secret(section: str, env_name: str | None, file: Path | None) -> SecretStr | None:
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
            raise ConfigError(f"{section}.password_file {str(file)!r} cannot be read: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None
    return None


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
    for section in ("redis", "sql"):
        part = layer.get(section)
        named = ways & set(part) if isinstance(part, dict) else set()
        if len(named) == 1 and isinstance(out.get(section), dict):
            out[section] = {**out[section], (ways - named).pop(): None}
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
        problems = [f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors(include_url=False, include_input=False)]
        raise ConfigError(f"invalid configuration (read {where}):\n  " + "\n  ".join(problems)) from None

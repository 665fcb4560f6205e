"""The SQL store: reachable, the dialect configured, TLS verified off loopback, and each entity
table there (or creatable by this role) with its columns and privileges. The session is
read-only."""

from __future__ import annotations

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine
from sinks.sql.config import sql_sink_config


def check_sql(conf: RunConf, defs: Definitions, sources: list[str]) -> list[DoctorLine]:
    """Connect (read-only), then the dialect, TLS and each entity type's table."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from sinks.sql.preflight import detect_dialect
    from stores.sql import connect

    settings = conf.sql
    info = conninfo_to_dict(settings.dsn)
    where = f"{info.get('user', '?')}@{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '?')}"
    try:
        conn = connect(sql_sink_config(conf))
    except psycopg.Error as exc:
        return [
            DoctorLine(
                "fail",
                "sql",
                f"{where}: cannot connect ({str(exc).strip().splitlines()[0]})",
                "fix sql.dsn, the password in sql.password_env/_file, or start the server",
            )
        ]
    with conn:
        conn.execute("SET default_transaction_read_only = on")  # nothing this session does can write
        found = detect_dialect(conn)
        findings = [DoctorLine("ok", "sql", f"{where}: {found}"), *_dialect_and_tls(settings, info, found)]
        seen: set[str] = set()
        for name in sources:
            source = defs.source(name)
            entity = defs.entity_of(source)
            if entity.name not in seen:
                seen.add(entity.name)
                findings.append(_table(conf, conn, sql_sink_config(conf, source, entity, None, found)))
    return findings


def _dialect_and_tls(settings, info: dict, found: str) -> list[DoctorLine]:
    from sinks.sql.preflight import is_loopback

    findings = []
    if settings.dialect not in ("auto", found):
        findings.append(
            DoctorLine("fail", "sql dialect", f"sql.dialect is {settings.dialect} but the server is {found}", "set sql.dialect: auto")
        )
    if info.get("sslmode", "prefer") != "verify-full" and not is_loopback(settings.dsn):
        findings.append(
            DoctorLine(
                "warn",
                "sql tls",
                f"sslmode is {info.get('sslmode', 'prefer')}: the server's certificate is not verified",
                "add sslmode=verify-full (and sslrootcert) to sql.dsn",
            )
        )
    return findings


def _table(conf: RunConf, conn, config) -> DoctorLine:
    """An entity type's table: there (or creatable by this role), with the columns and privileges a run needs."""
    from sinks.sql.preflight import SCHEMA_STEP, missing_privileges, table_columns
    from sinks.sql.statements import COLUMNS

    label = f"sql table {config.table}"
    columns = table_columns(conn, config)
    if not columns and _may_create(conn, config):
        return DoctorLine("ok", label, f"{config.table_name}: not there yet; this role may create it (the first run does)")
    if not columns:
        return DoctorLine(
            "fail",
            label,
            f"{config.table_name} is missing (or this role holds no privilege on it)",
            f"run `{SCHEMA_STEP.replace('<env>', conf.env)}` under a role that may create tables; grant conf/base/sql-grants.sql",
        )
    missing = [c for c in COLUMNS if c not in columns]
    lacking = missing_privileges(conn, config)
    if not missing and not lacking:
        return DoctorLine("ok", label, f"{config.table_name}: columns and SELECT, INSERT, UPDATE in place")
    text = "; ".join(filter(None, [missing and f"no column(s) {', '.join(missing)}", lacking and f"this role lacks {', '.join(lacking)}"]))
    fix = "see serializers/FORMAT.md 'SQL layout' and conf/base/sql-grants.sql"
    if missing == ["expires_at"]:  # a table made before the entity TTL reached SQL rows
        fix = f"run `{SCHEMA_STEP.replace('<env>', conf.env)}` under the table owner (or one run as it); {fix}"
    return DoctorLine("fail", label, f"{config.table_name}: {text}", fix)


def _may_create(conn, config) -> bool:
    row = conn.execute("SELECT has_schema_privilege(COALESCE(%s, current_schema()), 'CREATE')", (config.schema,)).fetchone()
    return bool(row and row[0])

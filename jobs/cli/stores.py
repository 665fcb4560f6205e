"""The stores' upkeep: ``cleanup`` (stale fields, expired rows) and ``schema`` (the SQL tables)."""

from __future__ import annotations

import sys

from jobs.cli.common import common_flags, load
from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
)


def add_cleanup(sub) -> None:
    clean = sub.add_parser(
        "cleanup",
        help="delete what no definition reads any more, and expired SQL rows",
        description="Clean one entity type in the configured stores. Redis: delete the fields of features that the ledger "
        "shows were written but that are no longer defined (and the freshness fields of removed sources); keys come from "
        "the tables and dates the ledger recorded for the steps that wrote them, not from a SCAN; a source whose keys "
        "cannot be found is reported, recorded as left and exits 1. SQL: walk the entity table in pages and delete rows "
        "past their expiry (the entity TTL) and rows of removed sources, and remove the JSON keys of removed features; "
        "run it as a role that may DELETE (fm_cleanup in conf/base/sql-grants.sql), e.g. --sql-dsn "
        "postgresql://fm_cleanup@db:26257/features --sql-password-env FM_SQL_CLEANUP_PASSWORD.",
    )
    common_flags(clean)
    clean.add_argument("--entity", required=True, help="entity type, e.g. consumer")
    clean.add_argument("--dry-run", action="store_true", help="print what would be deleted (the SQL table is read through); delete nothing")
    clean.add_argument(
        "--sink", choices=["redis", "sql", "cockroach", "all"], default="all", help="store(s) to clean (default: the configured sinks)"
    )
    clean.add_argument("--redis-url", help="Redis URL overriding the config")
    clean.add_argument("--sql-dsn", help="connection string of a role that may DELETE, overriding sql.dsn (no password in it)")
    clean.add_argument("--sql-password-env", help="env var holding that role's password, overriding sql.password_env")


def add_schema(sub) -> None:
    schema = sub.add_parser(
        "schema",
        help="create (or check) the SQL store's entity tables, as a role that may create tables",
        description="The schema step: create each entity table the sources write when it is missing, bring a table made "
        "before the expires_at column up to the layout (and, on CockroachDB, set its row-level TTL), and check the "
        "columns of those that exist. The nightly run needs no right to create tables; run this under the owner role "
        "(conf/README.md 'Least privilege'), e.g. --sql-dsn postgresql://fm_schema@db:26257/features "
        "--sql-password-env FM_SQL_SCHEMA_PASSWORD.",
    )
    common_flags(schema)
    schema.add_argument(
        "--source", action="append", help="source whose entity table to create; repeat for several (default: all configured)"
    )
    schema.add_argument("--sql-dsn", help="connection string of the role that may create tables, overriding sql.dsn (no password in it)")
    schema.add_argument("--sql-password-env", help="env var holding that role's password, overriding sql.password_env")


def cmd_cleanup(args) -> int:
    from jobs.operations.cleanup.redis import CleanupPlan, plan_cleanup, recorded_cleanup
    from jobs.operations.cleanup.sql import clean_sql, plan_sql_cleanup
    from jobs.operations.ledger.events import Ledger
    from jobs.spark import build_spark

    conf, defs = load(args)
    spark = build_spark(conf.spark, conf.locations(defs))
    ledger = Ledger.of(spark, conf)
    if "redis" in conf.sinks:
        plan, keys = plan_cleanup(spark, conf, defs, ledger, args.entity, args.redis_url)
    else:
        plan, keys = CleanupPlan(entity=defs.entity(args.entity).name), {}
    sql_plan = plan_sql_cleanup(conf, defs, args.entity) if "sql" in conf.sinks else None
    try:
        if plan.target:
            print(plan.describe(), flush=True)
            if not plan.parts:
                print("nothing to delete in Redis")
        if sql_plan is not None:
            print(sql_plan.describe(), flush=True)
        if args.dry_run:
            if sql_plan is not None:
                counted = clean_sql(conf, sql_plan, dry_run=True)
                print("\n".join(counted.describe()))
                if counted.error is not None:
                    print(f"error: SQL table {counted.table}: {' '.join(str(counted.error).split())}", file=sys.stderr)
                    return EXIT_FAILED
            print("dry run: nothing deleted")
            return EXIT_OK
        if not plan.parts and sql_plan is None:
            return EXIT_OK
        result = recorded_cleanup(conf, defs, ledger, plan, keys, args.redis_url, sql_plan)
    finally:
        for frame in keys.values():
            frame.unpersist()
    for source, done in {**result.cleaned, **result.left}.items():
        print(f"{source}: removed {done['fields_removed']:,} fields ({', '.join(done['fields'])}) from {done['keys']:,} keys")
    if result.memory_before is not None:
        print(f"removed {result.fields_removed:,} fields from {result.keys:,} keys in {result.seconds:.1f}s; "
              f"Redis memory {result.memory_before:,} -> {result.memory_after:,} B "
              f"(freed {max(0, result.memory_before - result.memory_after):,} B)")  # fmt: skip
    if result.sql is not None:
        print("\n".join(result.sql.describe()))
    for source, done in sorted(result.left.items()):
        print(
            f"error: not cleaned: {source} ({', '.join(done['fields'])}): {done['reason']}; recorded as left for a later cleanup",
            file=sys.stderr,
        )
    failed_sql = result.sql is not None and result.sql.error is not None
    if failed_sql:
        print(
            f"error: SQL table {result.sql.table}: {' '.join(str(result.sql.error).split())}; what was done is recorded, "
            "run the cleanup again to go on",
            file=sys.stderr,
        )
    return EXIT_FAILED if result.left or failed_sql else EXIT_OK


def cmd_schema(args) -> int:
    import psycopg

    from jobs.operations.schema import ensure_tables
    from stores.errors import MaterializerError

    conf, defs = load(args)
    names = args.source or conf.sources or list(defs.sources)
    try:
        done = ensure_tables(conf, defs, names)
    except MaterializerError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)  # libpq puts its hints on lines of their own
        return EXIT_FAILED
    except psycopg.Error as exc:  # after connecting: the server went away, a timeout, a lock
        print(
            f"error: schema step on the SQL store ({conf.sql.dsn}) failed: [{exc.sqlstate or 'no SQLSTATE'}] {' '.join(str(exc).split())}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    for table, state in done.items():
        print(f"{table}: {state}" + ("" if state == "created" else " (columns checked)"))
    return EXIT_OK

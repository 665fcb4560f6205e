"""``materialize doctor``: is this deployment ready to run? Read-only checks of the Spark
master, each source table, the ledger/quarantine/report locations, Redis and SQL.

Nothing is written anywhere: Redis ACLs are probed by queueing the writer's commands in a
``MULTI`` that is discarded (Redis checks permissions when a command is queued), and the SQL
session is read-only. A Delta source's schema is read from its Delta log, without Spark; a
Parquet or catalog-table source is opened as a run opens it (one Spark session, started for
the first of them, reads its schema and no rows). Each check is one line with what to fix
when it is not OK.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from feature_defs import Definitions, SourceDef
from fm_config import RunConf
from fm_config.locations import Location
from jobs.extras import TITLES, install_hint, missing_extra
from jobs.operations.check import Check, Status
from jobs.operations.doctor_rights import writer_denied
from sinks.redis.config import redis_sink_config
from sinks.sql.config import sql_sink_config


def run_checks(conf: RunConf, defs: Definitions, sources: list[str], sinks: list[str]) -> Iterator[Check]:
    """Every check, in the order a run needs them (each one's own errors become its FAIL),
    then the read side's (doctor_reads.py)."""
    from jobs.operations.doctor_descriptions import check_descriptions
    from jobs.operations.doctor_push import push_steps
    from jobs.operations.doctor_reads import check_redis_transport, read_side_steps
    from jobs.operations.doctor_stores import check_stored_data

    steps: list[tuple[str, Callable[[], list[Check]]]] = [("spark", lambda: check_spark(conf))]
    steps += [(f"source {name}", lambda name=name: [check_source(conf, defs, defs.source(name))]) for name in sources]
    steps += [(label, lambda label=label, where=where: [check_location(conf, label, where)]) for label, where in _locations(conf)]
    steps.append(("ledger log store", lambda: check_log_store(conf)))
    if "redis" in sinks:
        steps.append(("redis transport", lambda: check_redis_transport(conf)))
        steps.append(("redis", lambda: check_redis(conf, defs, sources)))
    if "cockroach" in sinks:
        steps.append(("sql", lambda: check_sql(conf, defs, sources)))
    steps.append(("stored data", lambda: check_stored_data(conf, defs, sources, sinks)))  # against the ledger
    # steps that yielded a FAIL: a Redis URL whose scheme its port does not speak is not asked
    # again (each read would wait for its timeout)
    failed: set[str] = set()
    reached = {"redis": ("redis transport",), "cockroach": ()}
    steps.append(
        (
            "descriptions",  # against the lock and the definitions
            lambda: check_descriptions(conf, defs, [s for s in sinks if not failed.intersection(reached[s])]),
        )
    )
    steps += read_side_steps(conf, defs, sources, sinks)
    steps.append(("server", lambda: check_server(conf)))
    steps += push_steps(conf, defs, sinks)
    for name, step in steps:
        try:
            for check in step():
                if check.status == "fail":
                    failed.add(name)
                yield check
        except Exception as exc:  # noqa: BLE001 (a check that could not finish is a finding, not a crash)
            if missing := missing_extra(exc):  # e.g. doctor run where only the reader is installed
                yield Check(
                    "fail",
                    name,
                    f"could not check: {missing[0]} is not installed",
                    f"{install_hint(missing[1])} (the {TITLES[missing[1]]} extra)",
                )
                continue
            failed.add(name)
            yield Check("fail", name, f"could not check: {type(exc).__name__}: {str(exc).strip() or 'no message'}")


# -- Spark ------------------------------------------------------------------------------


def check_spark(conf: RunConf) -> list[Check]:
    master = conf.spark.master
    if master.startswith("local"):
        return [_java(), _delta_jars()]
    if master.startswith("spark://"):
        hosts = master[len("spark://") :].split(",")
        down = [h for h in hosts if not _reachable(h, 7077)]
        if len(down) == len(hosts):
            return [
                Check(
                    "fail",
                    "spark master",
                    f"{master}: no master answers on {', '.join(hosts)}",
                    "start the standalone master or fix spark.master",
                )
            ]
        return [Check("ok", "spark master", f"{master}: reachable" + (f" ({', '.join(down)} down)" if down else ""))]
    if master.startswith("k8s://"):
        api = urlsplit(master[len("k8s://") :] if "://" in master[len("k8s://") :] else "https://" + master[len("k8s://") :])
        ok = _reachable(api.netloc, 443)
        return [
            Check(
                "ok" if ok else "fail",
                "spark master",
                f"{master}: Kubernetes API {'reachable' if ok else 'unreachable'}",
                "check the API server address and this host's network",
            )
        ]
    if master == "yarn":
        folder = os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")
        if folder and (Path(folder) / "yarn-site.xml").is_file():
            return [Check("ok", "spark master", f"yarn: {Path(folder) / 'yarn-site.xml'}")]
        return [
            Check(
                "fail",
                "spark master",
                "yarn: no yarn-site.xml in $HADOOP_CONF_DIR or $YARN_CONF_DIR",
                "export HADOOP_CONF_DIR to the cluster's client configuration",
            )
        ]
    return [Check("warn", "spark master", f"{master}: not a master this check knows (local, spark://, k8s://, yarn)")]


def _java() -> Check:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        return Check("fail", "java", "no java on PATH and no $JAVA_HOME", "install Java 17 or 21 (make setup does)")
    text = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=30).stderr
    found = re.search(r'version "(\d+)', text)
    major = int(found.group(1)) if found else 0
    if major < 17:
        return Check(
            "fail", "java", f"{java}: Java {major or '?'}; Spark 4 needs 17 or later", "install Java 17 or 21 and point JAVA_HOME at it"
        )
    return Check("ok", "java", f"{java}: Java {major}")


def _delta_jars() -> Check:
    from jobs.jars import delta_jars

    try:
        jars = delta_jars()
    except FileNotFoundError as exc:
        return Check("fail", "delta jars", str(exc).split(";")[0], "run `make setup` (scripts/setup.sh)")
    return Check("ok", "delta jars", ", ".join(j.name for j in jars))


def _reachable(address: str, default_port: int) -> bool:
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    try:
        socket.create_connection((host or address, int(port or default_port)), timeout=5).close()
        return True
    except (OSError, ValueError):
        return False


# -- Sources and locations ---------------------------------------------------------------


def check_source(conf: RunConf, defs: Definitions, source: SourceDef) -> Check:
    from pyspark.sql.types import StructType

    from jobs.pipeline.read import source_path
    from jobs.transforms import schema_problems

    if source.table is not None or source.format != "delta":
        return check_opened_source(conf, defs, source)
    where = source_path(conf, source)
    name = f"source {source.name}"
    try:
        log = _delta_log(conf, where)
    except OSError as exc:
        return Check("fail", name, f"{where}: cannot read: {exc}", "check the location and this host's credentials for it")
    if not log:
        fix = "run `materialize sample-data`" if where.is_local else "check the source's location (feature_defs) and data_root"
        return Check("fail", name, f"no Delta table at {where}", fix)
    version, schema = log
    if schema is None:
        return Check("warn", name, f"{where}: Delta table (version {version}); its schema could not be read from the log")
    problems = schema_problems(StructType.fromJson(schema), source, defs.entity_of(source))
    if problems:
        return Check("fail", name, f"{where}: " + "; ".join(problems), "fix the table or the source's definition in feature_defs")
    return Check("ok", name, f"{where}: Delta table, version {version}, columns match the definition")


def check_opened_source(conf: RunConf, defs: Definitions, source: SourceDef) -> Check:
    """A Parquet or catalog-table source, opened as a run opens it (jobs/pipeline/source_table.py):
    its schema is what Spark sees, partition columns included."""
    from fm_config.catalog import CATALOG_HELP
    from jobs.pipeline.source_table import open_table, table_ref
    from jobs.source_errors import CatalogUnavailable, SourceNotFound, SourceUnreadable
    from jobs.spark import build_spark
    from jobs.transforms import schema_problems

    name, ref = f"source {source.name}", table_ref(conf, source)
    if source.table is not None and not conf.spark.catalog.configured:
        return Check("fail", name, f"{ref}: no catalog is configured", CATALOG_HELP)
    spark = build_spark(conf.spark, conf.locations(defs))  # the one session of this process, started once
    try:
        table = open_table(spark, conf, ref)
    except SourceNotFound as exc:
        fix = (
            f"check the catalog ({conf.spark.catalog.describe()}) and the source's table"
            if source.table
            else "check the source's location and format (feature_defs) and data_root"
        )
        return Check("fail", name, str(exc), fix)
    except (SourceUnreadable, CatalogUnavailable) as exc:
        return Check(
            "fail",
            name,
            str(exc),
            "check the catalog's metastore and this host's access to it" if source.table else "check the files at the location",
        )
    problems = schema_problems(table.schema, source, defs.entity_of(source))
    if problems:
        return Check("fail", name, f"{ref}: " + "; ".join(problems), "fix the table or the source's definition in feature_defs")
    what = "catalog table" if source.table else "Parquet"
    return Check("ok", name, f"{ref}: {what}, columns match the definition")


_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")


def _delta_log(conf: RunConf, where: Location) -> tuple[int, dict | None] | None:
    """(latest version, schema as JSON) of the Delta table at ``where``; None: no table there.
    The schema is the newest ``metaData`` action: in a commit, else in the last checkpoint."""
    files = conf.files
    names = files.file_names(where / "_delta_log")
    commits = sorted((int(m.group(1)) for n in names if (m := _COMMIT.match(n))), reverse=True)
    checkpoints = sorted((int(m.group(1)) for n in names if (m := _CHECKPOINT.match(n))), reverse=True)
    if not commits and not checkpoints:
        return None
    latest = max(commits[:1] + checkpoints[:1])
    floor = checkpoints[0] if checkpoints else -1
    for version in commits:
        if version <= floor:
            break
        for line in files.read_bytes(where / "_delta_log" / f"{version:020d}.json").splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                return latest, json.loads(action["metaData"]["schemaString"])
    if checkpoints:
        import io

        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(files.read_bytes(where / "_delta_log" / f"{floor:020d}.checkpoint.parquet")), columns=["metaData"])
        for row in table.column("metaData").to_pylist():
            if row and row.get("schemaString"):
                return latest, json.loads(row["schemaString"])
    return latest, None


def _locations(conf: RunConf) -> list[tuple[str, Location]]:
    ledger = conf.ledger_path
    return [
        ("ledger", ledger),
        ("leases", Location(str(ledger).rstrip("/") + "_leases")),
        ("quarantine", conf.quarantine_path),
        ("reports", conf.reports_path),
    ]


def check_location(conf: RunConf, label: str, where: Location) -> Check:
    """A location the run writes: there already, or creatable (local: the nearest existing
    folder is writable; remote: its parent can be listed, so the credentials reach it)."""
    table = label in ("ledger", "leases")
    if where.is_local:
        path = Path(where.local_path())
        if table and (path / "_delta_log").is_dir() or not table and path.is_dir():
            ok = os.access(path, os.W_OK)
            return Check(
                "ok" if ok else "fail",
                label,
                f"{where}: exists, {'writable' if ok else 'not writable by this user'}",
                f"let this user write {path}",
            )
        parent = next(p for p in [path, *path.parents] if p.exists())
        ok = parent.is_dir() and os.access(parent, os.W_OK)
        what = (
            f"{where}: not there yet, created by the first run" if ok else f"{where}: cannot be created ({parent} is not a writable folder)"
        )
        return Check("ok" if ok else "fail", label, what, f"let this user write {parent}, or set the location elsewhere (conf/README.md)")
    try:
        if table:
            found = bool(conf.files.file_names(where / "_delta_log"))
        else:
            found = bool(conf.files.folders(where) or conf.files.file_names(where))
        if not found:
            conf.files.folders(where.parent)  # reaching the parent proves the credentials work
    except OSError as exc:
        return Check("fail", label, f"{where}: cannot reach: {exc}", "check the URI, storage.* and this host's credentials for it")
    kind = "Delta table" if table else "folder"
    return Check("ok", label, f"{where}: {kind} found" if found else f"{where}: reachable, created by the first run (writes are not tried)")


def check_log_store(conf: RunConf) -> list[Check]:
    """A ledger on S3 takes commits from every driver that runs here (nightly runs, backfills):
    Delta's default S3 log store is safe for one driver at a time only."""
    ledger = str(conf.ledger_path)
    scheme = ledger.split("://", 1)[0] if "://" in ledger else ""
    if scheme not in ("s3a", "s3", "s3n"):
        return []
    store = conf.spark.extra.get(f"spark.delta.logStore.{scheme}.impl", "")
    if "DynamoDB" in store:
        return [Check("ok", "ledger log store", f"{store}: concurrent commits from several drivers are safe")]
    return [Check(
        "warn", "ledger log store",
        f"the ledger is on S3 ({ledger}) with Delta's single-driver log store: "
        "a backfill and a nightly run on two drivers may overwrite each other's commit",
        f"set spark.extra spark.delta.logStore.{scheme}.impl: io.delta.storage.S3DynamoDBLogStore "
        "(conf/README.md 'Concurrent writers on S3'), or put ledger_root on abfss://, gs:// or hdfs://",
    )]  # fmt: skip


# -- Redis --------------------------------------------------------------------------------


def check_redis(conf: RunConf, defs: Definitions, sources: list[str]) -> list[Check]:
    import redis

    from serializers.keys import key_prefix
    from sinks.errors import CapacityError
    from sinks.redis.capacity import read_memory_info
    from sinks.redis.router import ClusterTopology, is_cluster
    from stores.redis import connect, server_address

    settings = conf.redis
    config = redis_sink_config(conf)  # a missing password fails here, naming where it was looked for
    where = server_address(config.url)
    client = connect(config, socket_timeout=5.0)
    nodes: list[tuple[str, object]] = []
    try:
        try:
            version = client.info("server").get("redis_version", "?")
        except redis.AuthenticationError as exc:
            return [
                Check(
                    "fail",
                    "redis",
                    f"{where}: authentication refused ({exc})",
                    "check redis.username and the password in redis.password_env/_file",
                )
            ]
        except redis.ConnectionError as exc:
            return [
                Check("fail", "redis", f"{where}: cannot connect ({exc})", "start Redis or fix redis.url (and TLS files for rediss://)")
            ]
        cluster = is_cluster(client)
        checks = [Check("ok", "redis", f"{where}: Redis {version}, {'cluster' if cluster else 'standalone'}")]
        if settings.mode != "auto" and (settings.mode == "cluster") != cluster:
            checks.append(
                Check(
                    "fail",
                    "redis mode",
                    f"redis.mode is {settings.mode} but the server is {'a cluster node' if cluster else 'standalone'}",
                    "set redis.mode: auto",
                )
            )
        nodes = [(where, client)]
        if cluster:
            topology = ClusterTopology.discover(config)
            unserved = topology.unserved()
            checks.append(
                Check(
                    "fail",
                    "redis cluster",
                    f"{unserved} of 16384 slots have no primary",
                    "bring the cluster back to cluster_state:ok (a replica takes over, or CLUSTER ADDSLOTS)",
                )
                if unserved
                else Check("ok", "redis cluster", f"{len(topology.primaries)} primaries serve every slot")
            )
            nodes = [(a, connect(config, a, socket_timeout=5.0)) for a in sorted(topology.primaries)]
        entities = {defs.entity_of(defs.source(s)).name: defs.entity_of(defs.source(s)) for s in sources}
        ttl = any(e.ttl_seconds for e in entities.values())
        seen = None
        for address, node in nodes:
            label = f"redis memory {address}" if cluster else "redis memory"
            try:
                memory = read_memory_info(node, settings.hash_max_listpack_entries, settings.hash_max_listpack_value)
                capacity = memory.capacity(settings.capacity_bytes)
            except CapacityError as exc:
                checks.append(Check("fail", label, str(exc).split(":")[0], "set maxmemory on the server, or redis.capacity_bytes"))
                continue
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                checks.append(
                    Check(
                        "fail",
                        label,
                        f"does not answer ({exc})",
                        "bring the node back, or let a replica take over its slots (a run writes the other primaries)",
                    )
                )
                continue
            except redis.RedisError as exc:
                checks.append(Check("fail", label, f"cannot read INFO: {exc}", "grant this user INFO (conf/README.md 'Least privilege')"))
                continue
            fill = memory.used / capacity
            status: Status = "fail" if fill >= settings.max_fill else "ok"
            checks.append(
                Check(
                    status,
                    label,
                    f"{memory.used:,} of {capacity:,} B used ({fill:.0%}; a write may fill up to redis.max_fill {settings.max_fill:.0%})",
                    "free memory or raise maxmemory before the run",
                )
            )
            if memory.evicts(ttl):
                refuse = settings.eviction == "refuse"
                checks.append(
                    Check(
                        "fail" if refuse else "warn",
                        f"redis eviction {address}" if cluster else "redis eviction",
                        f"maxmemory-policy {memory.policy} may evict this run's keys" + (": a run refuses to write" if refuse else ""),
                        "set maxmemory-policy noeviction (or volatile-* with entity types without a TTL)",
                    )
                )
            if seen is None:  # listpack settings: one check, from the first primary that answered
                seen = memory
            if not cluster:
                break
        if (
            seen is not None
            and seen.listpack_note
            and settings.hash_max_listpack_entries is None
            and settings.hash_max_listpack_value is None
        ):
            checks.append(
                Check(
                    "warn",
                    "redis listpack",
                    seen.listpack_note.split(";")[0] + f"; assumed entries {seen.listpack_entries}, value {seen.listpack_value}",
                    "set redis.hash_max_listpack_entries/_value to the server's values",
                )
            )
        elif seen is not None:
            checks.extend(_listpack(defs, sources, seen.listpack_entries, seen.listpack_value))
        for entity in entities.values():  # asked of the node that answered (in a cluster, MOVED comes after the ACL check)
            keys = key_prefix(entity.prefix, settings.namespace)
            denied, unchecked = writer_denied(client, (keys + "__doctor_probe__").encode())
            user, label = settings.username or "default", f"redis acl {entity.name}"
            if denied:
                checks.append(
                    Check(
                        "fail",
                        label,
                        f"user {user} may not run {', '.join(denied)} on {keys}*",
                        "grant the writer's ACL (conf/base/redis-acl.txt, conf/README.md 'Least privilege')",
                    )
                )
            elif unchecked:
                checks.append(
                    Check(
                        "warn",
                        label,
                        f"user {user} may run the writer's commands on {keys}* except {', '.join(unchecked)}, "
                        "which were not tried (MULTI refused)",
                        "grant +multi +discard (never +exec) so they can be checked without writing",
                    )
                )
            else:
                checks.append(Check("ok", label, f"user {user} may run the writer's commands on {keys}*"))
        return checks
    finally:
        for node in {id(n): n for _, n in nodes}.values():
            node.close()
        client.close()


def _listpack(defs: Definitions, sources: list[str], entries: int, value_bytes: int) -> list[Check]:
    """Fields per entity hash (every source of the entity, each with its freshness field)
    against hash-max-listpack-entries: past it a hash takes about 4 times the memory."""
    fields: dict[str, int] = {}
    for name in defs.sources:
        source = defs.source(name)
        entity = defs.entity_of(source).name
        fields[entity] = fields.get(entity, 0) + len(source.features) + 1
    used = {defs.entity_of(defs.source(s)).name for s in sources}
    over = {e: n for e, n in fields.items() if e in used and n > entries}
    if over:
        listed = ", ".join(f"{e} {n}" for e, n in over.items())
        return [
            Check(
                "warn",
                "redis listpack",
                f"fields per hash ({listed}) pass hash-max-listpack-entries {entries}: "
                "those hashes use the hashtable encoding (about 4x memory)",
                f"raise hash-max-listpack-entries above {max(over.values())}",
            )
        ]
    return [
        Check(
            "ok",
            "redis listpack",
            f"hash-max-listpack-entries {entries}, value {value_bytes}: every entity's hash fits "
            f"({', '.join(f'{e} {n} fields' for e, n in fields.items() if e in used)})",
        )
    ]


# -- SQL ------------------------------------------------------------------------------------


def check_sql(conf: RunConf, defs: Definitions, sources: list[str]) -> list[Check]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from sinks.sql.preflight import SCHEMA_STEP, detect_dialect, is_loopback, missing_privileges, table_columns
    from sinks.sql.statements import COLUMNS
    from stores.sql import connect

    settings = conf.sql
    base = sql_sink_config(conf)
    info = conninfo_to_dict(settings.dsn)
    where = f"{info.get('user', '?')}@{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '?')}"
    try:
        conn = connect(base)
    except psycopg.Error as exc:
        return [
            Check(
                "fail",
                "sql",
                f"{where}: cannot connect ({str(exc).strip().splitlines()[0]})",
                "fix sql.dsn, the password in sql.password_env/_file, or start the server",
            )
        ]
    with conn:
        conn.execute("SET default_transaction_read_only = on")  # nothing this session does can write
        found = detect_dialect(conn)
        checks = [Check("ok", "sql", f"{where}: {found}")]
        if settings.dialect not in ("auto", found):
            checks.append(
                Check("fail", "sql dialect", f"sql.dialect is {settings.dialect} but the server is {found}", "set sql.dialect: auto")
            )
        if info.get("sslmode", "prefer") != "verify-full" and not is_loopback(settings.dsn):
            checks.append(
                Check(
                    "warn",
                    "sql tls",
                    f"sslmode is {info.get('sslmode', 'prefer')}: the server's certificate is not verified",
                    "add sslmode=verify-full (and sslrootcert) to sql.dsn",
                )
            )
        seen: set[str] = set()
        for name in sources:
            source = defs.source(name)
            entity = defs.entity_of(source)
            if entity.name in seen:
                continue
            seen.add(entity.name)
            config = sql_sink_config(conf, source, entity, None, found)
            label = f"sql table {config.table}"
            columns = table_columns(conn, config)
            if not columns and _may_create(conn, config):
                checks.append(Check("ok", label, f"{config.table_name}: not there yet; this role may create it (the first run does)"))
                continue
            if not columns:
                checks.append(
                    Check(
                        "fail",
                        label,
                        f"{config.table_name} is missing (or this role holds no privilege on it)",
                        f"run `{SCHEMA_STEP.replace('<env>', conf.env)}` under a role that may create tables; "
                        "grant conf/base/sql-grants.sql",
                    )
                )
                continue
            missing = [c for c in COLUMNS if c not in columns]
            lacking = missing_privileges(conn, config)
            if missing or lacking:
                text = "; ".join(
                    filter(None, [missing and f"no column(s) {', '.join(missing)}", lacking and f"this role lacks {', '.join(lacking)}"])
                )
                fix = "see serializers/FORMAT.md 'SQL layout' and conf/base/sql-grants.sql"
                if missing == ["expires_at"]:  # a table made before the entity TTL reached SQL rows
                    fix = f"run `{SCHEMA_STEP.replace('<env>', conf.env)}` under the table owner (or one run as it); {fix}"
                checks.append(Check("fail", label, f"{config.table_name}: {text}", fix))
            else:
                checks.append(Check("ok", label, f"{config.table_name}: columns and SELECT, INSERT, UPDATE in place"))
    return checks


def _may_create(conn, config) -> bool:
    row = conn.execute("SELECT has_schema_privilege(COALESCE(%s, current_schema()), 'CREATE')", (config.schema,)).fetchone()
    return bool(row and row[0])


# -- the feature server (materialize serve) ---------------------------------------------------


def check_server(conf: RunConf) -> list[Check]:
    """``server:``: the port (free, or a feature server already answers there), the TLS files
    (readable, PEM, the key the certificate's, not expired or expiring soon) and the
    authentication (JWKS readable and parsed; unauthenticated only where serve allows it)."""
    from feature_reader.auth import AuthConfigError, KeySet, is_loopback
    from feature_reader.tls import check_tls_files

    server = conf.server
    checks = [_server_port(server.host, server.port, bool(server.tls.cert_file))]
    checks += [Check(status, name, detail, _TLS_FIX) for status, name, detail in check_tls_files(server.tls, conf.path)]
    auth, loopback = server.auth, is_loopback(server.host)
    if auth.mode == "jwt":
        where = f"jwks_file {conf.path(auth.jwks_file)}" if auth.jwks_file else f"jwks_url {auth.jwks_url}"
        try:
            keys = KeySet(auth, conf.path)
        except AuthConfigError as exc:
            return [*checks, Check("fail", "server auth", str(exc), "point server.auth.jwks_file at the identity provider's JWKS")]
        if keys.failure:
            checks.append(Check("fail", "server auth", keys.failure, "check server.auth.jwks_url and this host's network"))
        else:
            checks.append(Check("ok", "server auth", f"JWT: {where}: {len(keys.keys)} key(s); issuer {auth.issuer}"))
    elif auth.mode == "none" and not loopback:
        checks.append(
            Check("warn", "server auth", f"none on {server.host} (server.auth.mode: none): anyone reaching the port reads every feature")
        )
    elif auth.mode is None and not loopback:
        checks.append(
            Check("fail", "server auth", f"serve refuses to start unauthenticated on {server.host}",
                  "set server.auth (mode: jwt), or server.auth.mode: none to serve unauthenticated on purpose")
        )  # fmt: skip
    else:
        checks.append(Check("ok", "server auth", f"none: {server.host} is a loopback address"))
    if not loopback and not server.tls.cert_file:
        checks.append(Check("warn", "server tls", f"plain HTTP on {server.host}: requests and tokens travel in clear", _TLS_FIX))
    return checks


_TLS_FIX = "fix server.tls (cert_file, key_file, client_ca_file): feature_reader/README.md 'TLS'"


def _server_port(host: str, port: int, tls: bool) -> Check:
    import errno
    import ssl
    import urllib.error
    import urllib.request

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a connection in TIME_WAIT does not count
        try:
            sock.bind((host, port))
            return Check("ok", "server port", f"{host}:{port} is free")
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return Check("fail", "server port", f"{host}:{port}: {exc.strerror}", "set server.host to an address of this machine")
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"{'https' if tls else 'http'}://{f'[{probe}]' if ':' in probe else probe}:{port}/health"
    context = ssl._create_unverified_context() if tls else None  # noqa: S323 (only asks who holds the port)
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310
            body = json.loads(response.read(65536))
    except urllib.error.HTTPError as exc:  # 503: ours, a store down
        try:
            body = json.loads(exc.read(65536))
        except ValueError:
            body = None
    except (OSError, ValueError):
        body = None
    if isinstance(body, dict) and "stores" in body:
        return Check("ok", "server port", f"{host}:{port}: a feature server already answers there ({body.get('status')})")
    return Check("fail", "server port", f"{host}:{port} is taken by another program", "stop it, or set server.port")

"""Sources as Feast users have them: Parquet (one file, a folder of files, a hive-partitioned
folder, written by pyarrow as pandas users write them) and a table of Spark's catalog (the
suite's Hive metastore, conftest.py). Each is materialized into Redis and SQL and read back
raw against values derived here from the rows; bad locations and tables fail in one line with
nothing written; the catalog is the same one for a CLI process."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feature_defs import DEFAULT_DIR, load_definitions
from fm_config import CatalogConf, ConfigError, SparkConf, load_config
from jobs.cli import main
from jobs.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_TERMINAL, EXIT_USAGE
from jobs.operations.backfill import plan_backfill
from jobs.operations.cleanup.redis import table_keys
from jobs.operations.doctor.sources import check_source
from jobs.operations.ledger.events import Ledger, RedisWrite, keys_from
from jobs.pipeline.read import partition_rows
from jobs.pipeline.run import run_source
from jobs.pipeline.source_table import dated, open_source
from jobs.source_errors import CatalogNotConfigured, SchemaDriftError, SourceNotFound, SourceUnreadable
from jobs.spark import catalog_settings
from jobs.transforms import ENTITY_ID
from serializers import field_id, freshness_field_name, subsecond_field
from serializers.batch import FeatureSpec
from serializers.keys import as_of_epoch

from .expected import entity_keys, expected_hash
from .support.confs import env_conf
from .support.events import micros

D1, D2, D3 = dt.date(2026, 11, 19), dt.date(2026, 11, 20), dt.date(2026, 11, 21)
KINDS = ("parquet_file", "parquet_folder", "parquet_hive", "catalog_table")
DATABASE = "fm_sources"
COLUMNS = {"score": "float", "orders": "int", "tier": "string", "tags": "string_list"}


def features_yaml(prefix: str = "") -> str:
    """The sources' features; with a prefix, named apart (sources of one entity cannot share a name)."""
    lines = [
        f"    - {{name: {prefix}{c}, type: {t}, column: {c}}}" if prefix else f"    - {{name: {c}, type: {t}}}" for c, t in COLUMNS.items()
    ]
    return "  timestamp_column: ts\n  features:\n" + "\n".join(lines) + "\n"


SCHEMA = pa.schema(
    [
        ("consumer_id", pa.int64()),
        ("score", pa.float64()),
        ("orders", pa.int64()),
        ("tier", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("ts", pa.timestamp("us")),
        ("ds", pa.date32()),
    ]
)


def source_rows() -> list[dict]:
    """Two dates of 12 consumers (odd ones twice a date: the later row wins) and one consumer
    seen on the first date only."""
    rng = random.Random(40)
    out = []
    for day in (D1, D2):
        for cid in range(1, 13 + (day == D1)):
            for version in range(1 + cid % 2):
                out.append(
                    {
                        "consumer_id": cid,
                        "score": round(rng.uniform(0, 100), 3),
                        "orders": rng.randint(0, 50),
                        "tier": rng.choice(["gold", "silver", None]),
                        "tags": rng.choice([["a"], ["b", "c"], [], None]),
                        "ts": dt.datetime.combine(day, dt.time(1 + version)),
                        "ds": day,
                    }
                )
    return out


ROWS = source_rows()


def expected_rows(day: dt.date) -> dict[int, dict]:
    """The latest row per consumer of ``day``, picked here from the rows themselves."""
    latest: dict[int, dict] = {}
    for row in ROWS:
        if row["ds"] == day and (row["consumer_id"] not in latest or row["ts"] > latest[row["consumer_id"]]["ts"]):
            latest[row["consumer_id"]] = row
    return latest


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory) -> dict[str, str]:
    """Each kind's table, and where the definition finds it (a location or a catalog table)."""
    root = tmp_path_factory.mktemp("source_kinds")
    table = pa.Table.from_pylist(ROWS, SCHEMA)
    # as pandas writes it (Feast's example files too): event times of nanoseconds, in UTC
    pq.write_table(
        table.cast(SCHEMA.set(SCHEMA.get_field_index("ts"), pa.field("ts", pa.timestamp("ns", tz="UTC")))), root / "single.parquet"
    )
    (root / "folder").mkdir()
    half = len(ROWS) // 2
    pq.write_table(table.slice(0, half), root / "folder" / "part-0.parquet")
    pq.write_table(table.slice(half), root / "folder" / "part-1.parquet")
    (root / "folder" / "_SUCCESS").write_text("")  # as Spark and Hadoop jobs leave it: not data
    for day in (D1, D2):  # hive-style: the date is in the folder name only
        folder = root / "hive" / f"ds={day}"
        folder.mkdir(parents=True)
        rows = table.filter(pa.compute.equal(table["ds"], pa.scalar(day, pa.date32()))).drop_columns(["ds"])
        pq.write_table(rows, folder / "part-0.parquet")
    (root / "empty").mkdir()
    (root / "empty" / "_SUCCESS").write_text("")
    # a Delta table of the catalog, partitioned by text dates as Hive tables often are
    frame = spark.createDataFrame(
        [{**r, "ds": r["ds"].isoformat()} for r in ROWS],
        "consumer_id long, score double, orders long, tier string, tags array<string>, ts timestamp, ds string",
    )
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    frame.write.format("delta").mode("overwrite").partitionBy("ds").saveAsTable(f"{DATABASE}.consumers")
    drifted = frame.withColumn("orders", frame["orders"].cast("string")).drop("tags")
    drifted.write.format("parquet").mode("overwrite").saveAsTable(f"{DATABASE}.drifted")
    return {
        "root": str(root),
        "parquet_file": f"location: {root / 'single.parquet'}\n  format: parquet",
        "parquet_folder": f"location: {root / 'folder'}\n  format: parquet",
        "parquet_hive": f"location: {root / 'hive'}\n  format: parquet",
        "catalog_table": f"table: {DATABASE}.consumers",
    }


def definitions(folder: Path, sources: dict[str, str]):
    """A definitions folder: the project's entities and one consumer source per (name, where)."""
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    for name, where in sources.items():
        features = features_yaml(f"{name}_" if len(sources) > 1 else "")
        (folder / f"{name}.yaml").write_text(f"source:\n  name: {name}\n  entity: consumer\n  {where}\n  layout: wide\n{features}")
    return load_definitions(folder)


@pytest.fixture
def both(sql_conf, catalog):
    """A run into the session's Redis and PostgreSQL, with the session's catalog (no read-back
    of its own: the tests read both stores raw)."""
    quality = sql_conf.quality.model_copy(update={"verify_sample": 0})
    return sql_conf.model_copy(update={"sinks": ["redis", "sql"], "spark": SparkConf(catalog=catalog), "quality": quality})


def stored_sql(conn) -> dict[str, tuple]:
    rows = conn.execute("SELECT entity_key, source, features::text, as_of FROM consumer_features").fetchall()
    return {key: (source, json.loads(doc), as_of) for key, source, doc, as_of in rows}


@pytest.mark.parametrize("kind", KINDS)
def test_each_source_kind_is_materialized_into_both_stores(kind, tables, spark, both, redis_db, pg_db, tmp_path):
    defs = definitions(tmp_path / "defs", {kind: tables[kind]})
    source = defs.source(kind)
    summary = run_source(spark, both, defs, kind, D2)
    expected = expected_rows(D2)
    assert summary.status == "succeeded" and summary.entities == len(expected) == 12

    as_of = as_of_epoch(D2)
    fresh = field_id(freshness_field_name(kind))
    stored = {key: redis_db.hgetall(key) for key in entity_keys(redis_db)}
    assert stored == {f"c:{cid}".encode(): expected_hash(source.features, row, fresh, as_of) for cid, row in expected.items()}

    as_of_time = dt.datetime.combine(D3, dt.time(), dt.UTC)
    values = {cid: {f.name: row[f.name] for f in source.features if row[f.name] is not None} for cid, row in expected.items()}
    assert stored_sql(pg_db) == {str(cid): (kind, values[cid], as_of_time) for cid in expected}


@pytest.mark.parametrize("kind", ["parquet_hive", "catalog_table"])
def test_a_run_reads_only_its_dates_partition(kind, tables, spark, both, tmp_path):
    """The date filter reaches the scan as a partition filter: other dates' files are not listed."""
    source = definitions(tmp_path / "defs", {kind: tables[kind]}).source(kind)
    one_date = dated(open_source(spark, both, source), source.date_column, D2)
    plan = one_date._jdf.queryExecution().executedPlan().toString()
    pruned = [line for line in plan.splitlines() if "PartitionFilters: [" in line]
    assert pruned and "2026-11-20" in pruned[0].split("PartitionFilters: [", 1)[1].split("]", 1)[0], plan
    assert sorted(r["consumer_id"] for r in one_date.select("consumer_id").distinct().collect()) == list(range(1, 13))
    assert {r["ds"] for r in one_date.select("ds").distinct().collect()} == {D2}  # text dates read as dates


BAD = {
    "no_file": ("location: {root}/nowhere.parquet\n  format: parquet", "no Parquet file or folder at {root}/nowhere.parquet"),
    "no_parquet": ("location: {root}/empty\n  format: parquet", "no Parquet files (*.parquet) in {root}/empty"),
    "no_table": (f"table: {DATABASE}.nowhere", f"no table {DATABASE}.nowhere in the catalog (Hive metastore {{uri}})"),
    "no_database": ("table: nodb.consumers", "no database nodb in the catalog (Hive metastore {uri}), so no table nodb.consumers"),
}


@pytest.mark.parametrize("name", BAD)
def test_a_location_or_table_that_is_not_there_is_one_line_and_nothing_is_written(
    name, tables, spark, both, catalog, redis_db, pg_db, tmp_path
):
    where, message = BAD[name]
    defs = definitions(tmp_path / "defs", {name: where.format(root=tables["root"])})
    with pytest.raises(SourceNotFound) as info:
        run_source(spark, both, defs, name, D2)
    assert str(info.value) == f"source {name!r}: " + message.format(root=tables["root"], uri=catalog.metastore_uri)
    assert redis_db.dbsize() == 0
    assert pg_db.execute("SELECT to_regclass('consumer_features')").fetchone()[0] is None
    assert partition_rows(spark, both, defs.source(name), D2) == 0  # readiness: not there (yet) is no rows


def test_the_command_line_names_each_bad_source_in_one_line(tables, both, catalog, redis_db, tmp_path, monkeypatch, capsys):
    root = tables["root"]
    definitions(tmp_path / "defs", {name: where.format(root=root) for name, (where, _) in BAD.items()})
    conf = env_conf(
        tmp_path / "conf",
        "kinds",
        f"data_root: {root}\nledger_root: {tmp_path / 'ledger'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"definitions_dir: {tmp_path / 'defs'}\nsinks: [redis]\nredis: {{url: '{both.redis.url}', password_env: null}}\n"
        "quality: {expectations: false}\n"
        f"spark: {{catalog: {{type: hive, metastore_uri: '{catalog.metastore_uri}'}}}}\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    shown = ("no_database",)  # every message: the test above; here, that the command prints it as it is
    assert main(["run", "--env", "kinds", "--date", str(D2), *[a for name in shown for a in ("--source", name)]]) == EXIT_FAILED
    err = capsys.readouterr().err
    for name, (_, message) in [(name, BAD[name]) for name in shown]:
        line = f"error: {name}: SourceNotFound: source {name!r}: " + message.format(root=root, uri=catalog.metastore_uri)
        assert line in err.splitlines(), err
    assert "Traceback" not in err and "\tat " not in err and "java." not in err
    assert redis_db.dbsize() == 0

    # a catalog table with no catalog configured: refused before Spark is asked, naming the setting
    text = (conf / "kinds" / "m.yaml").read_text()
    (conf / "kinds" / "m.yaml").write_text(text[: text.index("spark:")])
    assert main(["run", "--env", "kinds", "--date", str(D2), "--source", "no_table"]) == EXIT_USAGE
    assert capsys.readouterr().err.strip() == (
        f"error: source 'no_table' reads the catalog table {DATABASE}.nowhere, but no catalog is configured: set spark.catalog in "
        "conf/<env>/*.yaml (type: hive with a metastore_uri or metastore_dir; conf/README.md#catalog)"
    )


@pytest.mark.parametrize("kind, where", [("parquet_file", None), ("catalog_table", f"table: {DATABASE}.drifted")])
def test_columns_are_checked_before_anything_is_read_for_every_kind(kind, where, tables, spark, both, redis_db, tmp_path):
    if where is None:  # a file whose orders became text, without tags, dated by timestamps
        drifted = pa.Table.from_pylist(ROWS, SCHEMA)
        drifted = drifted.set_column(2, "orders", pa.compute.cast(drifted["orders"], pa.string())).drop_columns(["tags"])
        drifted = drifted.set_column(drifted.schema.get_field_index("ds"), "ds", pa.compute.cast(drifted["ts"], pa.timestamp("us")))
        pq.write_table(drifted, tmp_path / "drifted.parquet")
        where = f"location: {tmp_path / 'drifted.parquet'}\n  format: parquet"
    defs = definitions(tmp_path / "defs", {kind: where})
    with pytest.raises(SchemaDriftError) as info:
        run_source(spark, both, defs, kind, D2)
    at = f"{tmp_path / 'drifted.parquet'}" if kind == "parquet_file" else f"catalog table {DATABASE}.drifted"
    head = f"source {kind!r} ({at}) does not match its definition: "
    lines = [
        head + "column 'orders' has type string, expected int (bigint)",
        head + "column 'tags' is missing (expected string_list (array<string>))",
    ]
    if kind == "parquet_file":
        lines.insert(0, head + "column 'ds' has type timestamp_ntz, expected the date column: a date, or yyyy-MM-dd text")
    assert str(info.value).splitlines() == lines
    assert redis_db.dbsize() == 0


def test_the_ledger_keeps_a_catalog_tables_identity_and_cleanup_finds_its_keys_again(tables, spark, both, tmp_path):
    defs = definitions(tmp_path / "defs", {k: tables[k] for k in ("catalog_table", "parquet_hive")})
    entity = defs.entity("consumer")
    for kind in ("catalog_table", "parquet_hive"):
        where = keys_from(both, defs.source(kind), entity)
        assert where == (
            {"table": f"{DATABASE}.consumers", "key_columns": ["consumer_id"], "date_column": "ds"}
            if kind == "catalog_table"
            else {"location": f"{tables['root']}/hive", "format": "parquet", "key_columns": ["consumer_id"], "date_column": "ds"}
        )
        where = json.loads(json.dumps(where))  # as the ledger stores it
        write = RedisWrite("r1", kind, frozenset({f"{kind}_score"}), where, (D1,), D1, D1)
        keys, problem = table_keys(spark, both, entity, where, [write])
        assert problem is None
        assert sorted({int(r[ENTITY_ID]) for r in keys.collect()}) == list(range(1, 14))  # consumer 13: the first date only
        gone = RedisWrite("r2", kind, frozenset({f"{kind}_score"}), where, (D3,), D3, D3)
        ref = f"catalog table {DATABASE}.consumers" if kind == "catalog_table" else f"{tables['root']}/hive"
        assert table_keys(spark, both, entity, where, [gone])[1] == f"{ref} no longer holds the dates {D3} that were written from it"


def test_a_backfill_plans_a_catalog_tables_dates_from_its_rows(tables, spark, both, tmp_path):
    """Text-dated partitions of a catalog table are the backfill's dates with data, and its rows
    are counted from them."""
    defs = definitions(tmp_path / "defs", {"catalog_table": tables["catalog_table"]})
    conf = both.model_copy(update={"ledger_root": str(tmp_path / "ledger")})
    plan = plan_backfill(spark, conf, defs, Ledger.of(spark, conf), "catalog_table", D1, D3, "latest", False)
    assert (plan.dates_with_data, plan.to_write, plan.no_rows) == ([D1, D2], [D1, D2], [D3])
    assert plan.rows == len(ROWS)


def test_readiness_and_doctor_open_each_kind_as_a_run_does(tables, spark, both, tmp_path):
    defs = definitions(tmp_path / "defs", {kind: tables[kind] for kind in KINDS})
    for kind in KINDS:
        source = defs.source(kind)
        assert [partition_rows(spark, both, source, day) for day in (D2, D3)] == [1, 0], kind
        check = check_source(both, defs, source)
        where = f"catalog table {DATABASE}.consumers" if kind == "catalog_table" else tables[kind].split(": ")[1].split("\n")[0]
        what = "catalog table" if kind == "catalog_table" else "Parquet"
        assert (check.status, check.detail) == ("ok", f"{where}: {what}, columns match the definition")
    unconfigured = both.model_copy(update={"spark": SparkConf(catalog=CatalogConf())})
    check = check_source(unconfigured, defs, defs.source("catalog_table"))
    assert (check.status, check.detail) == ("fail", f"catalog table {DATABASE}.consumers: no catalog is configured")
    with pytest.raises(CatalogNotConfigured):
        open_source(spark, unconfigured, defs.source("catalog_table"))


def test_a_command_in_another_process_reads_the_same_catalog(tables, spark, catalog, tmp_path):
    """The catalog persists beyond the session that made its tables: a CLI process of its own
    (its own JVM) finds the table through the same metastore."""
    definitions(tmp_path / "defs", {"catalog_table": tables["catalog_table"]})
    conf = env_conf(
        tmp_path / "conf",
        "other",
        f"data_root: {tables['root']}\ndefinitions_dir: {tmp_path / 'defs'}\n"
        f"spark: {{catalog: {{type: hive, metastore_uri: '{catalog.metastore_uri}'}}}}\n",
    )
    command = [str(Path(sys.executable).parent / "materialize"), "ready", "--env", "other", "--source", "catalog_table", "--date", str(D2)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "FM_CONF_DIR": str(conf)})
    assert (done.returncode, done.stdout.strip()) == (EXIT_OK, f"catalog_table has rows for {D2}"), done.stderr[-3000:]


def test_files_that_are_not_parquet_are_one_line_naming_them(tables, spark, both, tmp_path):
    (tmp_path / "data.parquet").write_text("consumer_id,score\n1,0.5\n")  # a CSV under a Parquet name
    defs = definitions(tmp_path / "defs", {"not_parquet": f"location: {tmp_path / 'data.parquet'}\n  format: parquet"})
    with pytest.raises(SourceUnreadable) as info:
        run_source(spark, both, defs, "not_parquet", D2)
    message = str(info.value)
    assert message.startswith(f"source 'not_parquet': cannot read {tmp_path / 'data.parquet'} as parquet: ") and "\n" not in message
    assert "not a Parquet file" in message, message


@pytest.mark.parametrize(
    "text, problem",
    [
        ("    type: hive\n",
         "spark.catalog: Value error, type: hive needs either a metastore_uri (a metastore service) or a metastore_dir (embedded), "
         "not both"),
        ("    type: hive\n    metastore_uri: http://ms:9083\n",
         "spark.catalog: Value error, metastore_uri: 'http://ms:9083' is not a thrift://host:port address"),
        ("    metastore_dir: .run/metastore\n", "spark.catalog: Value error, metastore_dir only applies to type: hive"),
        ("    type: glue\n", "spark.catalog.type: Input should be 'none', 'hive' or 'session'"),
    ],
)  # fmt: skip
def test_a_catalog_setting_that_cannot_work_is_named_at_its_line(text, problem, tmp_path, monkeypatch):
    conf = env_conf(tmp_path / "conf", "cat", "spark:\n  catalog:\n" + text)
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    with pytest.raises(ConfigError) as info:
        load_config("cat")
    assert str(info.value) == f"invalid configuration:\n  {conf / 'cat' / 'm.yaml'}:3: {problem}"


def test_the_session_settings_of_each_catalog(tmp_path):
    assert catalog_settings(CatalogConf()) == catalog_settings(CatalogConf(type="session")) == {}  # the in-memory or the cluster's own
    assert catalog_settings(CatalogConf(type="hive", metastore_uri="thrift://ms:9083")) == {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": "thrift://ms:9083",
    }
    assert catalog_settings(CatalogConf(type="hive", metastore_dir=str(tmp_path / "ms"))) == {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={tmp_path / 'ms'}/metastore_db;create=true",
        "spark.sql.warehouse.dir": str(tmp_path / "ms" / "warehouse"),
    }


def test_timestamps_of_nanoseconds_as_pandas_writes_them_read_as_timestamps(spark, both, tmp_path):
    nanos = pa.array([1_795_151_167_123_456_789, None], pa.int64())  # 2026-11-20 05:06:07.123456789 UTC
    pq.write_table(
        pa.table(
            {
                "consumer_id": pa.array([1, 2], pa.int64()),
                "event_timestamp": nanos.cast(pa.timestamp("ns", tz="UTC")),
                "created": nanos.cast(pa.timestamp("ns")),
                "orders": pa.array([7, 8], pa.int64()),
            }
        ),
        tmp_path / "stats.parquet",
    )
    defs = definitions(tmp_path / "defs", {"stats": f"location: {tmp_path / 'stats.parquet'}\n  format: parquet"})
    table = open_source(spark, both, defs.source("stats"))
    assert table.schema.simpleString() == "struct<consumer_id:bigint,event_timestamp:timestamp,created:timestamp_ntz,orders:bigint>"
    micros = "'yyyy-MM-dd HH:mm:ss.SSSSSS'"  # in the session's time zone, UTC
    shown = table.orderBy("consumer_id").selectExpr(f"date_format(event_timestamp, {micros})", f"date_format(created, {micros})", "orders")
    assert [tuple(r) for r in shown.collect()] == [("2026-11-20 05:06:07.123456", "2026-11-20 05:06:07.123456", 7), (None, None, 8)]


# -- folders whose files were written by different writers --

NS_PER_US = 1000


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def nanos(when: dt.datetime, extra: int = 0) -> int:
    """``when`` in nanoseconds since the epoch, plus ``extra`` nanoseconds."""
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * NS_PER_US + extra


def epoch_seconds(when: dt.datetime) -> int:
    return int((when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(seconds=1))


def subsecond(source: str, when: dt.datetime) -> dict[bytes, bytes]:
    """The sub-second field a write of an event time leaves (serializers/FORMAT.md 1.4): none for whole seconds."""
    return {subsecond_field(source): str(when.microsecond).encode()} if when.microsecond else {}


STATS_YAML = """source:
  name: stats
  entity: consumer
  location: {where}
  format: parquet
  layout: wide
{selection}  features:
    - {{name: conv_rate, type: float}}
    - {{name: trips, type: int}}
"""
EVENT_TIME = "  select_by: event_time\n  timestamp_column: event_timestamp\n  created_column: created\n"
STATS_SPECS = [FeatureSpec("conv_rate", "float"), FeatureSpec("trips", "int")]


def stats_definitions(folder: Path, where: Path, selection: str = EVENT_TIME):
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "stats.yaml").write_text(STATS_YAML.format(where=where, selection=selection))
    return load_definitions(folder)


# consumer, conv_rate, trips, event time (the nanoseconds beyond its microsecond), created
PANDAS_ROWS = [  # as pandas writes them (Feast's example files): nanoseconds, event times in UTC, created naive
    (1, 0.125, 10, utc("2026-11-19T10:00:00.123456"), 789, utc("2026-11-19T11:00:00")),
    (2, 0.25, 20, utc("2026-11-20T05:06:07.123456"), 789, utc("2026-11-20T06:00:00")),
]
SPARK_ROWS = [  # as Spark and pyarrow write them: microseconds
    (1, 0.875, 90, utc("2026-11-20T05:06:07.123456"), 0, utc("2026-11-20T06:00:00")),  # consumer 1's newest row
    (3, 0.375, 30, utc("2026-11-20T23:59:59.999999"), 0, utc("2026-11-21T00:00:00")),
]


def write_stats(path: Path, rows: list[tuple], unit: str) -> None:
    """Rows in event times of ``unit`` (ns: pandas's, us: Spark's and pyarrow's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scale = NS_PER_US if unit == "ns" else 1
    count = [nanos(r[3], r[4]) // (NS_PER_US // scale) for r in rows]
    created = [nanos(r[5]) // (NS_PER_US // scale) for r in rows]
    table = {
        "consumer_id": pa.array([r[0] for r in rows], pa.int64()),
        "conv_rate": pa.array([r[1] for r in rows], pa.float64()),
        "trips": pa.array([r[2] for r in rows], pa.int64()),
        "event_timestamp": pa.array(count, pa.int64()).cast(pa.timestamp(unit, tz="UTC")),
        "created": pa.array(created, pa.int64()).cast(pa.timestamp(unit) if unit == "ns" else pa.timestamp(unit, tz="UTC")),
    }
    pq.write_table(pa.table(table), path)


@pytest.mark.parametrize("pandas_file, spark_file", [("a.parquet", "b.parquet"), ("b.parquet", "a.parquet")])
def test_a_folder_of_nanosecond_and_microsecond_files_reads_each_in_its_own_unit(
    pandas_file, spark_file, spark, both, redis_db, pg_db, tmp_path
):
    """Which file's footer Spark takes the folder's types from depends on the names: in either
    order each file is read in its own unit, and the newest row is the one stored."""
    folder = tmp_path / "stats"
    write_stats(folder / pandas_file, PANDAS_ROWS, "ns")
    write_stats(folder / spark_file, SPARK_ROWS, "us")
    defs = stats_definitions(tmp_path / "defs", folder)
    source = defs.source("stats")

    table = open_source(spark, both, source)
    columns = "consumer_id:bigint,conv_rate:double,trips:bigint,event_timestamp:timestamp,created:timestamp"
    assert table.schema.simpleString() == f"struct<{columns}>"  # naive created times widened to instants (as UTC)
    read = sorted((r[0], r[3].replace(tzinfo=dt.UTC), r[4].replace(tzinfo=dt.UTC)) for r in table.collect())
    assert read == sorted((r[0], r[3], r[5]) for r in PANDAS_ROWS + SPARK_ROWS)  # to the microsecond, nanoseconds dropped
    assert partition_rows(spark, both, source, D2) == 1  # `materialize ready`: the date has rows

    summary = run_source(spark, both, defs, "stats", D2)
    assert summary.status == "succeeded", summary.error
    newest: dict[int, tuple] = {}  # per consumer, the row of the latest event time
    for row in PANDAS_ROWS + SPARK_ROWS:
        if row[0] not in newest or row[3] > newest[row[0]][3]:
            newest[row[0]] = row
    assert [newest[c][2] for c in (1, 2, 3)] == [90, 20, 30]
    fresh = field_id(freshness_field_name("stats"))
    stored = {key: redis_db.hgetall(key) for key in redis_db.scan_iter("c:*")}
    values = {c: {"conv_rate": r[1], "trips": r[2]} for c, r in newest.items()}
    assert stored == {
        f"c:{c}".encode(): expected_hash(STATS_SPECS, values[c], fresh, epoch_seconds(r[3]), subsecond("stats", r[3]))
        for c, r in newest.items()
    }
    assert {k: (s, doc, micros(when)) for k, (s, doc, when) in stored_sql(pg_db).items()} == {
        str(c): ("stats", values[c], micros(r[3])) for c, r in newest.items()
    }


BY_DATE = "  timestamp_column: ts\n"


def write_dated(path: Path, rows: list[tuple], trips: pa.DataType, conv_rate: pa.DataType) -> None:
    """Rows (consumer, conv_rate, trips, date) with the two feature columns of these types."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {
        "consumer_id": pa.array([r[0] for r in rows], pa.int64()),
        "conv_rate": pa.array([r[1] for r in rows], conv_rate),
        "trips": pa.array([r[2] for r in rows], trips),
        "ts": pa.array([dt.datetime.combine(r[3], dt.time(1)) for r in rows], pa.timestamp("us")),
        "ds": pa.array([r[3] for r in rows], pa.date32()),
    }
    pq.write_table(pa.table(table), path)


OLD_ROWS = [(1, 0.1, 7, D1), (2, 2.5, -(2**31), D1)]  # written as int and float
NEW_ROWS = [(1, 0.1, 2**40, D2), (3, 1e300, 2**31, D2)]  # as bigint and double: beyond int and float


@pytest.mark.parametrize("old_file, new_file", [("a.parquet", "b.parquet"), ("b.parquet", "a.parquet")])
def test_a_folder_whose_newer_files_widened_a_column_reads_every_file_in_the_wider_type(
    old_file, new_file, spark, both, redis_db, tmp_path
):
    """int in older files, bigint in newer ones (float, double): read as bigint (double) whichever
    file's footer Spark takes; each date's values as written."""
    folder = tmp_path / "stats"
    write_dated(folder / old_file, OLD_ROWS, pa.int32(), pa.float32())
    write_dated(folder / new_file, NEW_ROWS, pa.int64(), pa.float64())
    defs = stats_definitions(tmp_path / "defs", folder, BY_DATE)
    fresh = field_id(freshness_field_name("stats"))
    assert open_source(spark, both, defs.source("stats")).schema["trips"].dataType.simpleString() == "bigint"
    for day, rows, as_float in ((D1, OLD_ROWS, lambda v: float(np.float32(v))), (D2, NEW_ROWS, float)):
        redis_db.flushall()
        summary = run_source(spark, both, defs, "stats", day)
        assert summary.status == "succeeded", summary.error
        stored = {key: redis_db.hgetall(key) for key in redis_db.scan_iter("c:*")}
        assert stored == {
            f"c:{c}".encode(): expected_hash(STATS_SPECS, {"conv_rate": as_float(rate), "trips": trips}, fresh, as_of_epoch(day))
            for c, rate, trips, _ in rows
        }, day


@pytest.mark.parametrize(
    "column, old, new, found",
    [
        ("trips", (pa.int64(), 7), (pa.string(), "7"), "column 'trips' is bigint in a.parquet, string in b.parquet"),
        ("trips", (pa.int64(), 2**53 + 1), (pa.float64(), 7.0), "column 'trips' is bigint in a.parquet, double in b.parquet"),
        ("conv_rate", (pa.float64(), 0.1), (pa.int32(), 1), "column 'conv_rate' is double in a.parquet, int in b.parquet"),
    ],
)  # fmt: skip
def test_a_folder_whose_files_hold_a_column_in_types_that_would_lose_values_is_refused_in_one_line(
    column, old, new, found, both, redis_db, tmp_path, monkeypatch, capsys
):
    folder = tmp_path / "stats"
    for name, (kind, value) in (("a.parquet", old), ("b.parquet", new)):
        row = {"conv_rate": 0.5, "trips": 7, column: value}
        types = {"trips": pa.int64(), "conv_rate": pa.float64(), column: kind}
        write_dated(folder / name, [(1, row["conv_rate"], row["trips"], D2)], **types)
    stats_definitions(tmp_path / "defs", folder, BY_DATE)
    conf = env_conf(
        tmp_path / "conf",
        "mixed",
        f"data_root: {tmp_path}\nledger_root: {tmp_path / 'ledger'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"definitions_dir: {tmp_path / 'defs'}\nsinks: [redis]\nredis: {{url: '{both.redis.url}', password_env: null}}\n"
        "quality: {expectations: false}\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    message = (
        f"source 'stats': the Parquet files of {folder} disagree: {found}; only a widening that loses nothing is read (a smaller "
        "integer to a larger one, float to double, a timestamp without a time zone to one with): rewrite the files in one type"
    )
    assert main(["run", "--env", "mixed", "--date", str(D2)]) == EXIT_TERMINAL  # the same files fail again: not worth a retry
    err = capsys.readouterr().err
    assert f"error: stats: MixedParquetTypes: {message}" in err.splitlines(), err
    assert "Traceback" not in err and "\tat " not in err and "java." not in err
    assert redis_db.dbsize() == 0
    assert main(["ready", "--env", "mixed", "--source", "stats", "--date", str(D2)]) == EXIT_TERMINAL  # not "not ready": no wait for ever
    assert capsys.readouterr().err.strip() == f"error: {message}"


# -- column names as tables have them --

UNREAD = {"a.b": 1, "x y": "text", "un`read": 2.5, "ñ.é": "ü"}  # columns no feature reads
ODD_YAML = """source:
  name: {name}
  entity: {entity}
  location: {where}
  format: parquet
  layout: {layout}
{columns}  features:
{features}
"""
WIDE_COLUMNS = {
    "conv_rate": ("float", "conv.rate"),
    "trips": ("int", "trips count"),
    "note": ("string", "note`s"),
    "size": ("int", "größe"),
}
# consumer.id, jour.ds, updated at`, event`time, créé.le, then the feature columns in WIDE_COLUMNS' order
ODD_ROWS = [
    (1, D2, 1, utc("2026-11-20T01:00:00"), utc("2026-11-20T01:00:00"), 0.5, 5, "first", 50),
    (1, D2, 3, utc("2026-11-20T03:00:00"), utc("2026-11-20T02:00:00"), 1.5, 15, "latest", 150),
    (1, D2, 2, utc("2026-11-20T03:00:00"), utc("2026-11-20T01:00:00"), 9.5, 95, "created first", 950),
    (2, D2, 1, utc("2026-11-20T04:00:00"), utc("2026-11-20T04:00:00"), None, 2, "ünïcode `x`", None),
    (None, D2, 1, utc("2026-11-20T05:00:00"), utc("2026-11-20T05:00:00"), 7.0, 7, "no key", 7),  # quarantined
    (3, D1, 1, utc("2026-11-19T01:00:00"), utc("2026-11-19T01:00:00"), 3.5, 35, "the day before", 350),
]
ODD_KEYS = ("consumer.id", "jour.ds", "updated at`", "event`time", "créé.le")


def odd_sources(tmp_path: Path):
    """Two consumer sources over one Parquet file whose every column has a name with a dot, a
    space, a backtick or letters beyond ASCII (one selected by date, one by event time), and a
    long store source of such columns."""
    names = [*ODD_KEYS, *(column for _, column in WIDE_COLUMNS.values())]
    table = pa.Table.from_pylist([dict(zip(names, row)) | UNREAD for row in ODD_ROWS])
    table = table.set_column(2, "updated at`", pa.array([dt.datetime.combine(r[1], dt.time(r[2])) for r in ODD_ROWS], pa.timestamp("us")))
    pq.write_table(table, tmp_path / "odd.parquet")
    long_rows = [
        {"store id`": "s.1", "feature.name": "rating", "the value": "4.5", "jour.ds": D2, "a.b": 1},
        {"store id`": "s.1", "feature.name": "rating", "the value": "oops", "jour.ds": D1, "a.b": 1},
        {"store id`": "s 2", "feature.name": "rating", "the value": "3", "jour.ds": D2, "a.b": 2},
        {"store id`": "s:3", "feature.name": "rating", "the value": "1", "jour.ds": D2, "a.b": 3},  # a key with ':' is quarantined
    ]
    pq.write_table(pa.Table.from_pylist(long_rows), tmp_path / "odd_long.parquet")
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())

    def features(prefix: str) -> str:
        return "\n".join(f"    - {{name: {prefix}{n}, type: {t}, column: {json.dumps(c)}}}" for n, (t, c) in WIDE_COLUMNS.items())

    keys = '  key_columns: ["consumer.id"]\n'
    dated = keys + '  date_column: "jour.ds"\n  timestamp_column: "updated at`"\n'
    events = keys + '  select_by: event_time\n  timestamp_column: "event`time"\n  created_column: "créé.le"\n'
    long = '  key_columns: ["store id`"]\n  date_column: "jour.ds"\n  name_column: "feature.name"\n  value_column: "the value"\n'
    for name, entity, where, layout, columns, listed in (
        ("odd_dated", "consumer", "odd.parquet", "wide", dated, features("")),
        ("odd_events", "consumer", "odd.parquet", "wide", events, features("e_")),
        ("odd_long", "store", "odd_long.parquet", "long", long, "    - {name: rating, type: float}"),
    ):
        text = ODD_YAML.format(name=name, entity=entity, where=tmp_path / where, layout=layout, columns=columns, features=listed)
        (folder / f"{name}.yaml").write_text(text)
    return load_definitions(folder)


def test_columns_named_with_dots_spaces_backticks_and_other_letters_are_read_as_named(spark, both, redis_db, pg_db, tmp_path):
    """As keys, dates, times, created times, features, long layout names and values, and columns
    no feature reads: each read by its whole name, through the run, its quarantine, a backfill's
    plan and cleanup's key lookup."""
    defs = odd_sources(tmp_path)
    quality = both.quality.model_copy(update={"max_bad_fraction": 0.5})  # the rows of unusable keys
    conf = both.model_copy(
        update={"ledger_root": str(tmp_path / "ledger"), "quarantine_root": str(tmp_path / "quarantine"), "quality": quality}
    )
    specs = {n: FeatureSpec(n, t) for n, (t, _) in WIDE_COLUMNS.items()}
    by_source = {}
    for name in ("odd_dated", "odd_events", "odd_long"):
        summary = run_source(spark, conf, defs, name, D2)
        assert summary.status == "succeeded", summary.error
        by_source[name] = summary
    stored = {key: redis_db.hgetall(key) for key in redis_db.scan_iter("[cs]:*")}

    def latest(rows, order):  # per consumer, the row first in ``order`` (a key of the row, highest wins)
        out = {}
        for row in rows:
            if row[0] is not None and (row[0] not in out or order(row) > order(out[row[0]])):
                out[row[0]] = row
        return out

    dated = latest([r for r in ODD_ROWS if r[1] == D2], lambda r: r[2])
    events = latest([r for r in ODD_ROWS if r[3] < utc("2026-11-21T00:00:00")], lambda r: (r[3], r[4]))
    assert [dated[1][7], events[1][7], events[3][7]] == ["latest", "latest", "the day before"]

    def wide_hash(row, prefix, as_of, untouched=None) -> dict:
        values = dict(zip([prefix + n for n in WIDE_COLUMNS], row[5:]))
        return expected_hash(
            [FeatureSpec(prefix + n, s.type) for n, s in specs.items()],
            values,
            field_id(freshness_field_name("odd_events" if prefix else "odd_dated")),
            as_of,
            untouched,
        )

    want = {}
    for c in (1, 2, 3):
        hashed = wide_hash(events[c], "e_", epoch_seconds(events[c][3]), subsecond("odd_events", events[c][3]))
        if c in dated:
            hashed |= wide_hash(dated[c], "", as_of_epoch(D2))
        want[f"c:{c}".encode()] = hashed
    rating = FeatureSpec("rating", "float")
    fresh = field_id(freshness_field_name("odd_long"))
    for store, value in (("s.1", 4.5), ("s 2", 3.0)):
        want[f"s:{store}".encode()] = expected_hash([rating], {"rating": value}, fresh, as_of_epoch(D2))
    assert stored == want

    # rows of unusable keys kept aside whole, under their columns' names
    kept = spark.read.format("delta").load(by_source["odd_dated"].quarantine_table).where("source = 'odd_dated'").collect()
    assert [tuple(r["reasons"]) for r in kept] == [("null key consumer.id",)]
    row = json.loads(kept[0]["row"])
    assert sorted(row) == sorted([*ODD_KEYS[1:], *(c for _, c in WIDE_COLUMNS.values()), *UNREAD])  # a null key: no field
    assert [row[c] for _, c in WIDE_COLUMNS.values()] + [row[c] for c in UNREAD] == [*ODD_ROWS[4][5:], *UNREAD.values()]
    assert by_source["odd_long"].bad_reasons == {"key store id` contains ':'": 1}

    # a backfill's plan finds the dates by the date column; cleanup finds the keys written
    plan = plan_backfill(spark, conf, defs, Ledger.of(spark, conf), "odd_dated", D1, D3, "latest", True)
    assert (plan.dates_with_data, plan.no_rows) == ([D1, D2], [D3])
    where = json.loads(json.dumps(keys_from(conf, defs.source("odd_dated"), defs.entity("consumer"))))
    write = RedisWrite("r1", "odd_dated", frozenset({"trips"}), where, (D2,), D2, D2)
    keys, problem = table_keys(spark, conf, defs.entity("consumer"), where, [write])
    assert problem is None and {r[ENTITY_ID] for r in keys.collect()} == {"1", "2"}

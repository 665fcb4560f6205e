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

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feature_defs import DEFAULT_DIR, load_definitions
from fm_config import CatalogConf, ConfigError, SparkConf, load_config
from jobs.cli import main
from jobs.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from jobs.operations.backfill import plan_backfill
from jobs.operations.cleanup import table_keys
from jobs.operations.doctor import check_source
from jobs.operations.ledger import Ledger, RedisWrite, keys_from
from jobs.pipeline.read import partition_rows
from jobs.pipeline.run import run_source
from jobs.pipeline.source_table import dated, open_source
from jobs.source_errors import CatalogNotConfigured, SchemaDriftError, SourceNotFound, SourceUnreadable
from jobs.spark import catalog_settings
from jobs.transforms import ENTITY_ID
from serializers import field_id, freshness_field_name
from serializers.keys import as_of_epoch

from .conftest import env_conf
from .expected import expected_hash

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
    return sql_conf.model_copy(update={"sinks": ["redis", "cockroach"], "spark": SparkConf(catalog=catalog), "quality": quality})


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
    stored = {key: redis_db.hgetall(key) for key in redis_db.scan_iter()}
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

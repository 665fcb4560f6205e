"""Pushes appended to a source's offline table without Spark (feature_push/offline.py): a Delta
table through delta-rs, a folder of Parquet files by one renamed file; every value cast to the
table's own types, the whole push refused when one is bad; the targets it cannot append to
refused with 501. One test (marked spark) has Spark write the table and read the append back."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from feature_defs import SourceDef
from feature_push.errors import PushError
from feature_push.offline import append_offline
from fm_config import RunConf

UTC = dt.UTC

# Feast's driver_stats example, with an event time that is an instant and a created time that is not
SCHEMA = pa.schema(
    [
        pa.field("driver_id", pa.int64(), nullable=False),
        pa.field("event_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("created", pa.timestamp("us")),
        pa.field("conv_rate", pa.float32()),
        pa.field("acc_rate", pa.float64()),
        pa.field("avg_daily_trips", pa.int64()),
    ]
)
FIRST = {
    "driver_id": [1001],
    "event_timestamp": [dt.datetime(2026, 11, 27, 10, tzinfo=UTC)],
    "created": [dt.datetime(2026, 11, 27, 10, 5)],
    "conv_rate": [0.5],
    "acc_rate": [0.25],
    "avg_daily_trips": [10],
}
PUSH = {
    "driver_id": [1001, 1002, 1003],
    "event_timestamp": ["2026-11-28T10:00:00", "2026-11-28 10:00:00.123456", "2026-11-28T12:30:00+02:00"],
    "created": ["2026-11-28T10:01:00Z", 1795860000.25, None],
    "conv_rate": [0.75, 1, 0.125],
    "acc_rate": [0.5, None, 0.875],
    "avg_daily_trips": [12, 7.0, 0],
}
PUSHED_ROWS = [
    (1001, dt.datetime(2026, 11, 28, 10, tzinfo=UTC), dt.datetime(2026, 11, 28, 10, 1), 0.75, 0.5, 12),
    (1002, dt.datetime(2026, 11, 28, 10, 0, 0, 123456, tzinfo=UTC), dt.datetime(2026, 11, 28, 10, 0, 0, 250000), 1.0, None, 7),
    (1003, dt.datetime(2026, 11, 28, 10, 30, tzinfo=UTC), None, 0.125, 0.875, 0),
]
FIRST_ROW = (1001, dt.datetime(2026, 11, 27, 10, tzinfo=UTC), dt.datetime(2026, 11, 27, 10, 5), 0.5, 0.25, 10)


def driver_stats(location: str | None = "driver_stats", **more) -> SourceDef:
    where = {"location": location} if location else {}
    return SourceDef.model_validate(
        {
            "name": "driver_hourly_stats",
            "entity": "driver",
            **where,
            "layout": "wide",
            "select_by": "event_time",
            "timestamp_column": "event_timestamp",
            "created_column": "created",
            "key_columns": ["driver_id"],
            "push_source": "driver_stats_push",
            "features": [
                {"name": "conv_rate", "type": "float", "precision": "float32"},
                {"name": "acc_rate", "type": "float"},
                {"name": "avg_daily_trips", "type": "int"},
            ],
            **more,
        }
    )


def rows_of(table: pa.Table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=lambda r: (r[1], r[0]))


@pytest.fixture
def conf(tmp_path) -> RunConf:
    return RunConf(data_root=str(tmp_path))


@pytest.fixture
def delta_table(tmp_path) -> Path:
    path = tmp_path / "driver_stats"
    write_deltalake(path, pa.table(FIRST, schema=SCHEMA))
    return path


# -- Delta -------------------------------------------------------------------------------


def test_a_push_is_one_commit_of_the_rows_in_the_tables_types(conf, delta_table):
    assert append_offline(conf, driver_stats(), PUSH) == 3
    table = DeltaTable(delta_table)
    assert table.version() == 1
    read = table.to_pyarrow_table()
    assert read.schema == SCHEMA  # no schema change: the pushed ints and texts took the table's types
    assert rows_of(read) == [FIRST_ROW, *PUSHED_ROWS]


def test_an_absolute_location_and_an_empty_push(conf, delta_table):
    source = driver_stats(str(delta_table))
    assert append_offline(conf, source, {c: [] for c in SCHEMA.names}) == 0
    assert DeltaTable(delta_table).version() == 0  # no empty commit
    assert append_offline(conf, source, {c: v[:1] for c, v in PUSH.items()}) == 1
    assert DeltaTable(delta_table).version() == 1


@pytest.mark.parametrize(
    "column, row, value, says",
    [
        ("conv_rate", 1, "abc", "row 1, column conv_rate: expected a number, found 'abc'"),
        ("avg_daily_trips", 2, 3.5, "row 2, column avg_daily_trips: expected an integer, found 3.5"),
        ("acc_rate", 0, True, "row 0, column acc_rate: expected a number, found True"),
        ("conv_rate", 2, 1e39, "row 2, column conv_rate: 1e+39 is out of the range of float32"),
        ("driver_id", 1, None, "row 1, column driver_id: no value, and the table's column takes no nulls"),
        ("driver_id", 1, 2**63, "row 1, column driver_id: 9223372036854775808 is out of the range of int64"),
        ("event_timestamp", 2, None, "row 2, column event_timestamp: no value: every pushed row needs its event time"),
        ("event_timestamp", 1, "yesterday", "row 1, column event_timestamp: expected an ISO-8601 time"),
        ("created", 0, 1e20, "row 0, column created: 1e+20 is out of the range of epoch seconds"),
    ],
)
def test_one_bad_value_refuses_the_whole_push(conf, delta_table, column, row, value, says):
    df = {c: list(v) for c, v in PUSH.items()}
    df[column][row] = value
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(), df)
    assert (refused.value.status, refused.value.kind) == (400, "BadPush")
    assert str(refused.value).startswith(says)
    assert DeltaTable(delta_table).version() == 0  # nothing appended
    assert rows_of(DeltaTable(delta_table).to_pyarrow_table()) == [FIRST_ROW]


def test_the_first_bad_row_is_named_whichever_column_holds_it(conf, delta_table):
    df = {c: list(v) for c, v in PUSH.items()}
    df["avg_daily_trips"][2] = "many"
    df["acc_rate"][1] = "some"
    with pytest.raises(PushError, match=r"^row 1, column acc_rate: expected a number, found 'some'$"):
        append_offline(conf, driver_stats(), df)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda df: df.pop("acc_rate"), "the push lacks the table's column acc_rate (a push has exactly the table's columns: driver_id, "),
        (lambda df: df.update(trips=[1, 2, 3]), "the push has column the table does not: trips ("),
        (
            lambda df: (df.pop("created"), df.update(created_at=[None] * 3)),
            "the push lacks the table's column created and has column the table does not: created_at (",
        ),
        (lambda df: df["conv_rate"].pop(), "column conv_rate has 2 values and column driver_id 3: every column needs one value a row"),
        (lambda df: df.update(conv_rate=0.5), "column conv_rate: expected a list of values (one a row), found 0.5"),
    ],
)
def test_the_push_has_exactly_the_tables_columns(conf, delta_table, change, says):
    df = {c: list(v) for c, v in PUSH.items()}
    change(df)
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(), df)
    assert (refused.value.status, refused.value.kind) == (400, "BadPush")
    assert str(refused.value).startswith(says)
    assert DeltaTable(delta_table).version() == 0


def test_writer_features_delta_rs_cannot_write_are_a_501(conf, delta_table):
    # as Spark leaves a table with an identity column: a writer feature delta-rs 1.6 refuses
    log = delta_table / "_delta_log" / "00000000000000000000.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    for action in actions:
        if "protocol" in action:
            action["protocol"] = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["timestampNtz"],
                                  "writerFeatures": ["timestampNtz", "identityColumns"]}  # fmt: skip
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(), PUSH)
    assert (refused.value.status, refused.value.kind) == (501, "OfflineUnsupported")
    message = str(refused.value)
    assert message.startswith(f"the Delta table at {delta_table} uses writer features delta-rs 1.6.6 cannot write (")
    assert "IdentityColumns" in message and message.endswith("push to: online, or write it with Spark")
    assert "\n" not in message
    assert DeltaTable(delta_table).version() == 0


def test_a_partitioned_delta_table_takes_the_push_in_its_partitions(conf, tmp_path):
    path = tmp_path / "by_day"
    schema = pa.schema([("driver_id", pa.int64()), ("event_timestamp", pa.timestamp("us", tz="UTC")), ("day", pa.date32())])
    write_deltalake(path, pa.table({"driver_id": [], "event_timestamp": [], "day": []}, schema=schema), partition_by=["day"])
    pushed = {"driver_id": [7], "event_timestamp": ["2026-11-28T23:00:00Z"], "day": ["2026-11-28"]}
    assert append_offline(conf, driver_stats("by_day"), pushed) == 1
    assert (path / "day=2026-11-28").is_dir()
    assert DeltaTable(path).to_pyarrow_table().to_pylist() == [
        {"driver_id": 7, "event_timestamp": dt.datetime(2026, 11, 28, 23, tzinfo=UTC), "day": dt.date(2026, 11, 28)}
    ]


def test_a_schema_changed_meanwhile_fails_the_commit(conf, delta_table, monkeypatch):
    import deltalake

    real = deltalake.write_deltalake

    def etl_first(table, data, **options):  # the ETL adds a column between the push's read of the schema and its commit
        widened = pa.table({**FIRST, "new": ["x"]}, schema=SCHEMA.append(pa.field("new", pa.string())))
        real(delta_table, widened, mode="append", schema_mode="merge")
        return real(table, data, **options)

    monkeypatch.setattr(deltalake, "write_deltalake", etl_first)
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(), PUSH)
    assert (refused.value.status, refused.value.kind, refused.value.transient) == (503, "OfflineConflict", True)
    cause = "Failed to commit transaction: Metadata changed since last commit."
    assert str(refused.value) == f"the append to {delta_table} was not committed: {cause}"
    assert DeltaTable(delta_table).version() == 1  # the ETL's commit only


def test_no_table_is_created_where_there_is_none(conf, tmp_path):
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(), PUSH)
    assert (refused.value.status, refused.value.kind) == (500, "OfflineTableMissing")
    assert str(refused.value) == f"no Delta table at {tmp_path / 'driver_stats'} to append to (a push never creates one)"
    assert not (tmp_path / "driver_stats").exists()


# -- Parquet -----------------------------------------------------------------------------


def test_a_parquet_folder_takes_one_new_file(conf, tmp_path):
    folder = tmp_path / "driver_stats"
    folder.mkdir()
    pq.write_table(pa.table(FIRST, schema=SCHEMA), folder / "part-00000.parquet")
    (folder / "_SUCCESS").touch()
    assert append_offline(conf, driver_stats(format="parquet"), PUSH) == 3
    [new] = [p.name for p in folder.iterdir() if p.name not in ("part-00000.parquet", "_SUCCESS")]
    assert new.startswith("part-") and new.endswith(".parquet")  # the temp file was renamed: none left
    read = pq.read_table(folder)
    assert read.schema.remove_metadata() == SCHEMA
    assert rows_of(read) == [FIRST_ROW, *PUSHED_ROWS]
    assert rows_of(pq.read_table(folder / new)) == PUSHED_ROWS


def test_a_folder_spark_wrote_in_int96_gets_int96(conf, tmp_path):
    folder = tmp_path / "driver_stats"
    folder.mkdir()
    pq.write_table(pa.table(FIRST, schema=SCHEMA), folder / "part-00000.parquet", use_deprecated_int96_timestamps=True)
    assert append_offline(conf, driver_stats(format="parquet"), PUSH) == 3
    [new] = [p for p in folder.iterdir() if p.name != "part-00000.parquet"]
    footer = pq.ParquetFile(new).schema
    assert [footer.column(i).physical_type for i in (1, 2)] == ["INT96", "INT96"]
    assert rows_of(pq.read_table(new).cast(SCHEMA)) == PUSHED_ROWS


def test_a_bad_value_leaves_a_parquet_folder_as_it_was(conf, tmp_path):
    folder = tmp_path / "driver_stats"
    folder.mkdir()
    pq.write_table(pa.table(FIRST, schema=SCHEMA), folder / "part-00000.parquet")
    df = {c: list(v) for c, v in PUSH.items()}
    df["conv_rate"][1] = "abc"
    with pytest.raises(PushError, match=r"^row 1, column conv_rate: expected a number, found 'abc'$"):
        append_offline(conf, driver_stats(format="parquet"), df)
    assert [p.name for p in folder.iterdir()] == ["part-00000.parquet"]


def test_a_parquet_folder_whose_newest_file_is_not_parquet_is_a_409_naming_it(conf, tmp_path):
    folder = tmp_path / "driver_stats"
    folder.mkdir()
    pq.write_table(pa.table(FIRST, schema=SCHEMA), folder / "part-00000.parquet")
    (folder / "part-00001.parquet").write_bytes(b"not parquet at all")  # newer: its schema would be the table's
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(format="parquet"), PUSH)
    assert (refused.value.status, refused.value.kind) == (409, "OfflineTableBroken")
    assert f"the newest file of the Parquet folder {folder}, part-00001.parquet, is not Parquet" in str(refused.value)
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]


# -- what a push cannot append to ------------------------------------------------------------


def test_targets_without_an_append_are_a_501(conf, tmp_path):
    def refused(source: SourceDef) -> str:
        with pytest.raises(PushError) as caught:
            append_offline(conf, source, PUSH)
        assert (caught.value.status, caught.value.kind) == (501, "OfflineUnsupported")
        assert "\n" not in str(caught.value)
        return str(caught.value)

    pq.write_table(pa.table(FIRST, schema=SCHEMA), tmp_path / "driver_stats.parquet")
    assert refused(driver_stats("driver_stats.parquet", format="parquet")) == (
        f"the source's location {tmp_path / 'driver_stats.parquet'} is one Parquet file, which cannot be appended to; "
        "a folder of Parquet files (the file moved into one) or a Delta table works"
    )
    (tmp_path / "by_day" / "ds=2026-11-28").mkdir(parents=True)
    pq.write_table(pa.table(FIRST, schema=SCHEMA), tmp_path / "by_day" / "ds=2026-11-28" / "part-0.parquet")
    assert refused(driver_stats("by_day", format="parquet")) == (
        f"the Parquet folder {tmp_path / 'by_day'} is partitioned (ds=2026-11-28/...): a push does not write partition folders; "
        "an unpartitioned folder or a Delta table (partitioned or not) works"
    )
    assert refused(driver_stats("s3a://lake/driver_stats", format="parquet")).startswith(
        "the Parquet folder s3a://lake/driver_stats is not on a local disk: "
    )
    assert refused(driver_stats(None, table="feast.driver_stats")) == (
        "source 'driver_hourly_stats' reads the catalog table feast.driver_stats: appending to it needs Spark (the catalog knows "
        "its location and format); push to: online, or give the source a 'location' (a Delta table or a folder of Parquet files)"
    )


# -- Spark reads what delta-rs committed ---------------------------------------------------


@pytest.mark.spark
def test_spark_reads_a_push_to_the_delta_table_it_wrote(spark, tmp_path):
    from pyspark.sql import functions as F

    path = tmp_path / "driver_stats"
    first = spark.createDataFrame(
        [(1001, dt.datetime(2026, 11, 27, 10, tzinfo=UTC), 0.5, 10)],
        "driver_id bigint, event_timestamp timestamp, conv_rate float, avg_daily_trips bigint",
    )
    first.write.format("delta").save(str(path))
    protocol = DeltaTable(path).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)  # delta-spark 4.4's default; delta-rs writes it
    source = SourceDef.model_validate(
        {
            "name": "driver_hourly_stats",
            "entity": "driver",
            "location": "driver_stats",
            "layout": "wide",
            "select_by": "event_time",
            "timestamp_column": "event_timestamp",
            "key_columns": ["driver_id"],
            "features": [{"name": "conv_rate", "type": "float", "precision": "float32"}, {"name": "avg_daily_trips", "type": "int"}],
        }
    )
    pushed = {"driver_id": [1002, 1003], "event_timestamp": ["2026-11-28T10:00:00Z", 1795867200], "conv_rate": [0.75, 0.125],
              "avg_daily_trips": [7, 0]}  # fmt: skip
    assert append_offline(RunConf(data_root=str(tmp_path)), source, pushed) == 2
    read = spark.read.format("delta").load(str(path))
    assert read.dtypes == [("driver_id", "bigint"), ("event_timestamp", "timestamp"), ("conv_rate", "float"), ("avg_daily_trips", "bigint")]
    got = read.select("driver_id", F.unix_micros("event_timestamp"), "conv_rate", "avg_daily_trips").orderBy("driver_id").collect()
    assert [tuple(r) for r in got] == [
        (1001, 1795773600_000000, 0.5, 10),
        (1002, 1795860000_000000, 0.75, 7),
        (1003, 1795867200_000000, 0.125, 0),
    ]
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").select("version").collect()[-1][0] == 1


def test_a_folder_the_tie_check_cannot_read_is_a_409_not_a_500(conf, tmp_path):
    import os

    folder = tmp_path / "driver_stats"
    folder.mkdir()
    (folder / "part-00000.parquet").write_bytes(b"PAR1 truncated")  # an older file, cut short
    os.utime(folder / "part-00000.parquet", (1, 1))
    pq.write_table(pa.table(FIRST, schema=SCHEMA), folder / "part-00001.parquet")  # the newest: its schema reads
    with pytest.raises(PushError) as refused:
        append_offline(conf, driver_stats(format="parquet"), PUSH, keys=["driver_id"])
    assert (refused.value.status, refused.value.kind) == (409, "OfflineTableBroken"), refused.value
    assert f"the table at {folder} cannot be read to look for ties" in str(refused.value)
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]

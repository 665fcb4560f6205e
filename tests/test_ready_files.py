"""`materialize ready` from the table's files, without Spark (jobs/pipeline/ready_files.py):
Delta tables written by delta-rs and Parquet folders by pyarrow, each with rows on known days
only, asked for those days and their neighbours; the command run with Spark made unreachable;
and, with Spark, the same answers as the run's own filter (partition_rows) on every table.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feature_defs import load_definitions
from fm_config import RunConf
from jobs.cli import main
from jobs.pipeline.ready_files import has_rows

from .support.confs import env_conf

D1, D2 = dt.date(2026, 11, 19), dt.date(2026, 11, 20)
ASKED = [D1 - dt.timedelta(days=1), D1, D2, D2 + dt.timedelta(days=1)]
UTC = dt.UTC

ENTITIES = """\
entities:
  - {name: consumer, prefix: c, sql_table: consumer_features, keys: [{name: consumer_id, type: int}]}
"""


def wide(name: str, location: str, fmt: str, when: str) -> str:
    return f"""\
source:
  name: {name}
  entity: consumer
  location: {location}
  format: {fmt}
  layout: wide
  {when}
  features:
    - {{name: orders, type: int, stored_as: orders_{name}}}  # one entity type: a stored name each
"""


def long(name: str, location: str) -> str:
    # the feature's rows are named by its column (`column:`), not by its name
    return f"""\
source:
  name: {name}
  entity: consumer
  location: {location}
  format: delta
  layout: long
  date_column: ds
  name_column: feature_name
  value_column: value
  features:
    - {{name: orders, type: int, column: order_count, stored_as: orders_{name}}}  # one entity type: a stored name each
"""


def write_delta(path: Path, table: pa.Table, partition_by: list[str] | None = None) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), table, partition_by=partition_by)


def at(day: dt.date, hour: int) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(hour), tzinfo=UTC)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> tuple[RunConf, object, dict[str, set[dt.date]]]:
    """Every table with the days it has rows on; the conf and definitions that read them."""
    root = tmp_path_factory.mktemp("ready")
    data, defs = root / "data", root / "defs"
    defs.mkdir()
    (defs / "entities.yaml").write_text(ENTITIES)
    days: dict[str, set[dt.date]] = {}

    def define(name: str, text: str, on: set[dt.date]) -> None:
        (defs / f"{name}.yaml").write_text(text)
        days[name] = on

    ids = pa.array([1, 2], pa.int64())
    # Delta, partitioned by a text ds (as the sample data), rows on D1 only
    write_delta(data / "text_ds", pa.table({"consumer_id": ids, "orders": ids, "ds": ["2026-11-19"] * 2}), ["ds"])
    define("text_ds", wide("text_ds", "text_ds", "delta", "date_column: ds"), {D1})
    # Delta, a date column not partitioned by, rows on D2
    write_delta(data / "date_ds", pa.table({"consumer_id": ids, "orders": ids, "ds": pa.array([D2, D2], pa.date32())}))
    define("date_ds", wide("date_ds", "date_ds", "delta", "date_column: ds"), {D2})
    # long layout: D1 has rows of an undefined name only, D2 of a defined one
    rows = {"consumer_id": [1, 1], "feature_name": ["orders", "order_count"], "value": ["1", "2"], "ds": ["2026-11-19", "2026-11-20"]}
    write_delta(data / "long", pa.table(rows), ["ds"])
    define("long_source", long("long_source", "long"), {D2})
    # event times with a zone, in nanoseconds: the last instant of D1 and none of D2 (D2's midnight excluded from D1)
    stamps = pa.array([at(D1, 0), at(D2, 0) - dt.timedelta(microseconds=1)], pa.timestamp("ns", tz="UTC"))
    write_delta(data / "events_tz", pa.table({"consumer_id": ids, "orders": ids, "ts": stamps}))
    define("events_tz", wide("events_tz", "events_tz", "delta", "select_by: event_time\n  timestamp_column: ts"), {D1})
    # Parquet, times without a zone (UTC), in a hive-partitioned folder of two files
    for part, when in (("a", at(D2, 23)), ("b", at(D2, 1))):
        folder = data / "events_ntz" / f"part={part}"
        folder.mkdir(parents=True)
        naive = pa.array([when.replace(tzinfo=None)], pa.timestamp("us"))
        pq.write_table(pa.table({"consumer_id": [1], "orders": [1], "ts": naive}), folder / "f.parquet")
    define("events_ntz", wide("events_ntz", "events_ntz", "parquet", "select_by: event_time\n  timestamp_column: ts"), {D2})
    # Parquet, one file, an event date
    (data / "event_dates").mkdir()
    pq.write_table(pa.table({"consumer_id": [1], "orders": [1], "day": pa.array([D1], pa.date32())}), data / "event_dates" / "x.parquet")
    define("event_dates", wide("event_dates", "event_dates", "parquet", "select_by: event_time\n  timestamp_column: day"), {D1})
    # the location a single file; times in milliseconds in another zone: 2026-11-20 01:00 in Los Angeles is D2 09:00 UTC,
    # and 2026-11-19 20:00 there is D2 04:00 UTC: D2 only, whatever the local dates
    la = pa.array([at(D2, 9), at(D2, 4)], pa.timestamp("ms", tz="America/Los_Angeles"))
    pq.write_table(pa.table({"consumer_id": [1, 2], "orders": [1, 2], "ts": la}), data / "one_file.parquet")
    define("one_file", wide("one_file", "one_file.parquet", "parquet", "select_by: event_time\n  timestamp_column: ts"), {D2})
    # no table yet
    define("not_yet", wide("not_yet", "not_yet", "delta", "date_column: ds"), set())
    conf = RunConf(env="test", data_root=str(data), definitions_dir=str(defs), sinks=["redis"])
    return conf, load_definitions(defs), days


def test_each_table_has_rows_on_its_days_only(tables):
    conf, defs, days = tables
    found = {name: {d for d in ASKED if has_rows(conf, defs.source(name), d)} for name in days}
    assert found == days


def test_what_it_cannot_answer_as_spark_would_is_left_to_spark(tables, tmp_path):
    conf, defs, _ = tables
    remote = defs.source("text_ds").model_copy(update={"location": "s3a://lake/text_ds"})
    assert has_rows(conf, remote, D1) is None  # behind a URI
    # a date column of another type than a date or its text: Spark's read says what is wrong
    write_delta(tmp_path / "int_ds", pa.table({"consumer_id": [1], "orders": [1], "ds": [20261119]}))
    odd = defs.source("text_ds").model_copy(update={"location": str(tmp_path / "int_ds")})
    assert has_rows(conf, odd, D1) is None
    # files of one folder that disagree on the date column's type: Spark reads each in its own, or refuses the folder
    for n, value in enumerate(["2026-11-19", D1]):
        folder = tmp_path / "mixed" / f"part={n}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"consumer_id": [1], "orders": [1], "ds": [value]}), folder / "f.parquet")
    mixed = defs.source("text_ds").model_copy(update={"location": str(tmp_path / "mixed"), "format": "parquet"})
    assert has_rows(conf, mixed, D1) is None
    # a file that is not Parquet in a Parquet folder: read by Spark, which names it
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.parquet").write_bytes(b"not parquet")
    broken = defs.source("event_dates").model_copy(update={"location": str(tmp_path / "broken")})
    assert has_rows(conf, broken, D1) is None


def test_the_command_answers_without_starting_spark(tables, tmp_path, monkeypatch, capsys):
    conf, _, _ = tables
    import jobs.spark

    def no_spark(*args, **kwargs):
        raise AssertionError("ready started Spark")

    monkeypatch.setattr(jobs.spark, "build_spark", no_spark)
    folder = env_conf(tmp_path / "conf", "files", f"data_root: {conf.data_root}\ndefinitions_dir: {conf.definitions_dir}\nsinks: [redis]\n")
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    ready = ["ready", "--env", "files", "--source"]
    assert main([*ready, "long_source", "--date", str(D2)]) == 0
    assert capsys.readouterr().out == f"long_source has rows for {D2}\n"
    assert main([*ready, "long_source", "--date", str(D1)]) == 3  # rows of an undefined name only
    assert capsys.readouterr().out == f"long_source has no rows for {D1} yet\n"
    assert main([*ready, "not_yet", "--date", str(D1)]) == 3


def test_spark_answers_the_same_on_every_table(tables, spark):
    from jobs.pipeline.read import partition_rows

    conf, defs, days = tables
    for name in days:
        source = defs.source(name)
        assert {d for d in ASKED if partition_rows(spark, conf, source, d)} == days[name], name


def test_a_delta_table_with_column_mapping_is_left_to_spark(tables, spark, tmp_path):
    # its files name the columns by physical names, which delta-rs 1.6 would read as nulls: a "no rows" for ever
    from jobs.pipeline.read import partition_rows

    conf, defs, _ = tables
    path = tmp_path / "mapped"
    frame = spark.createDataFrame([(1, 1, "2026-11-19")], "consumer_id long, orders long, ds string")
    frame.write.format("delta").option("delta.columnMapping.mode", "name").save(str(path))
    mapped = defs.source("text_ds").model_copy(update={"location": str(path)})
    assert has_rows(conf, mapped, D1) is None
    assert partition_rows(spark, conf, mapped, D1) == 1

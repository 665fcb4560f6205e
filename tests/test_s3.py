"""Tables, quarantine, ledger and reports on a real S3 API: an S3-compatible server (moto's
server mode) on loopback, reached by Spark's S3A connector (jars/s3a, scripts/s3a/pom.xml)
and by the driver's own file I/O. The session's sample tables are copied to the bucket; then
the CLI runs as a scheduler would: a nightly run, a backfill resumed from the ledger, the
runs list, the report and the deployment check, all on s3a:// only.
Credentials come from the environment and appear nowhere in output, reports or event log."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys

import pytest
from pyarrow import fs

from throwaway.servers import start_s3

from .support.cli import ROOT
from .support.confs import env_conf
from .support.consumer_job import DAY2, check_consumer_hashes, expected_consumers
from .support.samples import DAY2_STR, SAMPLE_DATES

DAY1_STR = SAMPLE_DATES[0].isoformat()


@pytest.fixture
def s3(tmp_path):
    server = start_s3(tmp_path / "moto.log")
    server.create_bucket("lake")
    yield server
    server.stop()


def test_nightly_run_and_resumed_backfill_on_s3(spark, sample_root, s3, redis_db, redis_server, tmp_path):
    secret = "s3-" + secrets.token_hex(16)
    events = tmp_path / "events"
    events.mkdir()
    settings = f"""
data_root: s3a://lake/etl
reports_dir: s3a://lake/reports
storage:
  s3_endpoint: {s3.endpoint}
  s3_region: us-east-1
sinks: [redis]
redis:
  url: {redis_server.url}
  pipeline_entities: 64
  sample_entities: 50
quality:
  verify_sample: 50
  data_docs: false
spark:
  master: local[2]
  shuffle_partitions: 2
  extra:
    spark.hadoop.fs.s3a.endpoint: {s3.endpoint}
    spark.hadoop.fs.s3a.endpoint.region: us-east-1
    spark.hadoop.fs.s3a.path.style.access: "true"
    spark.hadoop.fs.s3a.connection.ssl.enabled: "false"
    spark.eventLog.enabled: "true"
    spark.eventLog.dir: {events.as_uri()}
    spark.eventLog.compress: "false"
"""
    folder = env_conf(tmp_path / "conf", "s3", settings)
    common = ["--env", "s3"]
    s3fs = fs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{s3.port}", scheme="http", access_key="fm-test", secret_key=secret, region="us-east-1"
    )
    for table in ("consumer_daily", "store_features_long"):  # the session's sample tables, as an ETL job would have put them
        fs.copy_files(str(sample_root / table), f"lake/etl/{table}", destination_filesystem=s3fs)
    commands = [
        ["run", *common, "--date", DAY2_STR, "--source", "consumer_daily"],
        ["backfill", *common, "--source", "consumer_daily", "--start", DAY1_STR, "--end", DAY2_STR, "--mode", "replay"],
        ["runs", *common, "--source", "consumer_daily"],
        ["report", *common, "--source", "consumer_daily", "--date", DAY2_STR],
        ["doctor", *common],
    ]
    env = {"FM_CONF_DIR": str(folder), "AWS_ACCESS_KEY_ID": "fm-test", "AWS_SECRET_ACCESS_KEY": secret, "PATH": "/usr/bin:/bin"}
    env |= {k: v for k, v in __import__("os").environ.items() if k.startswith(("SPARK_", "JAVA_", "PYSPARK_")) or k == "HOME"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.cli_sequence", json.dumps(commands)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )
    exits = [line for line in out.stdout.splitlines() if line.startswith("[exit ")]
    print("\n".join(line for line in out.stderr.splitlines() if line.startswith("[took")))
    assert exits == [f"[exit 0] {' '.join(c)}" for c in commands], out.stdout[-3000:] + out.stderr[-3000:]

    # the nightly run wrote exactly what the local copy of the same tables says
    expected = expected_consumers(spark, sample_root, DAY2)
    assert check_consumer_hashes(redis_db, expected, DAY2) > 0
    # and the backfill added the consumers only the first date has (the others hold the newer date)
    day1 = set(expected_consumers(spark, sample_root, SAMPLE_DATES[0]))
    assert {k.decode() for k in redis_db.keys("c:*")} == {f"c:{i}" for i in set(expected) | day1} and not day1 <= set(expected)
    # the summary line says where the report is; the report command read it back from S3
    assert f"report: s3a://lake/reports/consumer_daily/{DAY2_STR}/summary.json" in out.stdout
    # the backfill resumed from the ledger: the nightly run's date was not written again
    backfill = out.stdout.split("[exit 0] run ")[1].split("[exit 0] backfill")[0]
    assert DAY2_STR in backfill and "already written" in backfill, backfill

    # the deployment check reads the tables' Delta logs on S3 and warns about the ledger's log store
    doctor = out.stdout.split("[exit 0] report")[1]
    assert re.search(
        r"OK +source consumer_daily +s3a://lake/etl/consumer_daily: Delta table, version \d+, columns match the definition", doctor
    ), doctor
    assert "OK    ledger                       s3a://lake/etl/_ledger: Delta table found" in doctor
    assert "WARN  ledger log store" in doctor and "S3DynamoDBLogStore" in doctor

    objects = {i.path: i for i in s3fs.get_file_info(fs.FileSelector("lake", recursive=True)) if i.type == fs.FileType.File}
    for prefix in ("lake/etl/consumer_daily/_delta_log/", "lake/etl/_ledger/_delta_log/", "lake/etl/_ledger_leases/_delta_log/",
                   "lake/etl/_quarantine/consumer_daily/", f"lake/reports/consumer_daily/{DAY2_STR}/",
                   f"lake/reports/consumer_daily/{DAY1_STR}/"):  # fmt: skip
        assert any(p.startswith(prefix) for p in objects), f"nothing under s3://{prefix}"
    summary = json.loads(s3fs.open_input_stream(f"lake/reports/consumer_daily/{DAY2_STR}/summary.json").read())
    assert summary["status"] == "succeeded" and summary["bad_rows"] > 0 and summary["entities"] == len(expected)
    assert summary["quarantine_table"] == "s3a://lake/etl/_quarantine/consumer_daily"

    # the secret key is nowhere: output, report objects, event log
    texts = {"stdout": out.stdout, "stderr": out.stderr}
    texts |= {p: s3fs.open_input_stream(p).read().decode("utf-8", "replace") for p in objects if p.startswith("lake/reports/")}
    texts |= {str(p): p.read_text("utf-8", "replace") for p in events.rglob("*") if p.is_file()}
    assert any("SparkListenerJobEnd" in t for t in texts.values())
    assert [name for name, text in texts.items() if secret in text] == []

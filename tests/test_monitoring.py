"""Monitoring (conf/base/monitoring/): the alert rules checked and unit-tested by Debian's
promtool, the dashboard's queries valid PromQL over series the product exposes, and a run's
series pushed to a real Pushgateway or written for node_exporter's textfile collector."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from feature_defs import load_definitions
from feature_reader import AsyncFeatureReader
from feature_reader.server import FeatureServer
from fm_config import RunConf
from fm_config.redis import RedisSettings
from jobs.pipeline.report.summary import RunSummary
from jobs.run_metrics import HELP, LAST_SUCCESS, interval_seconds, report_run
from throwaway.servers import start_pushgateway

from .expected import entity_count
from .support.asgi import asgi_call
from .support.confs import env_conf
from .support.samples import SAMPLE_DATES

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "conf" / "base" / "monitoring"
PROMTOOL = shutil.which("promtool")
DAY2 = SAMPLE_DATES[1]


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    assert PROMTOOL, "promtool is not installed: run `bash scripts/setup.sh --test` (make test does)"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0 and "SUCCESS: 12 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    # every alert has a test that expects it to fire
    rules = {r["alert"] for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    fired = {
        t["alertname"]
        for case in yaml.safe_load((MONITORING / "alerts_test.yml").read_text())["tests"]
        for t in case["alert_rule_test"]
        if t["exp_alerts"]
    }
    assert fired == rules


def _queries() -> list[str]:
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def _names(expr: str) -> set[str]:
    """The series names a query reads (fm_*, feature_server_*, feature_reader_*)."""
    return set(re.findall(r"\b((?:fm|feature_server|feature_reader)_[a-z_]+)\b", expr))


def test_the_dashboard_queries_are_valid_promql(tmp_path):
    queries = _queries()
    assert len(queries) >= 15
    # promtool parses expressions in rule files: each query as a recording rule
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)]}]}
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", "dashboard_rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _server_series(redis_url: str) -> set[str]:
    """The series names the feature server's /metrics exposes (its own app, in process)."""
    conf = RunConf(sinks=["redis"], redis=RedisSettings(url=redis_url, password_env=None, mode="standalone"))
    app = FeatureServer(AsyncFeatureReader(conf, load_definitions()))
    asgi_call(app, "POST", "/get-online-features", close=False)  # one read first: the latency histogram has a series
    _, body = asgi_call(app, "GET", "/metrics")
    return {s.name for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def test_the_rules_and_the_dashboard_read_only_series_the_product_exposes(redis_server):
    exposed = _server_series(redis_server.url) | set(HELP)
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    read = set().union(*(_names(r["expr"]) for g in rules for r in g["rules"]), *(_names(q) for q in _queries()))
    assert {"feature_server_store_up", "feature_server_ready", "feature_reader_breaker_state", LAST_SUCCESS} <= read
    assert sorted(read - exposed) == []


@pytest.mark.parametrize(
    ("schedule", "seconds"),
    [("nightly", 86400), ("@hourly", 3600), ("*/15 * * * *", 900), ("30 */6 * * *", 6 * 3600), ("0 2 * * 1", 7 * 86400),
     ("5 * * * *", 3600), ("0 3 1 * *", 31 * 86400), ("not a cron", 86400)],
)  # fmt: skip
def test_a_schedules_period(schedule, seconds):
    assert interval_seconds(schedule) == seconds


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(series name, source) -> value, for the fm_* series."""
    return {
        (s.name, s.labels.get("source", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("fm_")
    }


def test_a_failed_run_written_for_the_textfile_collector_keeps_the_last_success(tmp_path):
    defs = load_definitions()
    source = defs.source("consumer_daily")
    conf = RunConf(metrics={"textfile_dir": str(tmp_path / "textfile")}, env="prod")
    summary = RunSummary(source="consumer_daily", entity="consumer", date=str(DAY2), env="prod", as_of=0, status="succeeded")
    summary.rows_read, summary.bad_rows, summary.entities, summary.seconds = 1000, 5, 990, 12.5
    summary.sinks = {"redis": {"memory_after": 600, "capacity": 1000}}
    before = time.time()
    report_run(conf, source, summary, None)
    path = tmp_path / "textfile" / "fm_prod_consumer_daily.prom"
    written = _samples(path.read_text())
    success_at = written[(LAST_SUCCESS, "consumer_daily")]
    assert before <= success_at <= time.time()
    assert {k[0]: v for k, v in written.items() if k[0] != LAST_SUCCESS and k[0] != "fm_run_last_timestamp_seconds"} == {
        "fm_run_success": 1.0, "fm_run_gate_failed": 0.0, "fm_source_expected_interval_seconds": 86400.0,
        "fm_run_duration_seconds": 12.5, "fm_run_rows_read": 1000.0, "fm_run_bad_rows": 5.0, "fm_run_bad_fraction": 0.005,
        "fm_run_entities_written": 990.0, "fm_redis_used_memory_bytes": 600.0, "fm_redis_capacity_bytes": 1000.0,
    }  # fmt: skip
    assert 'job="feature_materializer"' in path.read_text() and 'env="prod"' in path.read_text()

    report_run(conf, source, None, RuntimeError("Redis went away"))  # a failure before any report: the counts unknown
    failed = _samples(path.read_text())
    assert failed[("fm_run_success", "consumer_daily")] == 0.0
    assert failed[(LAST_SUCCESS, "consumer_daily")] == success_at  # as the success left it
    assert ("fm_run_rows_read", "consumer_daily") not in failed
    assert not list((tmp_path / "textfile").glob("*.tmp*"))  # written aside, then renamed


def test_a_pushgateway_that_does_not_answer_never_fails_the_run(capsys):
    conf = RunConf(metrics={"pushgateway_url": "http://127.0.0.1:1", "timeout_seconds": 1})
    report_run(conf, load_definitions().source("consumer_daily"), None, None)
    assert "warning: consumer_daily: the run's metrics were not reported: URLError" in capsys.readouterr().err


@pytest.mark.spark
def test_runs_push_their_outcome_to_a_pushgateway(spark, sample_root, redis_server, redis_db, tmp_path, monkeypatch):
    from jobs.cli import main
    from jobs.exit_codes import EXIT_GATE_FAILED

    gateway = start_pushgateway(tmp_path / "pushgateway.log")
    try:
        settings = (
            f"data_root: {sample_root}\nreports_dir: {tmp_path / 'reports'}\nquarantine_root: {tmp_path / 'q'}\n"
            f"ledger_root: {tmp_path / 'ledger'}\nsinks: [redis]\nredis: {{url: '{redis_server.url}', password_env: null}}\n"
            f"quality: {{expectations: false}}\nmetrics: {{pushgateway_url: '{gateway.url}'}}\n"
        )
        monkeypatch.setenv("FM_CONF_DIR", str(env_conf(tmp_path / "conf", "mon", settings)))
        started = time.time()
        assert main(["run", "--env", "mon", "--date", str(DAY2), "--source", "consumer_daily"]) == 0
        pushed = _samples(gateway.metrics())
        rows = spark.read.format("delta").load(str(sample_root / "consumer_daily")).where(f"ds = '{DAY2}'").count()
        assert pushed[("fm_run_success", "consumer_daily")] == 1.0 and pushed[("fm_run_gate_failed", "consumer_daily")] == 0.0
        assert pushed[("fm_run_rows_read", "consumer_daily")] == rows
        assert pushed[("fm_run_entities_written", "consumer_daily")] == entity_count(redis_db)
        success_at = pushed[(LAST_SUCCESS, "consumer_daily")]
        assert started <= success_at <= time.time()
        assert pushed[("fm_redis_used_memory_bytes", "consumer_daily")] > 0
        assert 'env="mon"' in gateway.metrics() and 'job="feature_materializer"' in gateway.metrics()

        # the next night fails its gate: the failure and the bad share pushed, the last success kept
        conf_file = tmp_path / "conf" / "mon" / "m.yaml"
        strict = "quality: {expectations: false, max_bad_fraction: 0}"
        conf_file.write_text(conf_file.read_text().replace("quality: {expectations: false}", strict))
        assert main(["run", "--env", "mon", "--date", str(DAY2), "--source", "consumer_daily"]) == EXIT_GATE_FAILED
        failed = _samples(gateway.metrics())
        assert failed[("fm_run_success", "consumer_daily")] == 0.0 and failed[("fm_run_gate_failed", "consumer_daily")] == 1.0
        assert failed[(LAST_SUCCESS, "consumer_daily")] == success_at
        bad = failed[("fm_run_bad_rows", "consumer_daily")]
        assert bad > 0 and failed[("fm_run_bad_fraction", "consumer_daily")] == pytest.approx(bad / rows)
    finally:
        gateway.stop()

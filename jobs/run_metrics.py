"""Each source's run, reported to Prometheus the way batch jobs are: pushed to a Pushgateway
or written for node_exporter's textfile collector (``metrics:`` in conf). The alert rules in
conf/base/monitoring/ read these series; their names and meaning are listed there.

A failed run reports its failure and leaves ``fm_run_last_success_timestamp_seconds`` as the
last success set it (the Pushgateway's POST replaces only the series it is given; the text
file keeps the value it held), so "not written for longer than its schedule allows" holds
across failed nights. Reporting never changes a run's outcome: a push that fails is a
warning on stderr.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from feature_defs import SourceDef
from fm_config import RunConf

LAST_SUCCESS = "fm_run_last_success_timestamp_seconds"
PRESETS = {"@hourly": 3600, "@daily": 86400, "@midnight": 86400, "nightly": 86400, "@weekly": 7 * 86400, "@monthly": 31 * 86400}


def interval_seconds(schedule: str) -> int:
    """How often a schedule group runs, roughly: a preset's period, or a cron expression's
    (every N minutes or hours, hourly, daily, weekly on a weekday, monthly on a day); a day otherwise."""
    if schedule in PRESETS:
        return PRESETS[schedule]
    fields = schedule.split()
    if len(fields) != 5:
        return 86400
    minute, hour, day, _month, weekday = fields
    if (step := re.fullmatch(r"\*/(\d+)", minute)) and hour == "*":
        return int(step.group(1)) * 60
    if minute == "*":
        return 60
    if step := re.fullmatch(r"\*/(\d+)", hour):
        return int(step.group(1)) * 3600
    if hour == "*":
        return 3600
    if weekday != "*":
        return 7 * 86400
    return 31 * 86400 if day != "*" else 86400


def run_values(source: SourceDef, summary, error: BaseException | None, ended: float) -> dict[str, float]:
    """The series of one run (name -> value; labels job, env, source come from where they go)."""
    from jobs.pipeline.gate.checks import QualityGateError

    succeeded = error is None and summary is not None and summary.status == "succeeded"
    values = {
        "fm_run_last_timestamp_seconds": ended,
        "fm_run_success": float(succeeded),
        "fm_run_gate_failed": float(isinstance(error, QualityGateError)),
        "fm_source_expected_interval_seconds": float(interval_seconds(source.schedule)),
    }
    if succeeded:
        values[LAST_SUCCESS] = ended
    if summary is not None:
        values |= {
            "fm_run_duration_seconds": summary.seconds,
            "fm_run_rows_read": float(summary.rows_read),
            "fm_run_bad_rows": float(summary.bad_rows),
            "fm_run_bad_fraction": summary.bad_rows / summary.rows_read if summary.rows_read else 0.0,
            "fm_run_entities_written": float(summary.entities if succeeded else 0),
        }
        redis = summary.sinks.get("redis") or {}
        if redis.get("memory_after") and redis.get("capacity"):
            values["fm_redis_used_memory_bytes"] = float(redis["memory_after"])
            values["fm_redis_capacity_bytes"] = float(redis["capacity"])
    return values


HELP = {
    "fm_run_last_timestamp_seconds": "When the source's last run ended (any outcome), Unix seconds",
    LAST_SUCCESS: "When the source's last successful run ended, Unix seconds",
    "fm_run_success": "1 when the source's last run succeeded, 0 when it failed",
    "fm_run_gate_failed": "1 when the source's last run was stopped by the data-quality gate (nothing written)",
    "fm_source_expected_interval_seconds": "How often the source's schedule runs it",
    "fm_run_duration_seconds": "Seconds the source's last run took",
    "fm_run_rows_read": "Rows the source's last run read",
    "fm_run_bad_rows": "Rows the source's last run quarantined",
    "fm_run_bad_fraction": "Quarantined rows over rows read, in the source's last run",
    "fm_run_entities_written": "Entities the source's last successful run wrote",
    "fm_redis_used_memory_bytes": "Redis used_memory after the source's last write (summed over a cluster's primaries)",
    "fm_redis_capacity_bytes": "The capacity the run checked Redis against (maxmemory or redis.capacity_bytes)",
}


def report_run(conf: RunConf, source: SourceDef, summary, error: BaseException | None) -> None:
    """Push or write the run's series where ``conf.metrics`` says; nothing when it says neither."""
    settings = conf.metrics
    if not settings.pushgateway_url and not settings.textfile_dir:
        return
    try:
        values = run_values(source, summary, error, time.time())
        if settings.pushgateway_url:
            _push(settings, conf.env, source.name, values)
        if settings.textfile_dir:
            _write_textfile(Path(settings.textfile_dir), settings.job, conf.env, source.name, values)
    except Exception as exc:  # noqa: BLE001 (reporting never changes the run's outcome)
        print(f"warning: {source.name}: the run's metrics were not reported: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def _registry(values: dict[str, float], labels: dict[str, str]):
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    for name, value in values.items():
        gauge = Gauge(name, HELP[name], list(labels), registry=registry)
        (gauge.labels(**labels) if labels else gauge).set(value)
    return registry


def _push(settings, env: str, source: str, values: dict[str, float]) -> None:
    from prometheus_client import pushadd_to_gateway

    # POST (pushadd): the group's other series stay, the last success among them
    pushadd_to_gateway(
        settings.pushgateway_url, job=settings.job, grouping_key={"env": env, "source": source},
        registry=_registry(values, {}), timeout=settings.timeout_seconds,
    )  # fmt: skip


def _write_textfile(folder: Path, job: str, env: str, source: str, values: dict[str, float]) -> None:
    from prometheus_client import write_to_textfile
    from prometheus_client.parser import text_string_to_metric_families

    path = folder / f"fm_{env}_{source}.prom"
    if LAST_SUCCESS not in values and path.is_file():  # a failed run: the last success stays as it was
        for family in text_string_to_metric_families(path.read_text()):
            if family.name == LAST_SUCCESS and family.samples:
                values = {**values, LAST_SUCCESS: family.samples[0].value}
    folder.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), _registry(values, {"job": job, "env": env, "source": source}))  # written aside, then renamed

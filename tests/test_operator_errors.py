"""Errors an operator meets: one line naming what failed and what to check, the CLI's exit
codes, and no retries where none can help. Against the suite's real PostgreSQL; no Spark."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import psycopg
import pytest

import jobs.pipeline.write_sql
import sinks.sql.preflight
from feature_defs import load_definitions
from fm_config import RunConf
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.cli import main
from jobs.exit_codes import EXIT_FAILED, EXIT_USAGE
from jobs.pipeline.context import RunContext
from jobs.pipeline.report.summary import RunSummary
from sinks.sql.config import SqlSinkConfig
from sinks.sql.upserts import SqlSink
from stores.errors import TerminalError
from stores.sql import connect as real_connect
from throwaway.servers import free_port

from .support.confs import env_conf

DAY = "2026-11-20"
MISSING_ROLE = "fm_no_such_role"
MISSING_DB = "fm_no_such_db"
DEFS = {
    "entities.yaml": "entities:\n  - {name: consumer, prefix: c, keys: [{name: consumer_id, type: int}], sql_table: consumer_features}\n",
    "src.yaml": "source:\n  name: src\n  entity: consumer\n  location: src\n  layout: wide\n"
    "  features:\n    - {name: score, type: float}\n",
}


def tiny_defs(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in DEFS.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def ops(tmp_path, monkeypatch, pg_server) -> Path:
    """An env 'ops' of its own: tiny definitions, reports under tmp_path, the suite's PostgreSQL."""
    tiny_defs(tmp_path / "defs")
    conf = env_conf(
        tmp_path / "conf",
        "ops",
        f"data_root: {tmp_path / 'data'}\nreports_dir: {tmp_path / 'reports'}\ndefinitions_dir: {tmp_path / 'defs'}\n"
        f"sql: {{dsn: '{pg_server.dsn}', statement_timeout_ms: 300}}\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    return tmp_path


def one_error_line(capsys) -> str:
    """stderr, which must be exactly one 'error: ...' line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.rstrip("\n")


def written_summary(root: Path) -> Path:
    summary = RunSummary(
        source="src", entity="consumer", date=DAY, env="ops", as_of=1795132800, status="succeeded", rows_read=12, entities=12
    )
    return summary.write_json(root / "reports" / "src" / DAY / "summary.json")


def report(capsys) -> int:
    capsys.readouterr()
    return main(["report", "--env", "ops", "--source", "src", "--date", DAY])


# Each case: how the summary is damaged (JSON text in, JSON text out), a fragment of the one-line error.
DAMAGED = {
    "truncated": (lambda text: text[: len(text) // 2], None),
    "newer format": (
        lambda text: json.dumps({**json.loads(text), "format_version": 2, "sinks_v2": {}}),
        "keys this version does not know (format_version, sinks_v2): written by a newer feature-materializer?",
    ),
    "not an object": (lambda text: json.dumps([json.loads(text)]), "expected a JSON object, found a JSON list"),
    "a count that is text": (
        lambda text: json.dumps({**json.loads(text), "rows_read": "twelve"}),
        "a value is not in the format this version writes (ValueError: ",
    ),
}


@pytest.mark.parametrize("case", DAMAGED, ids=list(DAMAGED))
def test_report_of_a_damaged_summary_is_a_one_line_error(ops, capsys, case):
    path = written_summary(ops)
    assert report(capsys) == 0  # intact, it reads back
    assert "rows read" in capsys.readouterr().out
    damage, fragment = DAMAGED[case]
    text = damage(path.read_text())
    path.write_text(text)
    assert report(capsys) == EXIT_FAILED
    line = one_error_line(capsys)
    if fragment is None:  # truncated: json names the line where the text ends
        fragment = f"{path}:{text.count(chr(10)) + 1}: not valid JSON ("
        assert line.endswith("truncated? run the date again to rewrite it"), line
    assert line.startswith(f"error: {path}") and fragment in line, line


def test_report_of_a_date_run_incrementally_is_its_last_run_that_ended_that_day(ops, capsys):
    reports = ops / "reports" / "src"
    runs = {f"{DAY}T010000Z": (11, "succeeded"), f"{DAY}T020000Z": (22, "failed"), "2026-11-21T000000Z": (33, "succeeded")}
    for folder, (rows, status) in runs.items():
        summary = RunSummary(source="src", entity="consumer", date=DAY, env="ops", as_of=1, status=status, rows_read=rows, entities=rows)
        summary.write_json(reports / folder / "summary.json")
    (reports / f"{DAY}T030000Z").mkdir()  # a run that died before its report: no summary.json
    assert report(capsys) == EXIT_FAILED  # the last run's status
    out = capsys.readouterr().out
    rows_read = [line.split()[-1] for line in out.splitlines() if line.strip().startswith("rows read")]
    assert rows_read == ["22"]
    assert out.endswith(
        f"report: {reports / f'{DAY}T020000Z' / 'summary.json'}\n"
        f"earlier incremental runs that ended on {DAY}: {reports / f'{DAY}T010000Z'}\n"
    )
    written_summary(ops)  # a run of the date itself: its own report, as before
    assert report(capsys) == 0
    assert capsys.readouterr().out.endswith(f"report: {reports / DAY / 'summary.json'}\n")


def test_only_an_unknown_name_is_a_usage_error(ops, capsys):
    written_summary(ops)
    assert main(["report", "--env", "ops", "--source", "nope", "--date", DAY]) == EXIT_USAGE
    assert one_error_line(capsys) == "error: unknown source 'nope'; defined sources: src"
    # a KeyError from a summary's content is no usage error: the file is named, exit 1
    path = written_summary(ops)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "status": "failed", "expectations": [{"name": "score not null", "severity": "blocking"}]}))
    assert report(capsys) == EXIT_FAILED
    assert (
        one_error_line(capsys)
        == f"error: {path}: a value is not in the format this version writes (KeyError: 'success'): written by another version?"
    )


def test_schema_step_errors_are_one_line_naming_the_server(ops, capsys, pg_server, pg_db):
    port = free_port()  # nothing listens there
    assert main(["schema", "--env", "ops", "--sql-dsn", f"postgresql://postgres@127.0.0.1:{port}/features"]) == EXIT_FAILED
    line = one_error_line(capsys)  # libpq's hint ("Is the server running ...") joined onto it
    assert (
        line.startswith(f"error: cannot connect to the SQL store (postgresql://postgres@127.0.0.1:{port}/features): ")
        and "Connection refused" in line
    ), line

    dsn = f"postgresql://postgres@127.0.0.1:{pg_server.port}/{MISSING_DB}"
    assert main(["schema", "--env", "ops", "--sql-dsn", dsn]) == EXIT_FAILED
    assert one_error_line(capsys).startswith(
        f"error: SQL store at 127.0.0.1:{pg_server.port}: database '{MISSING_DB}' does not exist (not retried; "
        "check the database name in sql.dsn (or --sql-dsn), and that it was created on that server): "
    )

    # after connecting: another session is creating the same table and holds it past sql.statement_timeout_ms
    with psycopg.connect(pg_server.dsn) as other:
        other.execute("CREATE TABLE consumer_features (entity_key text)")
        assert main(["schema", "--env", "ops"]) == EXIT_FAILED
        other.rollback()
    assert one_error_line(capsys).startswith(
        f"error: schema step on the SQL store ({pg_server.dsn}) failed: [57014] canceling statement due to statement timeout"
    )  # then the server's CONTEXT, on the same line
    assert main(["schema", "--env", "ops"]) == 0  # released: the step creates the table
    assert capsys.readouterr().out == "consumer_features: created\n"


@pytest.mark.parametrize("missing", ["role", "database"])
def test_a_missing_role_or_database_is_terminal_at_once(pg_server, monkeypatch, tmp_path, missing):
    dsn = (
        f"postgresql://{MISSING_ROLE}@127.0.0.1:{pg_server.port}/features"
        if missing == "role"
        else f"postgresql://postgres@127.0.0.1:{pg_server.port}/{MISSING_DB}"
    )
    name, hint = (MISSING_ROLE, "check the user in sql.dsn") if missing == "role" else (MISSING_DB, "check the database name in sql.dsn")
    expected = f"SQL store at 127.0.0.1:{pg_server.port}: {missing} '{name}' does not exist (not retried; {hint}"

    # the writers' sink: 5 retries allowed, none taken
    sink = SqlSink(
        SqlSinkConfig(dsn=dsn, table="t", source="s", as_of=0, dialect="postgres", retries=5, retry_base_delay=0.01, retry_max_delay=0.01)
    )
    with pytest.raises(TerminalError) as info:
        sink.open()
    assert str(info.value).startswith(expected), str(info.value)
    assert sink.stats.retries == 0

    # the driver's check before any store is written: one connection attempt, not 1 + sql.retries
    attempts = []

    def counted(conf):
        attempts.append(conf.dsn)
        return real_connect(conf)

    monkeypatch.setattr(sinks.sql.preflight, "connect", counted)
    conf = RunConf(
        env="test",
        redis=RedisSettings(password_env=None),
        sql=SqlSettings(dsn=dsn, password_env=None, retries=5, retry_base_delay=0.01, retry_max_delay=0.01),
    )
    defs = load_definitions(tiny_defs(tmp_path))
    source = defs.source("src")
    summary = RunSummary(source=source.name, entity=source.entity, date=DAY, env="test", as_of=0)
    with pytest.raises(TerminalError) as info:
        jobs.pipeline.write_sql.prepare_sql(RunContext(None, conf, source, defs.entity_of(source), dt.date.fromisoformat(DAY)), summary)
    assert str(info.value).startswith(expected), str(info.value)
    assert attempts == [dsn]

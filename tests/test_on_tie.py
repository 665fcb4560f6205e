"""An entity's latest rows tied with different values (one timestamp, no created time to decide),
for a source selected by date and one selected by event time: by default (`on_tie: fail`) the
gate's uniqueness check stops the run with nothing written; with `on_tie: keep_one` every entity
is written, the tied one as one of its tied rows (the same whatever the rows' order, run after
run), and the summary counts the key. Real redis-server, the suite's Spark."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from feature_defs import DEFAULT_DIR, load_definitions
from jobs.pipeline.gate.checks import QualityGateError
from jobs.pipeline.run import run_source
from serializers import field_id, freshness_field_name
from serializers.batch import FeatureSpec

from .expected import entity_count, expected_hash

UTC = dt.UTC
DAY = dt.date(2026, 11, 20)
AT = dt.datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
EARLIER = AT - dt.timedelta(hours=1)
SPECS = [FeatureSpec("score", "float"), FeatureSpec("tag", "string")]
FRESH = field_id(freshness_field_name("ties"))
COLUMNS = "consumer_id long, score double, tag string, updated_at timestamp"
KINDS = {  # select_by -> (what the YAML says, the table's columns)
    "date": ("  timestamp_column: updated_at\n", COLUMNS + ", ds date"),
    "event_time": ("  select_by: event_time\n  timestamp_column: updated_at\n", COLUMNS),
}
ROWS = [  # consumer_id, score, tag, updated_at
    (1, 1.0, "tie a", AT),
    (1, 2.0, "tie b", AT),  # the same time, other values: which is right is unknown
    (1, 0.5, "older", EARLIER),
    (2, 3.0, "alone", AT),
    (3, 4.0, "copy", AT),  # exact copies: one row, no tie
    (3, 4.0, "copy", AT),
    (4, 5.0, "before", EARLIER),
    (4, 6.0, "after", AT),
]
TIED = [r for r in ROWS if r[0] == 1 and r[3] == AT]
UNIQUE_CHECK = "entity key unique after de-duplication"


def write_source(spark, root: Path, kind: str, rows: list[tuple], on_tie: str | None):
    """Source 'ties' (definitions and Delta table under ``root``); returns the definitions."""
    extra, schema = KINDS[kind]
    folder = root / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    option = f"  on_tie: {on_tie}\n" if on_tie else ""
    (folder / "ties.yaml").write_text(
        "source:\n  name: ties\n  entity: consumer\n  location: ties\n  layout: wide\n"
        + extra
        + option
        + "  features:\n    - {name: score, type: float}\n    - {name: tag, type: string}\n"
    )
    data = [(*r, DAY) for r in rows] if kind == "date" else rows
    # one file, the rows in the order given (a rule such as Feast's "first in the file" would follow it)
    spark.createDataFrame(data, schema).coalesce(1).write.format("delta").mode("overwrite").save(str(root / "ties"))
    return load_definitions(folder)


def expected(row: tuple, as_of: int) -> dict[bytes, bytes]:
    return expected_hash(SPECS, {"score": row[1], "tag": row[2]}, FRESH, as_of)


@pytest.fixture
def gate_conf(run_conf, tmp_path):
    quality = run_conf.quality.model_copy(update={"expectations": True, "data_docs": False})
    return run_conf.model_copy(update={"data_root": str(tmp_path), "quality": quality})


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_tie_blocks_by_default_and_keep_one_writes_one_of_its_rows_every_time(spark, gate_conf, redis_db, tmp_path, kind):
    # by default: the gate refuses the tie, nothing is written, the summary counts the key
    defs = write_source(spark, tmp_path, kind, ROWS, on_tie=None)
    seen = []
    with pytest.raises(QualityGateError, match=f"{UNIQUE_CHECK}: 1 of 4 unexpected"):
        run_source(spark, gate_conf, defs, "ties", DAY, on_summary=seen.append)
    failed = seen[-1]
    assert failed.status == "failed" and failed.conflicting_keys == 1 and failed.tied_keys_kept == 0
    assert entity_count(redis_db) == 0

    # keep_one: every entity written, the tied one as one of its tied rows; the tie counted, the check passed with its note
    defs = write_source(spark, tmp_path, kind, ROWS, on_tie="keep_one")
    summary = run_source(spark, gate_conf, defs, "ties", DAY)
    assert summary.status == "succeeded", summary.error
    assert (summary.entities, summary.tied_keys_kept, summary.conflicting_keys) == (4, 1, 0)
    line = next(x for x in summary.table().splitlines() if "tied" in x)
    assert line.split() == "keys with tied versions, one kept (on_tie: keep_one) 1".split()
    (check,) = [e for e in summary.expectations if e["name"].startswith(UNIQUE_CHECK)]
    assert check["name"] == f"{UNIQUE_CHECK} (on_tie: keep_one: a tie keeps one row)"
    assert check["success"] and check["severity"] == "blocking" and check["unexpected_count"] == 1
    (report,) = [json.loads(p.read_text()) for p in Path(gate_conf.reports_dir).rglob("summary.json")]  # the failed run's, replaced
    assert (report["status"], report["tied_keys_kept"], report["conflicting_keys"]) == ("succeeded", 1, 0)
    as_of = {r: (summary.as_of if kind == "date" else int(r[3].timestamp())) for r in ROWS}
    stored = {i: redis_db.hgetall(f"c:{i}") for i in (1, 2, 3, 4)}
    assert stored[2] == expected(ROWS[3], as_of[ROWS[3]])
    assert stored[3] == expected(ROWS[4], as_of[ROWS[4]])
    assert stored[4] == expected(ROWS[7], as_of[ROWS[7]])
    assert stored[1] in [expected(r, as_of[r]) for r in TIED], stored[1]

    # the same row again, whatever order the table holds the rows in
    for order in (list(reversed(ROWS)), ROWS[1:] + ROWS[:1]):
        redis_db.flushdb()
        defs = write_source(spark, tmp_path, kind, order, on_tie="keep_one")
        again = run_source(spark, gate_conf, defs, "ties", DAY)
        assert again.status == "succeeded" and again.tied_keys_kept == 1
        assert redis_db.hgetall("c:1") == stored[1]

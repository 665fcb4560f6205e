"""The event-time source ``events`` (select_by event_time) that the event-time tests write and read."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from feature_defs import DEFAULT_DIR, load_definitions
from serializers import field_id, freshness_field_name, subsecond_field
from serializers.batch import FeatureSpec

UTC = dt.UTC
DAY = dt.date(2026, 11, 20)
END_OF_DAY = dt.datetime(2026, 11, 21, tzinfo=UTC)  # what run --date DAY covers: event times before it
FRESH = field_id(freshness_field_name("events"))
SUBSECOND = subsecond_field("events")
SPECS = [FeatureSpec("score", "float"), FeatureSpec("tag", "string")]
SCHEMA = "consumer_id long, score double, tag string, event_ts timestamp, created timestamp"
SOURCE = """source:
  name: events
  entity: consumer
  location: events
  layout: wide
  select_by: event_time
  timestamp_column: event_ts
  created_column: created
{extra}  features:
    - {{name: score, type: float}}
    - {{name: tag, type: string}}
"""
Y2099 = dt.datetime(2099, 1, 1, tzinfo=UTC)


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def epoch(when: dt.datetime) -> int:
    """Whole UTC epoch seconds, floored: what the freshness field holds (the sub-seconds go to the sub-second field)."""
    return int((when - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(seconds=1))


def micros(when: dt.datetime) -> int:
    """UTC epoch microseconds: the as-of time the stores order writes by (the SQL row's as_of)."""
    return (when - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)


def subsecond(when: dt.datetime) -> dict[bytes, bytes]:
    """The sub-second field a write as of ``when`` leaves in the hash: none for whole seconds."""
    return {SUBSECOND: str(when.microsecond).encode()} if when.microsecond else {}


def write_events(spark, root: Path, rows: list[tuple], extra: str = "", mode: str = "overwrite"):
    """The source 'events' (definitions and Delta table under ``root``); returns the definitions."""
    folder = root / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "events.yaml").write_text(SOURCE.format(extra=extra))
    spark.createDataFrame(rows, SCHEMA).write.format("delta").mode(mode).save(str(root / "events"))
    return load_definitions(folder)

"""The sample data's dates and sizes, and small sources of a test's own (a definitions folder
and a Delta table under its tmp_path)."""

from __future__ import annotations

from pathlib import Path

from jobs.sample_data import sample_dates

SAMPLE_DATES = sample_dates(2)  # 2026-11-19, 2026-11-20
DAY2_STR = SAMPLE_DATES[1].isoformat()
SAMPLE_CONSUMERS = 300
SAMPLE_STORES = 60


TINY_SOURCE = "source:\n  name: tiny\n  entity: consumer\n  location: tiny\n  layout: wide\n  features:\n"


def tiny_consumer_source(spark, tmp_path: Path, features_yaml: str, schema: str, rows: list, extra_yaml: str = ""):
    """A consumer source 'tiny' of its own (definitions folder and Delta table under
    ``tmp_path``), for tests that need values the sample data does not have. Returns the
    definitions; run it with ``data_root=tmp_path``."""
    from feature_defs import DEFAULT_DIR, load_definitions

    folder = tmp_path / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny.yaml").write_text(TINY_SOURCE + features_yaml + extra_yaml)
    defs = load_definitions(folder)
    # not via pandas, which would turn NaN into null
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(tmp_path / "tiny"))
    return defs


TINY_LONG_SOURCE = (
    "source:\n  name: tiny_long\n  entity: consumer\n  location: tiny_long\n  layout: long\n"
    "  name_column: feature_name\n  value_column: value\n  features:\n"
)


def tiny_long_consumer_source(spark, tmp_path: Path, features_yaml: str, value_type: str, rows: list):
    """A long-layout consumer source 'tiny_long' of its own: rows (consumer_id, feature_name,
    value, ds) with a value column of Spark type ``value_type``. Returns the definitions;
    run it with ``data_root=tmp_path``."""
    from feature_defs import DEFAULT_DIR, load_definitions

    folder = tmp_path / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny_long.yaml").write_text(TINY_LONG_SOURCE + features_yaml)
    defs = load_definitions(folder)
    schema = f"consumer_id long, feature_name string, value {value_type}, ds date"
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(tmp_path / "tiny_long"))
    return defs

"""The standard benchmark shape: its feature definitions and a Delta table of it, made in Spark.

Per entity: 44 floats (about 60% exact zeros, the rest with 2 to 4 significant digits),
4 ints (counts below 30, 400, 10,000 and 2,000,000), one list of 10 ints drawn from a
vocabulary of 64 ids, and one 32-dim float32 embedding (standard normal).
That is 50 feature values per entity, plus the freshness field.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SOURCE = "bench_standard"
ENTITY = "bench_entity"
FLOATS, INTS, LIST_LEN, DIMENSION, VOCABULARY = 44, 4, 10, 32, 64
SHAPE_VERSION = 2
"""Bumped whenever the generated data changes, so kept tables are made again."""
VALUES_PER_ENTITY = FLOATS + INTS + 2
DATE = dt.date(2026, 11, 20)

ENTITIES_YAML = f"""\
entities:
  - name: {ENTITY}
    prefix: b
    keys: [{{name: entity_id, type: int}}]
    sql_table: bench_features
"""


def source_yaml() -> str:
    features = [f"    - {{name: f{j:02d}, type: float}}" for j in range(FLOATS)]
    features += [f"    - {{name: n{j}, type: int}}" for j in range(INTS)]
    features += ["    - {name: recent_ids, type: int_list}", f"    - {{name: embedding, type: embedding, dimension: {DIMENSION}}}"]
    return (
        f"source:\n  name: {SOURCE}\n  entity: {ENTITY}\n  location: {SOURCE}\n  layout: wide\n"
        "  date_column: ds\n  schedule: bench\n  features:\n" + "\n".join(features) + "\n"
    )


def write_definitions(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entities.yaml").write_text(ENTITIES_YAML)
    (folder / f"{SOURCE}.yaml").write_text(source_yaml())
    return folder


def _float(j: int) -> F.Column:
    # scale and rounding cycle so values have 2, 3 or 4 significant digits ("0.37", "3.71", "37.12", "0.371")
    scale, digits = [(1, 2), (10, 2), (100, 2), (1, 3)][j % 4]
    value = F.round(F.rand(1000 + j) * scale, digits)
    return F.when(F.rand(2000 + j) < 0.6, F.lit(0.0)).otherwise(value).alias(f"f{j:02d}")


def standard_frame(spark: SparkSession, entities: int, date: dt.date = DATE, partitions: int = 4) -> DataFrame:
    """``entities`` rows of the standard shape for one date (deterministic: fixed seeds)."""
    ids = spark.range(0, entities, numPartitions=partitions).withColumnRenamed("id", "entity_id")
    vocabulary = F.array(*[F.lit(v) for v in range(1, VOCABULARY + 1)])  # ids 1..64: one-byte varints
    recent = F.array(*[F.element_at(vocabulary, (F.rand(3000 + k) * VOCABULARY).cast("int") + 1) for k in range(LIST_LEN)])
    embedding = F.array(*[F.randn(4000 + k).cast("float") for k in range(DIMENSION)])
    return ids.select(
        "entity_id",
        *[_float(j) for j in range(FLOATS)],
        *[(F.rand(5000 + j) * [30, 400, 10_000, 2_000_000][j]).cast("long").alias(f"n{j}") for j in range(INTS)],
        recent.alias("recent_ids"),
        embedding.alias("embedding"),
        F.lit(date).alias("ds"),
    )


def write_standard_table(spark: SparkSession, path: Path, entities: int, date: dt.date = DATE) -> None:
    partitions = max(4, -(-entities // 250_000))  # files of at most 250k rows
    standard_frame(spark, entities, date, partitions).write.format("delta").mode("overwrite").save(str(path))

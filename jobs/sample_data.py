"""Deterministic sample ETL tables (Delta, partitioned by ds) for the sample definitions.

``consumer_daily`` (wide): per consumer and date one row (some get a later update row),
19 float64 features with ~60% exact zeros and 2-4 decimals, a float32 score, 3 ints, a
bool, a string, an int list with repeated store ids, a string list, a 32-dim embedding.
``store_features_long`` (long): (store_id, feature_name, value, event_ts) rows, some
features measured twice a day, plus rows of a feature that is not defined.

Each date also holds a few deliberately bad rows (null key, ':' in a key, wrong
embedding dimension, over-long string); :data:`BAD_ROWS` lists them.
"""

from __future__ import annotations

import datetime as dt
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

DEFAULT_END = dt.date(2026, 11, 20)
CUISINES = ["thai", "pizza", "sushi", "burgers", "café", "indian", "mexican", "ramen", "vegan", "poke"]
SEARCHES = ["pad thai", "late night", "pizza near me", "sushi", "bubble tea", "日本料理", "healthy"]
FLOAT_FEATURES = [
    "avg_order_value_7d", "avg_order_value_30d", "orders_per_week_4w", "cancel_rate_30d", "tip_rate_30d",
    "promo_share_30d", "late_delivery_rate_30d", "avg_basket_items_30d", "avg_delivery_km_30d",
    "night_order_share_30d", "weekend_order_share_30d", "refund_rate_90d", "rating_avg_90d",
    "discount_sensitivity", "ltv_estimate", "app_sessions_7d_avg", "support_contact_rate_90d",
    "new_cuisine_share_30d", "grocery_share_30d",
]  # fmt: skip
STORE_FEATURES = ["avg_prep_minutes_7d", "acceptance_rate_7d", "rating_avg_30d", "open_hours_week", "is_open_late"]
EMBEDDING_DIM = 32
# Bad rows written for every date: (source, what is wrong).
BAD_ROWS = {
    "consumer_daily": ["null consumer_id", "embedding of 31 values", "favorite_cuisine of 40 characters"],
    "store_features_long": ["store_id with ':'", "null store_id"],
}


def sample_dates(days: int = 5, end: dt.date = DEFAULT_END) -> list[dt.date]:
    return [end - dt.timedelta(days=days - 1 - i) for i in range(days)]


def _rng(source: str, day: dt.date) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{source}/{day.isoformat()}".encode()))


def _sparse_floats(rng: np.random.Generator, n: int) -> pd.arrays.FloatingArray:
    """~60% exact zeros, the rest with 2-4 decimals, ~3% null."""
    magnitude = 10.0 ** rng.integers(-2, 3, n)
    decimals = rng.integers(2, 5, n)
    values = np.array([round(float(v), int(d)) for v, d in zip(rng.random(n) * magnitude, decimals)])
    values[rng.random(n) < 0.6] = 0.0
    return pd.arrays.FloatingArray(values, mask=rng.random(n) < 0.03)


def consumer_rows(day: dt.date, consumers: int) -> pd.DataFrame:
    rng = _rng("consumer_daily", day)
    ids = np.arange(1, consumers + 1, dtype=np.int64)
    ids = ids[rng.random(consumers) < 0.95]  # not every consumer shows up every day
    updates = ids[rng.random(ids.size) < 0.05]  # a later second row for some
    all_ids = np.concatenate([ids, updates])
    n = all_ids.size
    midnight = pd.Timestamp(day, tz="UTC")
    seconds = rng.integers(0, 43_200, n)
    seconds[ids.size :] += 43_200  # updates come later in the day
    df = pd.DataFrame({"consumer_id": pd.array(all_ids, dtype="Int64")})
    df["updated_at"] = midnight + pd.to_timedelta(seconds, unit="s")
    for name in FLOAT_FEATURES:
        df[name] = _sparse_floats(rng, n)
    df["churn_score"] = rng.random(n).astype(np.float32)
    df["orders_7d"] = pd.array(rng.poisson(2, n), dtype="Int64")
    df["orders_30d"] = pd.array(rng.poisson(8, n), dtype="Int64")
    days_since = pd.array(rng.integers(0, 365, n), dtype="Int64")
    days_since[rng.random(n) < 0.05] = pd.NA
    df["days_since_last_order"] = days_since
    df["is_subscriber"] = rng.random(n) < 0.3
    cuisine = pd.Series(np.array(CUISINES, dtype=object)[rng.integers(0, len(CUISINES), n)])
    cuisine[rng.random(n) < 0.1] = None
    df["favorite_cuisine"] = cuisine
    vocab = rng.integers(1, 60, 12)
    df["recent_store_ids"] = [list(map(int, rng.choice(vocab, int(k)))) for k in rng.integers(0, 11, n)]
    df["recent_searches"] = [[SEARCHES[j] for j in rng.integers(0, len(SEARCHES), int(k))] for k in rng.integers(0, 4, n)]
    emb = rng.standard_normal((n, EMBEDDING_DIM)).astype(np.float32)
    df["taste_embedding"] = list(emb)
    df["ds"] = day

    bad = df.iloc[:3].copy()
    bad["consumer_id"] = pd.array([pd.NA, consumers + 1, consumers + 2], dtype="Int64")
    bad.at[bad.index[1], "taste_embedding"] = emb[0][:31]
    bad.at[bad.index[2], "favorite_cuisine"] = "x" * 40
    return pd.concat([df, bad], ignore_index=True)


def store_rows(day: dt.date, stores: int) -> pd.DataFrame:
    rng = _rng("store_features_long", day)
    store_ids = [f"st{i:05d}" for i in range(1, stores + 1)]
    midnight = pd.Timestamp(day, tz="UTC")
    rows = []
    for sid in store_ids:
        for feature in STORE_FEATURES + ["experimental_score"]:  # the last one is not defined
            if rng.random() < 0.05:
                continue  # not measured today: null in this snapshot
            for _ in range(1 + int(rng.random() < 0.2)):  # some measured twice: the later wins
                if feature == "open_hours_week":
                    value = float(rng.integers(20, 100))
                elif feature == "is_open_late":
                    value = float(rng.random() < 0.4)
                else:
                    value = round(float(rng.random() * 60), int(rng.integers(1, 4)))
                ts = midnight + pd.to_timedelta(int(rng.integers(0, 86_400)), unit="s")
                rows.append((sid, feature, value, ts))
    rows.append(("bad:id", "rating_avg_30d", 4.5, midnight))
    rows.append((None, "rating_avg_30d", 4.0, midnight))
    df = pd.DataFrame(rows, columns=["store_id", "feature_name", "value", "event_ts"])
    df["ds"] = day
    return df


def write_sample_tables(spark, data_root: Path, dates: list[dt.date], consumers: int = 2000, stores: int = 300) -> dict[str, int]:
    """(Re)write both sample tables for ``dates``; returns rows written per table."""
    from pyspark.sql import types as T

    consumer_schema = T.StructType(
        [T.StructField("consumer_id", T.LongType()), T.StructField("updated_at", T.TimestampType())]
        + [T.StructField(name, T.DoubleType()) for name in FLOAT_FEATURES]
        + [
            T.StructField("churn_score", T.FloatType()),
            T.StructField("orders_7d", T.LongType()),
            T.StructField("orders_30d", T.LongType()),
            T.StructField("days_since_last_order", T.LongType()),
            T.StructField("is_subscriber", T.BooleanType()),
            T.StructField("favorite_cuisine", T.StringType()),
            T.StructField("recent_store_ids", T.ArrayType(T.LongType())),
            T.StructField("recent_searches", T.ArrayType(T.StringType())),
            T.StructField("taste_embedding", T.ArrayType(T.FloatType())),
            T.StructField("ds", T.DateType()),
        ]
    )
    store_schema = T.StructType(
        [
            T.StructField("store_id", T.StringType()),
            T.StructField("feature_name", T.StringType()),
            T.StructField("value", T.DoubleType()),
            T.StructField("event_ts", T.TimestampType()),
            T.StructField("ds", T.DateType()),
        ]
    )
    counts = {}
    for name, make, schema, size in (
        ("consumer_daily", consumer_rows, consumer_schema, consumers),
        ("store_features_long", store_rows, store_schema, stores),
    ):
        pdf = pd.concat([make(day, size) for day in dates], ignore_index=True)
        df = spark.createDataFrame(pdf, schema=schema)
        (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").partitionBy("ds").save(str(data_root / name)))
        counts[name] = len(pdf)
    return counts

"""The sample consumer source through the job, checked independently: the latest good row per
consumer computed with pandas, Redis hashes and SQL rows read back raw (shared by the job's
end-to-end tests and those of faults, privileges, clusters, S3 and TLS)."""

from __future__ import annotations

import datetime as dt
import json
import math

import numpy as np
import pandas as pd

from feature_defs import load_definitions
from serializers import decode, field_id
from serializers.keys import as_of_epoch

from ..expected import is_null
from .samples import SAMPLE_DATES

DEFS = load_definitions()
CONSUMER = DEFS.sources["consumer_daily"]
STORE = DEFS.sources["store_features_long"]
DAY1, DAY2 = SAMPLE_DATES


def source_rows(spark, sample_root, name: str, day: dt.date) -> pd.DataFrame:
    df = spark.read.format("delta").load(str(sample_root / name)).where(f"ds = '{day}'")
    return df.toPandas()


def expected_consumers(spark, sample_root, day) -> dict[int, dict]:
    """The latest good row per consumer, computed here with pandas (not the job's code)."""
    pdf = source_rows(spark, sample_root, "consumer_daily", day)
    pdf = pdf[pdf["consumer_id"].notna()]
    pdf = pdf[pdf["taste_embedding"].map(len) == 32]
    pdf = pdf[pdf["favorite_cuisine"].isna() | (pdf["favorite_cuisine"].str.len() <= 32)]
    latest = pdf.sort_values("updated_at").groupby("consumer_id").tail(1)
    return {int(r["consumer_id"]): r for _, r in latest.iterrows()}


def same_value(feature, decoded, source_value) -> bool:
    if feature.type == "float":
        if feature.precision == "float32":
            return np.float32(decoded) == np.float32(source_value)
        return decoded == float(source_value)
    if feature.type == "embedding":
        return np.array_equal(np.asarray(decoded, np.float32), np.asarray(source_value, np.float32))
    if feature.type in ("int_list", "string_list"):
        return list(decoded) == list(source_value)
    return decoded == source_value


def check_consumer_hashes(redis_db, expected: dict[int, dict], day) -> int:
    checked = 0
    for consumer_id, row in expected.items():
        raw = redis_db.hgetall(f"c:{consumer_id}".encode())
        assert raw.pop(field_id("_ts:consumer_daily")) == str(as_of_epoch(day)).encode()
        for feature in CONSUMER.features:
            value = row[feature.name]
            fid = field_id(feature.name)
            if is_null(value):
                assert fid not in raw, f"c:{consumer_id} {feature.name} should be deleted"
            else:
                decoded = decode(feature.type, raw.pop(fid), **feature.options)
                assert same_value(feature, decoded, value), (consumer_id, feature.name, decoded, value)
                checked += 1
        assert raw == {}, f"c:{consumer_id} has unexpected fields {list(raw)}"
    return checked


AS_OF_DAY2 = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)


def table_rows(conn, table: str) -> dict[str, tuple]:
    """Every row, raw: entity_key -> (source, features as parsed JSON, as_of)."""
    rows = conn.execute(f"SELECT entity_key, source, features::text, as_of FROM {table}").fetchall()  # noqa: S608 (test-owned name)
    return {key: (source, json.loads(doc), as_of) for key, source, doc, as_of in rows}


def same_json_value(feature, stored, value) -> bool:
    if feature.type == "float":
        if feature.precision == "float32":
            return np.float32(stored) == np.float32(value)
        return float(stored) == float(value)
    if feature.type == "embedding":
        return np.array_equal(np.asarray(stored, np.float32), np.asarray(value, np.float32))
    if feature.type == "int":
        return stored == int(value)
    if feature.type in ("int_list", "string_list"):
        return stored == list(value)
    return stored == value


def written(feature, value) -> bool:
    if is_null(value):
        return False
    return not (feature.type == "float" and not math.isfinite(float(value)))


def check_consumer_rows(conn, expected: dict[int, dict], as_of: dt.datetime) -> int:
    rows = table_rows(conn, "consumer_features")
    assert set(rows) == {str(cid) for cid in expected}
    checked = 0
    for cid, row in expected.items():
        source, features, stored_as_of = rows[str(cid)]
        assert (source, stored_as_of) == ("consumer_daily", as_of)
        want = {f.name for f in CONSUMER.features if written(f, row[f.name])}
        assert set(features) == want, f"consumer {cid}: keys differ"
        for name in want:
            feature = CONSUMER.feature(name)
            assert same_json_value(feature, features[name], row[name]), (cid, name, features[name], row[name])
            checked += 1
    return checked


STALL_AT_ROW = 120


def install_stall_trigger(conn) -> None:
    """The STALL_AT_ROW-th row inserted sleeps, so a second connection can kill that backend.

    A sequence counts rows: nextval survives the rollback of the killed statement, so the
    retried statement does not stall again.
    """
    conn.execute("CREATE SEQUENCE rows_seen")
    conn.execute(
        "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF nextval('rows_seen') = {STALL_AT_ROW} THEN PERFORM pg_sleep(120); END IF; RETURN NEW; END $$"
    )
    conn.execute("CREATE TRIGGER stall BEFORE INSERT ON consumer_features FOR EACH ROW EXECUTE FUNCTION stall()")

"""A wide source of 1,000 features of every type through a real run into both stores.

Sources of hundreds of features are common (one row per entity, a column per feature): the
per-feature checks must not build expressions whose depth grows with the feature count (a
source of 200 floats overflowed the JVM's stack). Four entities: two good ones (one with
nulls, NaN and inf), two with bad values in features at the start, middle and end of the
list. Expectations come from the values and feature_defs/README.md's rules: Redis hashes
from the scalar reference encoder, SQL objects from the values, reasons from the rules.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from jobs.pipeline.run import run_source
from serializers import field_id

from .expected import entity_keys, expected_hash
from .support.bad_values import as_of, same_json, written
from .support.samples import SAMPLE_DATES, tiny_consumer_source

DAY = SAMPLE_DATES[1]
N = 1_000
KINDS = (  # (definition, column type), cycled over the features
    ("type: float", "double"),
    ("type: float, precision: float32", "double"),
    ("type: int", "long"),
    ("type: bool", "boolean"),
    ("type: string, max_length: 8", "string"),
    ("type: int_list", "array<long>"),
    ("type: string_list", "array<string>"),
    ("type: embedding, dimension: 3", "array<double>"),
)
GOOD, WITH_GAPS, BAD_NUMBERS, BAD_LISTS = 1, 2, 3, 4
NUL = "NUL character (not storable in JSONB)"
# Bad values, each in a feature of its kind near the start, the middle or the end of the list.
BAD = {
    BAD_NUMBERS: {1: 1e40, 497: -3.5e38, 993: 1e300, 4: "x" * 9, 500: "a\x00b"},  # float32 x 3, string x 2
    BAD_LISTS: {999: [1.0, 2.0], 503: [1.0, math.nan, 0.0], 5: [1, None], 998: ["a", None], 6: ["ok", "b\x00"]},
}
EXPECTED_REASONS = {
    BAD_NUMBERS: ["f1: beyond float32 range", "f497: beyond float32 range", "f993: beyond float32 range",
                  "f4: longer than 8 characters", f"f500: {NUL}"],
    BAD_LISTS: ["f999: embedding dimension is not 3", "f503: embedding element is null or not finite",
                "f5: null list element", "f998: null list element", f"f6: {NUL}"],
}  # fmt: skip


def kind(i: int) -> int:
    return i % len(KINDS)


def value(entity: int, i: int):
    """Feature ``f<i>``'s value for ``entity``: good ones distinct per entity and feature."""
    if i in BAD.get(entity, {}):
        return BAD[entity][i]
    if entity == WITH_GAPS and i % 11 == 0:
        return None
    k = kind(i)
    if k == 0:
        specials = {16: math.nan, 32: math.inf, 48: -math.inf} if entity == WITH_GAPS else {}
        return specials.get(i, entity * 1000 + i + 0.25)
    return [
        None,
        (entity + i) / 3,  # not a float32: rounded when stored
        2**53 + entity * i,  # beyond a double's integers
        (entity + i) % 3 == 0,
        f"ü{entity}.{i}",
        [entity, i, -i],
        [f"t{i}", "日本"],
        [float(entity), i / 7, -0.5],
    ][k]


@pytest.mark.slow
def test_a_source_of_1000_features_of_every_type_is_written_and_checked(spark, sql_conf, redis_db, pg_db, tmp_path):
    features = "".join(f"    - {{name: f{i}, {KINDS[kind(i)][0]}}}\n" for i in range(N))
    schema = "consumer_id long, " + ", ".join(f"f{i} {KINDS[kind(i)][1]}" for i in range(N)) + ", ds date"
    entities = (GOOD, WITH_GAPS, BAD_NUMBERS, BAD_LISTS)
    rows = [(e, *(value(e, i) for i in range(N)), DAY) for e in entities]
    defs = tiny_consumer_source(spark, tmp_path, features, schema, rows)
    source = defs.source("tiny")
    quality = sql_conf.quality.model_copy(update={"max_bad_fraction": 0.5, "expectations": True, "data_docs": False})
    conf = sql_conf.model_copy(update={"data_root": str(tmp_path), "sinks": ["redis", "sql"], "quality": quality})

    summary = run_source(spark, conf, defs, "tiny", DAY)

    good = {e: {f"f{i}": value(e, i) for i in range(N)} for e in (GOOD, WITH_GAPS)}
    gaps = list(good[WITH_GAPS].values())  # the data holds what the checks below claim to cover
    assert sum(v is None for v in gaps) == 91 and math.inf in gaps and -math.inf in gaps and any(v != v for v in gaps)
    assert summary.status == "succeeded" and summary.entities == 2 and summary.bad_rows == 2
    assert summary.bad_reasons == Counter(r for rs in EXPECTED_REASONS.values() for r in rs)
    # the gate ran its derived checks over every feature: a type check per feature, all passed
    checks = {e["name"]: e["success"] for e in summary.expectations}
    assert sum(name.endswith(tuple(f" is {t}" for t in ("float", "int", "bool", "string", "int_list", "string_list", "embedding")))
               for name in checks) == N  # fmt: skip
    assert all(checks.values())
    assert summary.profile["f8"]["max"] == BAD_LISTS * 1000 + 8.25 and summary.profile["f11"]["null_fraction"] == 0.25

    # Redis, raw: exactly the good entities, each hash what the scalar encoder makes of its values
    assert sorted(entity_keys(redis_db)) == [b"c:1", b"c:2"]
    stamp = int(as_of(DAY).timestamp())
    for e, values in good.items():
        assert redis_db.hgetall(f"c:{e}") == expected_hash(source.features, values, field_id("_ts:tiny"), stamp), e

    # SQL, raw: one row per good entity; every written value, and nothing else, in its JSON object
    stored = dict(pg_db.execute("SELECT entity_key, features::text FROM consumer_features WHERE source = 'tiny'").fetchall())
    assert sorted(stored) == ["1", "2"]
    for e, values in good.items():
        obj = json.loads(stored[str(e)])
        assert set(obj) == {f.name for f in source.features if written(f, values[f.name])}, e
        mismatched = [name for name in obj if not same_json(source.feature(name), obj[name], values[name])]
        assert mismatched == [], e
    assert len(json.loads(stored[str(GOOD)])) == N

    # the bad rows, kept aside with every reason of each
    quarantined = spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{DAY}'").collect()
    assert {json.loads(r["row"])["consumer_id"]: sorted(r["reasons"]) for r in quarantined} == {
        e: sorted(rs) for e, rs in EXPECTED_REASONS.items()
    }

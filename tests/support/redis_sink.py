"""The Redis sink tests' data: three features of a source 'things', its freshness field, a
sink config on one URL, and record batches of n entities (shared by the node sink's, the
cluster sink's and the store contract's tests)."""

from __future__ import annotations

import pyarrow as pa

from serializers.batch import FeatureSpec
from serializers.scalar import field_id
from sinks.redis.config import RedisSinkConfig

SPECS = [FeatureSpec("score", "float"), FeatureSpec("ids", "int_list"), FeatureSpec("flag", "bool")]
FRESH = field_id("_ts:things")


def sink_config(url: str, **overrides) -> RedisSinkConfig:
    base = dict(url=url, key_prefix="t:", fields=tuple(s.field for s in SPECS), freshness_field=FRESH, as_of=1700000000, chunk_entities=3)
    return RedisSinkConfig(**{**base, **overrides})


def things(n: int, offset: int = 0) -> pa.RecordBatch:
    ids = [str(offset + i) for i in range(n)]
    scores = [None if i % 4 == 1 else i / 8 for i in range(n)]
    lists = [[i, i, 300] for i in range(n)]
    flags = [None if i % 5 == 2 else i % 2 == 0 for i in range(n)]
    return pa.RecordBatch.from_pydict(
        {
            "_id": ids,
            "score": pa.array(scores, pa.float64()),
            "ids": pa.array(lists, pa.list_(pa.int64())),
            "flag": pa.array(flags, pa.bool_()),
        }
    )

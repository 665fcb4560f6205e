"""The every_type and pair_daily sources (definitions and rows) whose values the read-side tests
expect, feature by feature, as a model must see them."""

from __future__ import annotations

from serializers.keys import as_of_epoch

from .samples import SAMPLE_DATES

DAY = SAMPLE_DATES[1]
AS_OF = as_of_epoch(DAY)
BIG = 2**60 + 1  # beyond 2^53: a float64 would round it

ENTITIES = """entities:
  - {name: consumer, prefix: c, keys: [{name: consumer_id, type: int}], sql_table: consumer_features}
  - {name: pair, prefix: p, keys: [{name: region, type: string}, {name: store_id, type: int}], sql_table: pair_features}
"""
EVERY_TYPE = """source:
  name: every_type
  entity: consumer
  location: every_type
  layout: wide
  features:
    - {name: f, type: float}
    - {name: f32, type: float, precision: float32}
    - {name: n, type: int}
    - {name: b, type: bool}
    - {name: s, type: string}
    - {name: e, type: embedding, dimension: 4}
    - {name: il, type: int_list}
    - {name: sl, type: string_list, compression: none}
"""
PAIR = """source:
  name: pair_daily
  entity: pair
  location: pair_daily
  layout: wide
  max_age_seconds: 3600
  features:
    - {name: score, type: float}
"""
SERVICES = "feature_services:\n  - {name: ranking, features: [every_type:n, pair_daily]}\n"
ROWS = [  # consumer_id, f, f32, n, b, s, e, il, sl, ds
    (1, 0.1, 0.33572233, BIG, True, "café", [0.5, -1.25, 3.0, 0.1], [1, 2**62], ["a", "日本"], DAY),
    (2, None, float("nan"), None, False, None, None, [], [], DAY),
    (3, -1e-07, 1.0, -5, None, "", [0.0, 0.0, 0.0, 0.0], None, None, DAY),
]
SCHEMA = "consumer_id long, f double, f32 double, n long, b boolean, s string, e array<float>, il array<long>, sl array<string>, ds date"
# What a model must see for consumers 1, 2, 3 and 4 (never written), feature by feature
EXPECTED = {
    "f": ([0.1, None, -1e-07, None], ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]),
    "f32": ([0.33572233, None, 1.0, None], ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]),
    "n": ([BIG, None, -5, None], ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]),
    "b": ([True, False, None, None], ["PRESENT", "PRESENT", "NULL_VALUE", "NOT_FOUND"]),
    "s": (["café", None, "", None], ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]),
    "e": ([[0.5, -1.25, 3.0, 0.1], None, [0.0] * 4, None], ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]),
    "il": ([[1, 2**62], [], None, None], ["PRESENT", "PRESENT", "NULL_VALUE", "NOT_FOUND"]),
    "sl": ([["a", "日本"], [], None, None], ["PRESENT", "PRESENT", "NULL_VALUE", "NOT_FOUND"]),
}
CONSUMERS = {"consumer_id": [1, 2, 3, 4]}

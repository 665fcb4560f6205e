"""The reader's memory is bounded by what it really holds, whatever clients send: the L1
cache counts every entry's key and its own bookkeeping (a NOT_FOUND entry is mostly key),
drops entries past their stale window without their being looked up, the memo of resolved
feature lists is bounded by bytes, and entity keys and feature references per request are
bounded. Memory is measured as the process's RSS (/proc/<pid>/status) in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from feature_defs import DEFAULT_DIR, load_definitions
from feature_reader import EntityKeyError, FeatureReader, RequestError
from feature_reader.cache import L1Cache
from feature_reader.rows import NOT_FOUND_ROW
from fm_config.reader import CacheSettings

from .support.confs import reader_conf

MB = 1 << 20
CACHE = 4 * MB  # the cache's and the memo's bound, which _measure hands the measuring process


def test_entity_keys_and_feature_references_past_their_limits_are_refused_naming_them():
    reader = FeatureReader(reader_conf("redis://127.0.0.1:1/0"), load_definitions(DEFAULT_DIR))  # refused before any read: never connects
    ref = ["store_features_long:is_open_late"]
    with pytest.raises(EntityKeyError, match=r"entity 'store' row 1: its key is 1,025 bytes; the limit is 1,024 \(reader.max_key_bytes\)"):
        reader.get_online_features(ref, {"store_id": ["a", "k" * 1025]})
    with pytest.raises(EntityKeyError, match=r"row 0: its key is 1,200 bytes"):  # bytes, not characters
        reader.get_online_features(ref, {"store_id": ["日" * 400]})
    with pytest.raises(EntityKeyError, match="lone surrogates"):
        reader.get_online_features(ref, {"store_id": ["a\ud800"]})
    with pytest.raises(RequestError, match=r"1,001 feature references in one request; the limit is 1,000 \(reader.max_features\)"):
        reader.get_online_features(ref * 1001, {"store_id": ["a"]})
    with pytest.raises(RequestError, match=r"50,000 feature references"):  # a 1.6 MB list: refused before it is resolved or kept
        reader.get_online_features(ref * 50_000, {"store_id": ["a"]})


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_counts_keys_and_drops_entries_past_their_stale_window_unasked():
    clock = _Clock()
    settings = CacheSettings(ttl_seconds=5, jitter=0, negative_ttl_seconds=1, stale_if_error_seconds=2, max_bytes=4 * MB)
    cache = L1Cache(settings, clock=clock, rng=lambda: 0.5)
    keys = [(("redis",), "store_features_long", f"{i}-" + "k" * 1000, "*") for i in range(3000)]
    for key in keys:
        cache.put(key, NOT_FOUND_ROW, size=NOT_FOUND_ROW.size, negative=True, delta=0.001)
    # each entry counts at least its entity id: 3,000 of them do not fit in 4 MB
    assert cache.bytes <= 4 * MB and len(cache) * 1000 <= cache.bytes and len(cache) < 3000 and cache.evictions > 0
    kept, evicted = len(cache), cache.evictions
    clock.now += 1 + 2 + 0.5  # past the negative TTL and the stale window: nothing looks these up again
    from feature_reader.cache import SWEEP_EVERY, SWEEP_SIZE  # here: the module's other tests import without them

    puts = 4 * SWEEP_EVERY
    for n in range(puts):  # every few puts drop more of them than the puts add
        cache.put((("redis",), "s", f"new-{n}", "*"), NOT_FOUND_ROW, size=64, negative=True, delta=0.001)
    swept = ((3000 + puts) // SWEEP_EVERY - 3000 // SWEEP_EVERY) * SWEEP_SIZE
    evicted = cache.evictions - evicted  # the first puts into the full cache make room by the usual eviction
    assert swept >= 2 * puts and len(cache) == kept - swept - evicted + puts
    assert cache.sweep() == kept - swept - evicted and len(cache) == puts  # the rest at once
    assert cache.bytes == sum(e.size for e in cache._entries.values()) and puts * (64 + 240) < cache.bytes < puts * 700
    clock.now += 3.6
    assert cache.sweep() == puts and cache.bytes == 0


def test_a_full_cache_keeps_pythons_youngest_generation_small():
    """A full cache frees an entry for each it makes, so Python's own count (allocations minus
    frees) stays under its threshold and new entries piled up in the youngest generation,
    until one collection walked them all (250 ms at 35,000 entries of 50 floats). The cache
    collects it every YOUNG_EVERY puts: at most that many entries wait to be looked at."""
    import gc

    from feature_reader.cache import YOUNG_EVERY

    settings = CacheSettings(ttl_seconds=600, jitter=0, max_entries=20_000, max_bytes=1 << 30)
    cache = L1Cache(settings, rng=lambda: 0.5)
    gc.collect()
    largest = 0
    for i in range(60_000):
        values = tuple(float(i + j) for j in range(50))
        cache.put((("redis",), "s", str(i), "*"), values, size=400, negative=False, delta=0.001)
        if i % 500 == 0:
            largest = max(largest, len(gc.get_objects(0)))
    assert len(cache) == 20_000 and cache.evictions == 40_000
    # three tracked objects a put (key, values, entry), plus the test's own few
    assert largest <= 3 * YOUNG_EVERY + 200, largest


DEFS = """entities:
  - {name: shop, prefix: s, keys: [{name: shop_id, type: string}], sql_table: shop_features}
"""
LONG_NAME = "a_feature_with_a_name_long_enough_to_cost_something_{:04d}"
MEASURE = r"""
import json, random, sys
from feature_defs import load_definitions
from feature_reader import FeatureReader
from fm_config import RunConf
from fm_config.reader import CacheSettings, ReaderSettings
from fm_config.redis import RedisSettings

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

mode, url, defs_dir, rounds, bound = sys.argv[1:6]
cache = CacheSettings(max_bytes=int(bound), ttl_seconds=600, negative_ttl_seconds=600)
settings = ReaderSettings(timeout_ms=5000, cache=cache, max_memo_bytes=int(bound))
conf = RunConf(env="test", sinks=["redis"], redis=RedisSettings(url=url, password_env=None, mode="standalone"), reader=settings)
defs = load_definitions(defs_dir)
names = [f.name for f in defs.sources["wide"].features]
rng = random.Random(38)
with FeatureReader(conf, defs) as reader:
    reader.get_online_features(["wide"], {"shop_id": ["warm"]})
    before = rss()
    for r in range(int(rounds)):
        if mode == "keys":  # 1,000 distinct entities of ~1 KB ids, never stored: NOT_FOUND
            reader.get_online_features(["wide:" + names[0]], {"shop_id": [f"{r}-{i}-" + "k" * 1000 for i in range(1000)]})
        else:  # a distinct list of 1,000 references, each a fresh string as a parsed body makes them
            order = rng.sample(range(len(names)), len(names))
            reader.get_online_features([f"wide:{names[i]}" for i in order], {"shop_id": ["a"]})
    print(json.dumps({"growth": rss() - before, "cache_bytes": reader.cache.bytes, "entries": len(reader.cache),
                      "memo_bytes": getattr(reader._selections, "bytes", None), "memo_lists": len(reader._selections)}))
"""


@pytest.fixture(scope="module")
def wide_defs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wide-defs")
    (folder / "entities.yaml").write_text(DEFS)
    features = "\n".join(f"    - {{name: {LONG_NAME.format(i)}, type: float}}" for i in range(1000))
    (folder / "wide.yaml").write_text(f"source:\n  name: wide\n  entity: shop\n  location: wide\n  layout: wide\n  features:\n{features}\n")
    return folder


def _measure(mode: str, url: str, defs: Path, rounds: int) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, mode, url, str(defs), str(rounds), str(CACHE)], capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_many_distinct_long_not_found_keys_keep_the_cache_and_rss_within_its_bound(redis_server, wide_defs):
    """60,000 distinct ~1 KB NOT_FOUND keys (60 MB of ids) into a 4 MB cache: the cache
    accounts at least each id it keeps, stays within 4 MB, and the process grows by little
    more. Before, a NOT_FOUND entry counted 64 bytes: the cache kept all 60,000 (RSS grew
    over 60 MB; at 16 MB and 200,000 keys it grew 155 MB, now 20 MB)."""
    redis_server.client(7).flushdb()
    got = _measure("keys", redis_server.url.rsplit("/", 1)[0] + "/7", wide_defs, 60)
    assert got["cache_bytes"] <= CACHE and got["entries"] * 1000 <= got["cache_bytes"], got
    assert got["growth"] < CACHE + 24 * MB, got


@pytest.mark.slow
def test_many_distinct_long_feature_lists_keep_the_memo_and_rss_within_its_bound(redis_server, wide_defs):
    """200 distinct lists of 1,000 references (60 KB each, as fresh strings): the memo of
    resolved lists keeps at most reader.max_memo_bytes (4 MB) of them. Before, it kept up
    to 512 whole lists and their resolutions: all 200 here (at 600 lists RSS grew 77 MB;
    now 7 MB)."""
    redis_server.client(7).flushdb()
    got = _measure("lists", redis_server.url.rsplit("/", 1)[0] + "/7", wide_defs, 200)
    assert got["growth"] < CACHE + 12 * MB, got
    assert got["memo_bytes"] is not None and got["memo_bytes"] <= CACHE and got["memo_lists"] < 16, got

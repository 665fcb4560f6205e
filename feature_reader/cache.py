"""The in-process L1 cache: bounded by entries and bytes (least recently used leave
first), a TTL with jitter, shorter-lived negative entries, probabilistic early refresh,
and expired entries kept a while to answer when a store fails (stale-if-error).

An entry is one source's values for one entity, as read from a store. Early refresh is
XFetch (Vattani, Chierichetti, Lowenstein, "Optimal probabilistic cache stampede
prevention", VLDB 2015): a read at time t refreshes an entry expiring at T when
``t - delta * beta * ln(U) >= T``, U uniform in (0, 1], delta the time the entry's own
store read took: one reader refreshes a hot entry shortly before it expires, instead of
every reader missing at once after.

An entry's size is what it really holds: its value's estimate, its key (an entity id can be
long, a NOT_FOUND entry is mostly key) and the cache's own bookkeeping. Entries past their
stale window leave without being looked up: every 8th ``put`` drops up to 16 of them from
the least recently used end, where they gather (an entry there was used before every other),
so they leave faster than entries come; ``sweep()`` drops them all (the server
calls it when /metrics is scraped, so an idle cache shrinks too).

Every ``YOUNG_EVERY`` puts the cache collects Python's youngest generation itself. Python
collects it when allocations minus frees pass 700; a full cache frees an entry for each one
it makes, so that count stays low while new entries pile up untouched: one collection then
walked 35,000 entries' values (a tuple of 50 floats each, cold in memory) and stopped every
request for 250 ms (p99 264 ms at 100 requests/s of 100 x 50). Collected in small steps,
each entry's values are looked at once, while warm, and then left alone (a tuple of numbers
and strings is no longer tracked).
"""

from __future__ import annotations

import gc
import math
import random
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from fm_config.reader import CacheSettings


@dataclass(slots=True)
class Entry:
    value: Any
    expires: float
    stale_until: float
    delta: float
    """Seconds the store read that produced this entry took (XFetch's delta)."""
    size: int
    negative: bool


ENTRY_BYTES = 240
"""The cache's own bytes per entry beyond its key and value: the entry object, its floats,
the ordered dict's slot and link (233 measured with tracemalloc, CPython 3.11)."""

SWEEP_EVERY, SWEEP_SIZE = 8, 16
"""Every 8th ``put`` drops up to 16 entries past their stale window: they leave twice as fast as entries come, at a
fraction of a look per put."""


YOUNG_EVERY = 256
"""Puts between the cache's own collections of the youngest generation (about 1 ms each at 50 features)."""


def key_bytes(key: Hashable) -> int:
    """A key's bytes: a tuple and its parts (the entity id; the parts shared by many keys are counted too, a little over)."""
    if type(key) is not tuple:
        return sys.getsizeof(key)
    try:
        short = sum(map(len, key)) <= 64
    except TypeError:  # a part without a length
        short = False
    if short:  # the usual key, not measured: the tuple (40 + 8 a part), each part's object (~49) and at most 64 characters
        return 40 + 57 * len(key) + 64
    return sys.getsizeof(key) + sum(map(sys.getsizeof, key))


FRESH, REFRESH, STALE, MISS = "fresh", "refresh", "stale", "miss"
"""Lookup outcomes: answer from the cache; answer, and this caller re-reads it early;
expired but usable if the store fails; nothing usable."""


class L1Cache:
    def __init__(self, settings: CacheSettings, *, clock: Callable[[], float] = time.monotonic, rng: Callable[[], float] = random.random):
        self.settings = settings
        self.clock, self.rng = clock, rng
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0
        self._puts = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def lookup(self, key: Hashable) -> tuple[str, Entry | None]:
        now = self.clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return MISS, None
            if now < entry.expires:
                self._entries.move_to_end(key)
                beta = self.settings.early_refresh_beta
                if beta > 0 and not entry.negative and now - entry.delta * beta * math.log(1.0 - self.rng()) >= entry.expires:
                    return REFRESH, entry
                return FRESH, entry
            if now < entry.stale_until:
                return STALE, entry
            self._drop(key)
            return MISS, None

    def put(self, key: Hashable, value: Any, *, size: int, negative: bool, delta: float) -> None:
        s = self.settings
        ttl = s.negative_ttl_seconds if negative else s.ttl_seconds
        if ttl <= 0:
            return
        now = self.clock()
        expires = now + ttl * (1.0 + s.jitter * self.rng())
        size += ENTRY_BYTES + key_bytes(key)
        entry = Entry(value, expires, expires + s.stale_if_error_seconds, delta, size, negative)
        with self._lock:
            self._puts += 1
            young = not self._puts % YOUNG_EVERY
            if not self._puts % SWEEP_EVERY:
                self._sweep(now, SWEEP_SIZE)
            if key in self._entries:
                self._drop(key)
            self._entries[key] = entry
            self._bytes += size
            while len(self._entries) > s.max_entries or self._bytes > s.max_bytes:
                oldest = next(iter(self._entries))
                self._drop(oldest)
                self.evictions += 1
        if young and gc.isenabled():  # a program that turned the collector off keeps it off
            gc.collect(0)

    def sweep(self, limit: int = 100_000) -> int:
        """Drop up to ``limit`` entries past their stale window (from the least recently used end); how many left."""
        now = self.clock()
        with self._lock:
            return self._sweep(now, limit)

    def _sweep(self, now: float, limit: int) -> int:
        entries, dropped = self._entries, 0
        while dropped < limit and entries:
            key = next(iter(entries))
            entry = entries[key]
            if now < entry.stale_until:  # the least recently used is still usable: the rest were used after it
                break
            del entries[key]
            self._bytes -= entry.size
            dropped += 1
        return dropped

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size

    def drop(self, keys) -> int:
        """These entries leave (a push replaced their values); returns how many were held."""
        dropped = 0
        with self._lock:
            for key in keys:
                if key in self._entries:
                    self._drop(key)
                    dropped += 1
        return dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

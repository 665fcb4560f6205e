"""Single-flight: one store read per key at a time, however many callers want it.

The first caller of a key claims it and registers a pending future on the scoreboard;
every caller that comes while the read is under way waits on that future instead of
reading; the key leaves the scoreboard when the read ends, whether it returned or
failed (then every waiter gets the error). A batch claims the keys nobody reads yet and
waits on the others. ``AsyncFlights`` is for one event loop; ``ThreadFlights`` for threads;
``NoFlights`` (``reader.single_flight: false``) lets every caller read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Hashable, Iterable


class _Scoreboard:
    def __init__(self, lock):
        self._pending: dict = {}
        self._lock = lock

    def __len__(self) -> int:
        return len(self._pending)

    def _future(self):
        raise NotImplementedError

    def claim(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], dict]:
        """(keys this caller must read, futures of keys another caller is reading). One
        future stands for all the keys a caller claims at once (a batch makes one)."""
        mine, theirs = [], {}
        with self._lock:
            fut = None
            for key in keys:
                other = self._pending.get(key)
                if other is None:
                    if fut is None:
                        fut = self._future()
                    self._pending[key] = fut
                    mine.append(key)
                else:
                    theirs[key] = other
        return mine, theirs

    def finish(self, keys: Iterable[Hashable], results: dict, error: BaseException | None = None) -> None:
        """End the reads of ``keys``: each waiter gets its key's result, or ``error`` (also
        for a key missing from ``results``). Always called, in a finally."""
        with self._lock:
            futures = {id(f): f for f in (self._pending.pop(key, None) for key in keys) if f is not None}
        for fut in futures.values():
            if not fut.done():
                fut.set_result((results, error))

    @staticmethod
    def _pick(futures: dict, outcomes: dict) -> dict:
        out = {}
        for key, fut in futures.items():
            results, error = outcomes[id(fut)]
            if key not in results:
                raise error or RuntimeError(f"read of {key!r} ended without a result")
            out[key] = results[key]
        return out


class AsyncFlights(_Scoreboard):
    def __init__(self):
        super().__init__(contextlib.nullcontext())  # one event loop: no other thread touches it

    def _future(self) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    @classmethod
    async def wait(cls, futures: dict[Hashable, asyncio.Future]) -> dict:
        """Results of others' reads; a caller's cancellation does not cancel the shared read."""
        distinct = {id(f): f for f in futures.values()}
        return cls._pick(futures, {k: await asyncio.shield(f) for k, f in distinct.items()})


class ThreadFlights(_Scoreboard):
    def __init__(self):
        super().__init__(threading.Lock())

    def _future(self) -> concurrent.futures.Future:
        return concurrent.futures.Future()

    @classmethod
    def wait(cls, futures: dict[Hashable, concurrent.futures.Future], timeout: float | None = None) -> dict:
        distinct = {id(f): f for f in futures.values()}
        return cls._pick(futures, {k: f.result(timeout) for k, f in distinct.items()})


class NoFlights:
    """Single-flight off: every caller reads what it misses (benchmarks compare the two)."""

    def __len__(self) -> int:
        return 0

    def claim(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], dict]:
        return list(keys), {}

    def finish(self, keys: Iterable[Hashable], results: dict, error: BaseException | None = None) -> None:
        pass

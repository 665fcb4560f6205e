"""Single-flight: one store read per key at a time, however many callers want it.

The first caller of a key claims it and registers a pending future on the scoreboard;
every caller that comes while the read is under way waits on that future instead of
reading; the key leaves the scoreboard when the read ends, whether it returned or
failed (then every waiter gets the error). A batch claims the keys nobody reads yet and
waits on the others. ``AsyncFlights`` is for one event loop; ``ThreadFlights`` for threads.
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
        """(keys this caller must read, futures of keys another caller is reading)."""
        mine, theirs = [], {}
        with self._lock:
            for key in keys:
                fut = self._pending.get(key)
                if fut is None:
                    self._pending[key] = self._future()
                    mine.append(key)
                else:
                    theirs[key] = fut
        return mine, theirs

    def finish(self, keys: Iterable[Hashable], results: dict, error: BaseException | None = None) -> None:
        """End the reads of ``keys``: each waiter gets its key's result, or ``error`` (also
        for a key missing from ``results``). Always called, in a finally."""
        with self._lock:
            futures = [(key, self._pending.pop(key, None)) for key in keys]
        for key, fut in futures:
            if fut is None or fut.done():
                continue
            if key in results:
                fut.set_result(results[key])
            else:
                fut.set_exception(error or RuntimeError(f"read of {key!r} ended without a result"))


class AsyncFlights(_Scoreboard):
    def __init__(self):
        super().__init__(contextlib.nullcontext())  # one event loop: no other thread touches it

    def _future(self) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_retrieve)
        return fut

    @staticmethod
    async def wait(futures: dict[Hashable, asyncio.Future]) -> dict:
        """Results of others' reads; a caller's cancellation does not cancel the shared read."""
        return {key: await asyncio.shield(fut) for key, fut in futures.items()}


def _retrieve(fut: asyncio.Future) -> None:
    # a failed read nobody waited for is not an "exception never retrieved"
    if not fut.cancelled():
        fut.exception()


class ThreadFlights(_Scoreboard):
    def __init__(self):
        super().__init__(threading.Lock())

    def _future(self) -> concurrent.futures.Future:
        return concurrent.futures.Future()

    @staticmethod
    def wait(futures: dict[Hashable, concurrent.futures.Future], timeout: float | None = None) -> dict:
        return {key: fut.result(timeout) for key, fut in futures.items()}

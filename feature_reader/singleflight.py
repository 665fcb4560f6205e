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
import threading
from collections.abc import Hashable, Iterable


class AsyncFlights:
    def __init__(self):
        self._pending: dict[Hashable, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def claim(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], dict[Hashable, asyncio.Future]]:
        """(keys this caller must read, futures of keys another caller is reading)."""
        mine, theirs = [], {}
        loop = asyncio.get_running_loop()
        for key in keys:
            fut = self._pending.get(key)
            if fut is None:
                fut = self._pending[key] = loop.create_future()
                fut.add_done_callback(_retrieve)
                mine.append(key)
            else:
                theirs[key] = fut
        return mine, theirs

    def finish(self, keys: Iterable[Hashable], results: dict, error: BaseException | None = None) -> None:
        """End the reads of ``keys``: each waiter gets its key's result, or ``error``
        (also for a key missing from ``results``). Always called, in a finally."""
        for key in keys:
            fut = self._pending.pop(key, None)
            if fut is None or fut.done():
                continue
            if key in results:
                fut.set_result(results[key])
            else:
                fut.set_exception(error or RuntimeError(f"read of {key!r} ended without a result"))

    @staticmethod
    async def wait(futures: dict[Hashable, asyncio.Future]) -> dict:
        """Results of others' reads; a caller's cancellation does not cancel the shared read."""
        out = {}
        for key, fut in futures.items():
            out[key] = await asyncio.shield(fut)
        return out


def _retrieve(fut: asyncio.Future) -> None:
    # a failed read nobody waited for is not an "exception never retrieved"
    if not fut.cancelled():
        fut.exception()


class ThreadFlights:
    def __init__(self):
        self._pending: dict[Hashable, concurrent.futures.Future] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pending)

    def claim(self, keys: Iterable[Hashable]) -> tuple[list[Hashable], dict[Hashable, concurrent.futures.Future]]:
        mine, theirs = [], {}
        with self._lock:
            for key in keys:
                fut = self._pending.get(key)
                if fut is None:
                    self._pending[key] = concurrent.futures.Future()
                    mine.append(key)
                else:
                    theirs[key] = fut
        return mine, theirs

    def finish(self, keys: Iterable[Hashable], results: dict, error: BaseException | None = None) -> None:
        with self._lock:
            futures = [(key, self._pending.pop(key, None)) for key in keys]
        for key, fut in futures:
            if fut is None or fut.done():
                continue
            if key in results:
                fut.set_result(results[key])
            else:
                fut.set_exception(error or RuntimeError(f"read of {key!r} ended without a result"))

    @staticmethod
    def wait(futures: dict[Hashable, concurrent.futures.Future], timeout: float | None = None) -> dict:
        return {key: fut.result(timeout) for key, fut in futures.items()}

"""A circuit breaker per store: a store that failed ``failures`` calls in a row is left
alone for ``cooldown`` seconds (calls fail at once, or go to the other store), then one
call probes it; a probe that succeeds closes the breaker, one that fails opens it again.
A dead store then costs one call per cool-down, not every request its timeout.

Thread-safe (the threaded reader's callers share it); an asyncio reader uses it from its
event loop, where the lock is never contended.
"""

from __future__ import annotations

import threading
import time

from feature_reader.errors import StoreUnavailable

CLOSED, OPEN, HALF_OPEN = 0, 1, 2
"""The states, as the /metrics gauge reports them."""


class Breaker:
    def __init__(self, store: str, failures: int, cooldown: float, clock=time.monotonic):
        self.store, self.failures, self.cooldown, self.clock = store, failures, cooldown, clock
        self.state = CLOSED
        self.failed = 0  # consecutive failures
        self.opened_at = 0.0
        self.opens = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def allow(self) -> None:
        """Before a call: raises StoreUnavailable while open; past the cool-down lets one probe through."""
        if self.state == CLOSED:
            return
        with self._lock:
            if self.state == OPEN and self.clock() - self.opened_at >= self.cooldown:
                self.state = HALF_OPEN  # this caller is the probe; the others still fail fast
                return
            if self.state == CLOSED:
                return
            left = max(0.0, self.cooldown - (self.clock() - self.opened_at))
            raise StoreUnavailable(
                f"{self.store} skipped: {self.failed} calls in a row failed (last: {self.last_error}); next try in {left:.1f} s"
            )

    def succeeded(self) -> None:
        if self.state == CLOSED and self.failed == 0:
            return
        with self._lock:
            self.state, self.failed = CLOSED, 0

    def failed_call(self, error: BaseException) -> bool:
        """After a failed call; True when it opened the breaker."""
        with self._lock:
            self.failed += 1
            self.last_error = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            if self.state == HALF_OPEN or (self.state == CLOSED and self.failed >= self.failures):
                self.state, self.opened_at = OPEN, self.clock()
                self.opens += 1
                return True
            return False

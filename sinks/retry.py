"""The one place that retries: bounded attempts, capped exponential backoff with jitter."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def call_with_retries(
    fn: Callable[[], T],
    *,
    is_transient: Callable[[BaseException], bool],
    retries: int,
    base_delay: float = 0.2,
    max_delay: float = 5.0,
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``fn``; on a transient error run it again, at most ``retries`` more times.

    ``fn`` must be safe to repeat (our writes are HSET/HDEL/EXPIRE and full-row upserts).
    """
    attempt = 0
    while True:
        try:
            return fn()
        except BaseException as exc:
            if attempt >= retries or not is_transient(exc):
                raise
            attempt += 1
            if on_retry:
                on_retry(attempt, exc)
            # "full jitter": spreads retries of many tasks hitting one server at once
            sleep(random.uniform(0, min(max_delay, base_delay * 2 ** (attempt - 1))))

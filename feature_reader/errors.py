"""What a read can fail with: the caller's request (RequestError and its kinds: never
retried) or a store (transient: ReadTimeout, StoreUnavailable). No message holds a
connection string or a password."""

from __future__ import annotations

import difflib

from stores.errors import TerminalError, TransientError


class RequestError(TerminalError, ValueError):
    """The request cannot be served as asked (an HTTP server answers 4xx)."""


SHOWN = 100
"""Characters of a name from a request that a message repeats; the rest is cut."""


def shown(text: str, limit: int = SHOWN) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was: request parts are echoed in errors."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text):,} characters)"


class UnknownNameError(RequestError):
    """A feature, source or feature service that no definition has."""

    def __init__(self, what: str, name: str, known: list[str]):
        near = difflib.get_close_matches(name, known, n=3, cutoff=0.6) if len(name) <= SHOWN else []
        hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
        super().__init__(f"unknown {what} {shown(name)!r}{hint}")
        self.what, self.name, self.near = what, name, near


class EntityKeyError(RequestError):
    """Missing, unknown or mistyped entity key columns."""


class StoreError(TransientError):
    """A store did not answer as it should (connection lost, refused, down)."""


class ReadTimeout(StoreError):
    """A store call passed its deadline (reader.timeout_ms)."""


class StoreUnavailable(StoreError):
    """A store call not made: the store's circuit breaker is open (its last calls failed)."""

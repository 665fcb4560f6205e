"""Errors at the sink boundary: transient ones are retried, terminal ones are not.

An error leaves a Spark partition as two strings, its kind (the class name) and its
message (:func:`to_wire`), the same for every store, and is rebuilt as its class on the
driver (:func:`from_wire`): every class below :class:`stores.errors.MaterializerError`
registers itself, so nothing classifies an error by the text of its name.
"""

from __future__ import annotations

from stores.errors import MaterializerError, TerminalError, TransientError


class SinkError(MaterializerError):
    """Base of every sink failure."""


class TransientSinkError(SinkError, TransientError):
    """Worth retrying: the same write may succeed later (dropped connection, timeout)."""


class TerminalSinkError(SinkError, TerminalError):
    """Retrying cannot help (bad data, refused command, out of memory)."""


class CapacityError(TerminalSinkError):
    """The store is, or would be, too full for this write."""


def to_wire(exc: BaseException, store: str = "") -> tuple[str, str]:
    """(kind, message) of an error leaving a partition. A store client's own error (e.g. a
    command the ACL refuses) is terminal: no retry of the task can help."""
    if isinstance(exc, MaterializerError):
        return type(exc).__name__, str(exc)
    return TerminalSinkError.__name__, f"{store + ': ' if store else ''}{type(exc).__name__}: {exc}"


def from_wire(kind: str, message: str) -> MaterializerError:
    """The error a partition reported, as its class (an unknown kind: terminal). Built
    without the class's own __init__ (some take more than a message): only the message crosses."""
    cls = MaterializerError.kinds.get(kind, TerminalSinkError)
    error = cls.__new__(cls)
    error.args = (message,)
    return error


def raise_first(errors: list[MaterializerError], context: str) -> None:
    """Fail with the writers' errors: as the class of the first terminal one (of the first
    when all are transient, so the run stays retryable), ``context`` leading the message."""
    if not errors:
        return
    first = next((e for e in errors if not isinstance(e, TransientError)), errors[0])
    raise from_wire(type(first).__name__, f"{context}; first: {type(first).__name__}: {first}")

"""Errors at the sink boundary: transient ones are retried, terminal ones are not."""


class SinkError(RuntimeError):
    """Base of every sink failure."""


class TransientSinkError(SinkError):
    """Worth retrying: the same write may succeed later (dropped connection, timeout)."""


class TerminalSinkError(SinkError):
    """Retrying cannot help (bad data, refused command, out of memory)."""


class CapacityError(TerminalSinkError):
    """The store is, or would be, too full for this write."""

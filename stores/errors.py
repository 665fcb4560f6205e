"""The two kinds of failure every part shares: transient ones are worth another attempt,
terminal ones are not (dlt's split). Writers (sinks/), readers (feature_reader/) and the
store clients here derive their errors from these two.

Every subclass registers itself by name, so an error that crossed a process boundary as
(kind, message) is rebuilt as its own class (sinks/errors.py, ``from_wire``), never
classified by the text of its name.
"""

from __future__ import annotations

from typing import ClassVar


class MaterializerError(RuntimeError):
    """Base of every failure this project raises about a store or a request."""

    kinds: ClassVar[dict[str, type[MaterializerError]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        MaterializerError.kinds[cls.__name__] = cls


class TransientError(MaterializerError):
    """Worth retrying: the same call may succeed later (dropped connection, timeout)."""


class TerminalError(MaterializerError):
    """Retrying cannot help (bad data or request, refused command, bad TLS or login)."""

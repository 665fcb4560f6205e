"""What a push is refused with: the HTTP status, a type name and one line naming the row and column."""

from __future__ import annotations


class PushError(Exception):
    """A push refused before anything of it was written (``status`` 4xx), or one a store could
    not take (5xx, ``transient`` when a retry may fix it)."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadPush", transient: bool = False):
        super().__init__(message)
        self.status, self.kind, self.transient = status, kind, transient

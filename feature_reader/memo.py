"""A memo of repeated requests' work, bounded by entries and by the bytes it holds: when
either would be passed it is emptied whole (what is in use comes back at once), and one
entry over a quarter of the bytes is not kept. The reader's resolved selections and the
server's authorization decisions keep theirs here."""

from __future__ import annotations

import sys
from typing import Any


def names_bytes(names: tuple | None) -> int:
    """What a tuple of names costs to keep."""
    return sys.getsizeof(names) + sum(map(sys.getsizeof, names)) if names else 0


class BoundedMemo(dict):
    def __init__(self, max_entries: int, max_bytes: int):
        super().__init__()
        self.max_entries, self.max_bytes, self.bytes = max_entries, max_bytes, 0

    def keep(self, key: Any, value: Any, size: int) -> None:
        if size > self.max_bytes // 4:  # this large is not worth keeping
            return
        if len(self) >= self.max_entries or self.bytes + size > self.max_bytes:
            self.clear()
            self.bytes = 0
        self[key] = value
        self.bytes += size

"""The import's one error: what stopped it, one line per object, and nothing written."""

from __future__ import annotations


class FeastImportError(ValueError):
    """An import that cannot go on; ``problems`` holds one line per object (file, view, path)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))

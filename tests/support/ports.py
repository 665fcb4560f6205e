"""Port pickers for tests of servers that must move off a taken port."""

from __future__ import annotations


def first_then_real(first, real):
    """A stand-in for a port picker: ``first`` on its first call, then what ``real`` picks; and the calls."""
    calls = []

    def pick(*args):
        calls.append(args)
        return first if len(calls) == 1 else real(*args)

    return pick, calls

"""Shortest round-trip decimal text for floats, in the format's one canonical form.

The form is Python's ``repr`` with two changes: zero and negative zero are ``"0"``, and
an integral value has no ``".0"``. Python writes positional notation for decimal
exponents -4..15 and ``d.ddde±XX`` outside it; float32 features use the shortest digits
that parse back to the same float32, laid out by the same rule.

The column path (:func:`format_float_array`) lets Arrow's C++ shortest formatter do
the bulk and sends only the values whose layout may differ from Python's (exponent form,
tiny or huge magnitudes, negative zero, non-finite) through the scalar path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

# Python's repr switches to exponent form outside [1e-4, 1e16).
_POSITIONAL_LOW = 1e-4
_POSITIONAL_HIGH = 1e16


def _strip_dot_zero(text: str) -> str:
    return text[:-2] if text.endswith(".0") else text


def format_float64(value: float) -> str | None:
    """Canonical text of a float64, or None for NaN/inf (which are not written)."""
    if not math.isfinite(value):
        return None
    if value == 0.0:
        return "0"
    return _strip_dot_zero(repr(float(value)))


def format_float32(value: float) -> str | None:
    """Canonical text of the float32 nearest to ``value`` (shortest float32 digits)."""
    with np.errstate(over="ignore"):  # beyond float32 range becomes inf: not written
        v = np.float32(value)
    if not np.isfinite(v):
        return None
    if v == 0.0:
        return "0"
    sci = np.format_float_scientific(v, unique=True, trim="-", exp_digits=2)
    exponent = int(sci.rsplit("e", 1)[1])
    if -4 <= exponent < 16:
        return np.format_float_positional(v, unique=True, trim="-")
    return sci


def format_float(value: float, float32: bool = False) -> str | None:
    return format_float32(value) if float32 else format_float64(value)


def _rows_with_byte(text: pa.Array, byte: int) -> np.ndarray:
    """Indexes of the rows of a string array whose bytes contain ``byte`` (one scan of the data buffer)."""
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int32, count=text.offset + len(text) + 1)[text.offset :]
    data = text.buffers()[2]
    if data is None:
        return np.empty(0, np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
    hits = np.flatnonzero(raw == byte)
    if not hits.size:
        return np.empty(0, np.int64)
    return np.unique(np.searchsorted(offsets, hits + offsets[0], side="right") - 1)


def format_float_array(arr: pa.Array, float32: bool = False) -> tuple[pa.Array, int]:
    """Format a float64/float32 Arrow array column-wise.

    Returns (string array, number of non-finite values turned into nulls).

    Arrow's cast writes the same shortest digits as Python. It writes ``0`` for zero, and
    it lays out positionally the values Python lays out positionally, except some with
    many digits, which it writes with an exponent. So only values with an ``e`` in
    Arrow's text, tiny or huge magnitudes, negative zero and NaN/inf are fixed up, and
    the common case costs one cast and a few numpy passes.
    """
    # Arrow here, not at the top: the scalar path (the reader's) must import without pyarrow.
    import pyarrow as pa
    import pyarrow.compute as pc

    target = pa.float32() if float32 else pa.float64()
    if arr.type != target:
        # A float64 column declared float32 is rounded to float32 first, as the scalar does.
        with np.errstate(over="ignore"):
            arr = pc.cast(arr, target, safe=False)
    values = arr.to_numpy(zero_copy_only=False)  # nulls become NaN; Arrow keeps them null in the text
    text = pc.cast(arr, pa.string())
    finite = np.isfinite(values)
    non_finite_rows = np.flatnonzero(~finite & np.asarray(arr.is_valid().to_numpy(zero_copy_only=False)))
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(values)
        odd = finite & ((magnitude >= _POSITIONAL_HIGH) | ((magnitude < _POSITIONAL_LOW) & (values != 0)))
        odd |= (values == 0) & np.signbit(values)  # Arrow writes "-0"
    fix = np.union1d(np.flatnonzero(odd), _rows_with_byte(text, ord("e")))
    if non_finite_rows.size:
        fix = np.union1d(fix, non_finite_rows)
    if fix.size:
        # Rare: lay these out exactly as the scalar path does (None for NaN/inf: not written).
        fmt = format_float32 if float32 else format_float64
        mask = np.zeros(len(arr), dtype=bool)
        mask[fix] = True
        text = pc.replace_with_mask(text, pa.array(mask), pa.array([fmt(float(values[i])) for i in fix], pa.string()))
    return text, int(non_finite_rows.size)

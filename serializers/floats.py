"""Shortest round-trip decimal text for floats, in the format's one canonical form.

The form is Python's ``repr`` with two changes: zero and negative zero are ``"0"``, and
an integral value has no ``".0"``. Python writes positional notation for decimal
exponents -4..15 and ``d.ddde±XX`` outside it; float32 features use the shortest digits
that parse back to the same float32, laid out by the same rule.

The column path (:func:`format_float_array`) lets Arrow's C++ shortest formatter do
the bulk and sends only the values whose layout differs from Python's (exponent form,
zeros, non-finite) through the scalar path.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def format_float_array(arr: pa.Array, float32: bool = False) -> tuple[pa.Array, int]:
    """Format a float64/float32 Arrow array column-wise.

    Returns (string array, number of non-finite values turned into nulls).
    """
    target = pa.float32() if float32 else pa.float64()
    if arr.type != target:
        # A float64 column declared float32 is rounded to float32 first, as the scalar does.
        with np.errstate(over="ignore"):
            arr = pc.cast(arr, target, safe=False)
    values = arr.to_numpy(zero_copy_only=False)  # nulls become NaN; the null mask is kept below
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
    finite = np.isfinite(values)
    non_finite = int(np.count_nonzero(valid & ~finite))

    text = pc.cast(arr, pa.string())
    magnitude = np.abs(values)
    # Values whose layout Arrow and Python agree on: positional in both, not zero.
    fast = finite & (magnitude >= _POSITIONAL_LOW) & (magnitude < _POSITIONAL_HIGH)
    has_exponent = np.asarray(pc.match_substring(text, "e").fill_null(False).to_numpy(zero_copy_only=False))
    fast &= ~has_exponent
    keep = valid & finite
    zero = keep & (values == 0)
    slow_idx = np.flatnonzero(keep & ~fast & ~zero)
    out = text
    if slow_idx.size:
        # Rare (tiny or huge magnitudes): lay these out exactly as the scalar path does.
        fmt = format_float32 if float32 else format_float64
        py = text.to_pylist()
        for i in slow_idx:
            py[i] = fmt(float(values[i]))
        out = pa.array(py, pa.string())
    # Zero and negative zero are "0"; NaN/inf are not written (null).
    out = pc.if_else(pa.array(zero), pa.scalar("0"), out)
    out = pc.if_else(pa.array(~keep), pa.scalar(None, pa.string()), out)
    return out, non_finite

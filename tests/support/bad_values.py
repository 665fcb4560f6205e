"""What the stores hold for a good value, by the rules feature_defs/README.md states (not the
job's code): a date's as-of time, whether a value is stored at all, and whether a value read
back from SQL's JSON is the one written (shared by the bad-values and wide-source tests)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np


def f32(x: float) -> np.float32:
    with np.errstate(over="ignore"):
        return np.float32(x)


def as_of(day: dt.date) -> dt.datetime:
    """A date's snapshot is as of the next midnight UTC."""
    return dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)


def written(feature, value) -> bool:
    """Whether a good value is stored: null and NaN/inf floats are not."""
    return value is not None and not (feature.type == "float" and not math.isfinite(value))


def same_json(feature, stored, value) -> bool:
    if feature.type == "float":
        return f32(stored) == f32(value) if feature.precision == "float32" else float(stored) == value
    if feature.type == "embedding":
        return np.array_equal(np.asarray(stored, np.float32), np.asarray(value, np.float32))
    return stored == value and type(stored) is type(value)

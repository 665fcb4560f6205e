"""What a Redis hash must hold for one entity, derived apart from the code under test: each
value through the scalar reference encoder (serializers/scalar.py, golden-tested one value at
a time), never the column-wise encoder the sinks and the job write with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

from serializers.scalar import encode, field_id

LISTS = ("embedding", "int_list", "string_list", "float_list")


def is_null(value) -> bool:
    """None, or a scalar pandas takes for missing (NaN, NaT): what a null reads as from a DataFrame."""
    return value is None or (not isinstance(value, (list, np.ndarray)) and pd.isna(value))


def row_of(batch: pa.RecordBatch, row: int) -> dict:
    """One row of an Arrow batch as Python values, column by column."""
    return {name: batch.column(name)[row].as_py() for name in batch.schema.names}


def expected_hash(
    features: Iterable, values: Mapping, freshness_field: bytes, as_of: int, untouched: Mapping[bytes, bytes] | None = None
) -> dict[bytes, bytes]:
    """The hash after a write of ``values`` (feature name -> source value, a dict or a pandas row)
    as of ``as_of``: every feature (anything with ``name``, ``type`` and ``options``: a
    FeatureSpec or a definition's feature) whose value is written, the freshness field, and
    ``untouched``, the fields the write leaves as they were (another source's). A null value, or
    one the encoder does not write (NaN, ±inf), has no field."""
    out = dict(untouched or {})
    for feature in features:
        value = values[feature.name]
        if is_null(value):
            continue
        if feature.type in LISTS:
            value = list(value)  # a pandas row holds numpy arrays
        data = encode(feature.type, value, **feature.options)
        if data is not None:
            out[field_id(feature.stored_name)] = data
    out[freshness_field] = str(as_of).encode()
    return out


def entity_keys(client, namespace: str | None = None) -> list[bytes]:
    """Every key but the hashes that describe the entity types (named as a key prefix, no
    ':<id>' after it: serializers/FORMAT.md "The stores' description")."""
    colons = 2 if namespace else 1
    return [k for k in client.scan_iter() if k.count(b":") >= colons]


def entity_count(client, namespace: str | None = None) -> int:
    """Entity hashes in the database (DBSIZE less the descriptions)."""
    return len(entity_keys(client, namespace))

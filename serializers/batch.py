"""Encode a whole Arrow record batch of features: what the partition writers consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from serializers.columnar import encode_column
from serializers.scalar import field_id


@dataclass(frozen=True)
class FeatureSpec:
    """What the encoder needs of one feature (small and picklable)."""

    name: str
    type: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def field(self) -> bytes:
        return field_id(self.name)


@dataclass
class EncodedBatch:
    ids: list[str]
    """Entity ids (key parts joined by ':'), one per row."""
    columns: list[pa.Array]
    """One binary array per feature, null where the value is not written."""
    non_finite: int
    """NaN/±inf values turned into nulls."""
    value_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Per feature: total bytes of its non-null encoded values."""

    def __len__(self) -> int:
        return len(self.ids)


def resp_arg_bytes(lengths: np.ndarray) -> np.ndarray:
    """Bytes of RESP bulk strings of the given lengths: ``$<len>\\r\\n<data>\\r\\n``."""
    digits = np.floor(np.log10(np.maximum(lengths, 1))).astype(np.int64) + 1
    return lengths + digits + 5


def encode_batch(batch: pa.RecordBatch, specs: list[FeatureSpec], id_column: str = "_id") -> EncodedBatch:
    columns, non_finite, value_bytes = [], 0, []
    for spec in specs:
        encoded, bad = encode_column(spec.type, batch.column(spec.name), **spec.options)
        non_finite += bad
        columns.append(encoded)
        lengths = pc.binary_length(encoded).drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
        value_bytes.append(int(resp_arg_bytes(lengths).sum()))
    ids = batch.column(id_column).to_pylist()
    return EncodedBatch(ids=ids, columns=columns, non_finite=non_finite, value_bytes=np.array(value_bytes, np.int64))

"""Encode a whole Arrow record batch of features: what the partition writers consume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from serializers.columnar import encode_column
from serializers.scalar import field_id

AS_OF_US = "_as_of_us"
"""The column of a batch holding each row's as-of time in UTC epoch microseconds (a source
selected by event time; beside ``_as_of``, its whole seconds): the writers order writes by it."""


@dataclass(frozen=True)
class FeatureSpec:
    """What the encoder needs of one feature (small and picklable)."""

    name: str
    """The column holding its values (the feature's name)."""
    type: str
    options: dict[str, Any] = field(default_factory=dict)
    stored_as: str | None = None
    """What its values are stored under (field id, JSON key), when not ``name``."""

    @property
    def stored_name(self) -> str:
        return self.stored_as or self.name

    @property
    def field(self) -> bytes:
        return field_id(self.stored_name)


def feature_specs(features) -> tuple[FeatureSpec, ...]:
    """The specs of definitions' features (``FeatureDef``: name, type, options, stored_as).
    json values reach the encoders as canonical text already (checked before): not parsed again."""
    canonical = {"json": {"canonical": True}}
    return tuple(FeatureSpec(f.name, f.type, {**f.options, **canonical.get(f.type, {})}, f.stored_as) for f in features)


@dataclass
class EncodedBatch:
    ids: pa.Array
    """Entity ids (key parts joined by ':'), one per row (string)."""
    columns: list[pa.Array]
    """One binary array per feature, null where the value is not written."""
    non_finite: int
    """NaN/±inf values turned into nulls."""
    subsecond: pa.Array | None = None
    """Per row, the microseconds of its as-of time past the whole second (0 to 999,999), for
    a source selected by event time; None: whole seconds."""

    def __len__(self) -> int:
        return len(self.ids)


def encode_batch(batch: pa.RecordBatch, specs: list[FeatureSpec], id_column: str = "_id") -> EncodedBatch:
    columns, non_finite = [], 0
    for spec in specs:
        encoded, bad = encode_column(spec.type, batch.column(spec.name), **spec.options)
        non_finite += bad
        columns.append(encoded)
    return EncodedBatch(ids=batch.column(id_column), columns=columns, non_finite=non_finite)

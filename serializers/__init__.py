"""Online feature format v1: field ids, value encoding and decoding (FORMAT.md)."""

from serializers.scalar import (
    FEATURE_TYPES,
    BadValue,
    DecodeError,
    decode,
    encode,
    field_id,
    field_id_int,
)
from serializers.keys import as_of_epoch, entity_id, freshness_field, freshness_field_name, key_prefix, redis_key

__all__ = [
    "FEATURE_TYPES",
    "as_of_epoch",
    "entity_id",
    "freshness_field",
    "key_prefix",
    "redis_key",
    "BadValue",
    "DecodeError",
    "decode",
    "encode",
    "encode_column",
    "field_id",
    "field_id_int",
    "freshness_field_name",
]


def __getattr__(name: str):
    # encode_column is the writer's (Arrow columns): imported on first use, so that reading
    # (feature_reader, feature_defs) does not need pyarrow, which only the [spark] extra installs.
    if name == "encode_column":
        from serializers.columnar import encode_column

        return encode_column
    raise AttributeError(f"module 'serializers' has no attribute {name!r}")

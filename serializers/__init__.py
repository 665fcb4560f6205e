"""Online feature format v1: field ids, value encoding and decoding (FORMAT.md).

The column-wise encoder the writers use (over Arrow) is ``serializers.columnar``: not
imported here, so a reader decodes without pyarrow."""

from serializers.keys import (
    as_of_epoch,
    entity_id,
    freshness_field,
    freshness_field_name,
    key_prefix,
    redis_key,
    subsecond_field,
    subsecond_field_name,
)
from serializers.scalar import (
    FEATURE_TYPES,
    BadValue,
    DecodeError,
    decode,
    encode,
    field_id,
    field_id_int,
)

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
    "field_id",
    "field_id_int",
    "freshness_field_name",
    "subsecond_field",
    "subsecond_field_name",
]

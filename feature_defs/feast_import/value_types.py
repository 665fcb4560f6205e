"""Feast's value types to this project's feature and key types: one table, each choice with
the words the import prints for it.

Feast names a field's type by its ``ValueType`` (``feast.types.from_feast_type``: Float32 is
FLOAT, Array(Int64) is INT64_LIST, a Struct is STRUCT). What Feast's feature server returns
for each (``feature_server_utils._value_to_native``), the answer ``materialize serve`` gives
too, decides the nearest type here: a UnixTimestamp is an integer of epoch seconds, a Uuid or
a Decimal its text, a Map, Json or Struct a JSON value.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TypeChoice:
    """What a Feast field becomes: a feature type and its options, or None (left out)."""

    type: str | None
    why: str
    """The choice in words, e.g. ``float, precision float32`` or why nothing fits."""
    options: dict = field(default_factory=dict)


def _choice(feature_type: str, why: str = "", **options) -> TypeChoice:
    return TypeChoice(feature_type, why or feature_type, options)


_NO_BYTES = "no type here holds raw bytes (string is UTF-8 text, json is JSON)"
SCALARS: dict[str, TypeChoice] = {
    "FLOAT": _choice("float", "float, precision float32 (written in its shortest float32 form)", precision="float32"),
    "DOUBLE": _choice("float"),
    "INT32": _choice("int", "int (an int64 here)"),
    "INT64": _choice("int"),
    "STRING": _choice("string"),
    "BOOL": _choice("bool"),
    "UNIX_TIMESTAMP": _choice(
        "int", "int: epoch seconds, as Feast's feature server returns it (of a timestamp or date column: its UTC seconds, floored)"
    ),
    "UUID": _choice("string", "string: the UUID's text, as Feast's feature server returns it"),
    "TIME_UUID": _choice("string", "string: the UUID's text, as Feast's feature server returns it"),
    "DECIMAL": _choice("string", "string: the decimal's text, as Feast stores and returns it"),
    "MAP": _choice("json", "json: a JSON object, as Feast's clients read it"),
    "SCALAR_MAP": _choice("json", "json: a JSON object"),
    "JSON": _choice("json", "json: the JSON value"),
    "STRUCT": _choice("json", "json: a JSON object, as Feast's clients read it"),
    "BYTES": TypeChoice(None, _NO_BYTES),
    "PDF_BYTES": TypeChoice(None, _NO_BYTES),
    "IMAGE_BYTES": TypeChoice(None, _NO_BYTES),
    "ZONED_TIMESTAMP": TypeChoice(None, "no type here keeps a timestamp with its time zone"),
    "UNKNOWN": TypeChoice(None, "Feast gives it no value type"),
    "NULL": TypeChoice(None, "Feast's NULL type holds no values"),
}

# A Feast set is a list without repeats: its values are carried as the list type.
_LISTS: dict[str, TypeChoice] = {
    "INT32": _choice("int_list", "int_list (int64 values)"),
    "INT64": _choice("int_list"),
    "STRING": _choice("string_list"),
    "UUID": _choice("string_list", "string_list of the UUIDs' text"),
    "TIME_UUID": _choice("string_list", "string_list of the UUIDs' text"),
    "DECIMAL": _choice("string_list", "string_list of the decimals' text"),
    "BOOL": _choice("json", "json: a JSON array of booleans (no bool list type here)"),
    "MAP": _choice("json", "json: a JSON array of objects (of an array of strings: each one's JSON text)", json_text_elements=True),
    "JSON": _choice(
        "json", "json: a JSON array (of an array of strings: each one's JSON text, as Feast reads it)", json_text_elements=True
    ),
    "STRUCT": _choice("json", "json: a JSON array of objects"),
    "BYTES": TypeChoice(None, _NO_BYTES),
    "UNIX_TIMESTAMP": TypeChoice(None, "no list type here holds timestamps"),
}


def feature_type(value_type: str, vector_length: int = 0) -> TypeChoice:
    """The feature type of a Feast field of ``value_type`` (a ValueType name)."""
    if value_type in SCALARS:
        return SCALARS[value_type]
    base, _, kind = value_type.rpartition("_")
    if kind not in ("LIST", "SET") or not base:
        return TypeChoice(None, f"no mapping for Feast's {value_type}")
    if base == "VALUE":  # Array(Array(...)): nested lists
        return _choice("json", "json: nested JSON arrays")
    if base in ("FLOAT", "DOUBLE"):
        if kind == "LIST" and vector_length > 0:
            lost = " (Float64 values kept as float32)" if base == "DOUBLE" else ""
            return _choice("embedding", f"embedding, dimension {vector_length}: Feast's vector_length{lost}", dimension=vector_length)
        if base == "FLOAT":
            return _choice("float_list", "float_list, precision float32 (an embedding needs Feast's vector_length)", precision="float32")
        return _choice("float_list", "float_list (an embedding needs Feast's vector_length)")
    return _LISTS.get(base, TypeChoice(None, f"no mapping for Feast's {value_type}"))


KEY_TYPES = {"INT32": "int", "INT64": "int", "STRING": "string"}
"""Join key types: keys here are integers (written in decimal) or strings."""


def key_type(value_type: str) -> str | None:
    return KEY_TYPES.get(value_type)

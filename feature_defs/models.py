"""Typed models of the feature definitions (one YAML file per source table)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from feature_defs.yamlio import KeyProblem
from serializers import field_id_int, freshness_field_name

FeatureName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,127}$")]
# A feature name, or one with a version after "@" (recent_store_ids@2): never another feature's name.
StoredName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,127}(@[1-9][0-9]{0,5})?$")]
# Identifiers end up in SQL and Delta paths: keep them boring.
Identifier = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")]
# A source table's column: any name a table may have (dots, spaces, backticks, any letters),
# read quoted (jobs/transforms.col); it names no storage. No control characters: it appears
# in one-line messages.
ColumnName = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]{1,255}$")]
Prefix = Annotated[str, Field(pattern=r"^[a-z0-9_]{1,16}$")]
FeatureType = Literal["float", "int", "bool", "string", "embedding", "int_list", "string_list", "json", "float_list"]
# A catalog table: name or db.name (Spark's catalog; Feast's SparkSource `table`).
TableName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,2}$")]
Severity = Literal["blocking", "warning"]
"""blocking: a failed check stops the run before any write; warning: reported only."""
# Strict: YAML 1.1 reads yes/no/on/off as booleans, and lax pydantic would take `max_null_fraction: yes`
# for 1.0 (no null check) or `ttl_seconds: on` for 1 second.
Fraction = Annotated[float, Field(strict=True, ge=0, le=1)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
JSON_MAX_BYTES = 65536
"""A json value's default cap on its encoded size (format 1.1)."""


def yaml_text(value: Any) -> str:
    """A loaded value as YAML would print it (when no file says how it was written)."""
    return str(value).lower() if isinstance(value, bool) else "null" if value is None else str(value)


_EXPECTED = {"string": "a string", "bool": "a boolean", "int": "an integer", "float": "a finite number"}


def value_type_problem(feature_type: str, value: Any, of: str = "the feature") -> str | None:
    """Why ``value`` (as YAML loaded it) is not a value of a feature of this type, and what to
    write instead; None when it is one, or when the type has no scalar values. ``of`` names
    what has the type; ``{written}`` stands for the value as the file spells it (see
    yamlio.KeyProblem).

    A check against a value of another type fails every row: a string feature's
    ``allowed_values: [NO, SE]`` loads as [False, 'SE'], and no 'NO' row would pass."""
    if feature_type not in _EXPECTED:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {
        "string": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": number and (isinstance(value, int) or math.isfinite(value)),
    }[feature_type]
    if fits:
        return None
    if isinstance(value, str):
        found = "'{written}', a string"
    elif number:
        if feature_type in ("string", "bool"):
            found = "{written}, which YAML reads as a number"
        else:
            found = "{written}, " + ("a float" if math.isfinite(value) else "not a finite number")
    else:
        kind = f"the boolean {str(value).lower()}" if isinstance(value, bool) else "null" if value is None else f"a {type(value).__name__}"
        found = f"{{written}}, which YAML reads as {kind}"
    fix = {
        "string": "quote it: '{written}'",
        "bool": "write true or false, unquoted",
        "int": "write an integer" + (", unquoted" if isinstance(value, str) else ""),
        "float": "write a number" + (", unquoted" if isinstance(value, str) else ""),
    }[feature_type]
    return f"expected {_EXPECTED[feature_type]} ({of} is of type {feature_type}), found {found}: {fix}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyColumn(_Strict):
    name: Identifier
    """Column name of this key part (in the entity and, by default, in every source)."""
    type: Literal["int", "string"]
    """int parts are written in decimal, string parts as UTF-8 (no ':' or control characters)."""


class EntityDef(_Strict):
    name: Identifier
    """Entity type name, e.g. consumer."""
    prefix: Prefix
    """Short Redis key prefix, e.g. c for consumer."""
    keys: list[KeyColumn] = Field(min_length=1)
    """Key parts, in the order they are joined with ':' in the key."""
    ttl_seconds: PositiveInt | None = None
    """Redis key TTL (plus up to 10% jitter); None keeps keys until removed."""
    sql_table: Identifier
    """Table of this entity type in the SQL store."""
    description: str = ""


class FeatureDef(_Strict):
    name: FeatureName
    type: FeatureType
    stored_as: StoredName | None = None
    """The name its values are stored under (Redis field id, SQL JSON key); defaults to name.
    A new one gives the feature fresh storage (a change of type); an old feature's keeps its
    values under a new name (a rename). See stored.lock in the definitions' README."""
    column: ColumnName | None = None
    """Source column (wide layout) or feature_name value (long layout); defaults to name."""
    dimension: PositiveInt | None = None
    """embedding only: the fixed number of float32 values."""
    precision: Literal["float64", "float32"] | None = None
    """float and float_list only: float32 features are written in their shortest float32 form
    (a float_list's elements as packed float32)."""
    compression: Literal["snappy", "none"] | None = None
    """int_list/string_list: Snappy (default) or none; json, float_list: none (default) or Snappy."""
    max_bytes: PositiveInt | None = None
    """json only: a larger encoded value is bad input (default 65,536)."""
    json_text_elements: bool | None = None
    """json only: a column that is an array of strings holds each element's JSON text (Feast's
    Array(Json)): the value is the array of those elements; an element that is not one JSON
    value is bad input. Any other column is read as without it."""
    max_length: PositiveInt | None = None
    """string only: longer strings (in characters) are bad input."""
    max_null_fraction: Fraction | None = None
    """Data-quality check: at most this share of entities without a value (default: quality.max_null_fraction)."""
    min_value: float | None = None
    """float/int only, optional check: values below are unexpected."""
    max_value: float | None = None
    """float/int only, optional check: values above are unexpected."""
    allowed_values: list[str | int | bool] | None = None
    """string/int/bool only, optional check: any other value is unexpected."""
    severity: Severity = "blocking"
    """Of this feature's range and allowed-values checks."""
    description: str = ""

    @field_validator("min_value", "max_value", "allowed_values", mode="before")
    @classmethod
    def _values_fit_type(cls, value: Any, info: ValidationInfo) -> Any:
        """Each value has the feature's type as YAML loaded it (no coercion: 'NO' must not become false)."""
        feature_type = info.data.get("type")
        applies = {"allowed_values": ("string", "int", "bool")}.get(info.field_name, ("float", "int"))
        if value is None or feature_type not in applies:
            return value  # a missing type, or an option the type does not take, is reported on its own
        if info.field_name == "allowed_values":
            items = [((i,), item) for i, item in enumerate(value)] if isinstance(value, list) else []
        else:
            items = [((), value)]
        for place, item in items:
            problem = value_type_problem(feature_type, item)
            if problem:
                raise KeyProblem(place, problem, yaml_text(item))  # reported at that value's line
        return value

    @model_validator(mode="after")
    def _options_fit_type(self) -> FeatureDef:
        allowed = {
            "dimension": {"embedding"},
            "precision": {"float", "float_list"},
            "compression": {"int_list", "string_list", "json", "float_list"},
            "max_bytes": {"json"},
            "json_text_elements": {"json"},
            "max_length": {"string"},
            "min_value": {"float", "int"},
            "max_value": {"float", "int"},
            "allowed_values": {"string", "int", "bool"},
        }
        for option, types in allowed.items():
            if getattr(self, option) is not None and self.type not in types:
                raise ValueError(f"option '{option}' does not apply to type {self.type} (only {', '.join(sorted(types))})")
        if self.type == "embedding" and self.dimension is None:
            raise ValueError("an embedding needs a 'dimension'")
        if self.min_value is not None and self.max_value is not None and self.min_value > self.max_value:
            raise ValueError(f"min_value {self.min_value} is above max_value {self.max_value}")
        return self

    @property
    def source_column(self) -> str:
        return self.column or self.name

    @property
    def options(self) -> dict:
        """Keyword options for serializers.encode/decode."""
        opts = {"precision": self.precision, "dimension": self.dimension, "max_length": self.max_length}
        if self.type in ("int_list", "string_list"):
            opts["compression"] = self.compression or "snappy"
        if self.type in ("json", "float_list"):  # packed floats rarely shrink: uncompressed unless declared
            opts["compression"] = self.compression or "none"
        if self.type == "json":
            opts["max_bytes"] = self.max_bytes or JSON_MAX_BYTES
        return {k: v for k, v in opts.items() if v is not None}

    @property
    def stored_name(self) -> str:
        """What its values are stored under: the Redis field id is xxh32 of it, the SQL JSON key is it."""
        return self.stored_as or self.name

    @property
    def encoding(self) -> str:
        """How its values are stored, as recorded in stored.lock: the type and the options
        that change the bytes (float/float32, embedding/32, int_list/snappy, float_list/float32/snappy)."""
        if self.type == "float_list":  # as json: only what is not the default is named
            return "/".join(["float_list"] + ["float32"] * (self.precision == "float32") + ["snappy"] * (self.compression == "snappy"))
        detail = {
            "float": self.precision if self.precision == "float32" else None,
            "embedding": self.dimension,
            "int_list": self.compression or "snappy",
            "string_list": self.compression or "snappy",
            "json": "snappy" if self.compression == "snappy" else None,
        }.get(self.type)
        return self.type if detail is None else f"{self.type}/{detail}"

    @property
    def field_id(self) -> int:
        return field_id_int(self.stored_name)


def expectation_class_name(snake: str) -> str:
    """great-expectations class of an expectation name: expect_a_b -> ExpectAB."""
    return "".join(part.capitalize() for part in snake.split("_"))


class ExtraExpectation(_Strict):
    """A great-expectations 1.x expectation by its snake_case name, run on the snapshot."""

    type: Annotated[str, Field(pattern=r"^expect_[a-z0-9_]+$")]
    """e.g. expect_column_values_to_be_between (class ExpectColumnValuesToBeBetween)."""
    kwargs: dict[str, Any] = {}
    """Its arguments, e.g. {column: orders_7d, min_value: 0, max_value: 500}."""
    severity: Severity = "warning"

    @property
    def class_name(self) -> str:
        return expectation_class_name(self.type)


class SourceDef(_Strict):
    name: Identifier
    """The ETL table's name; also the source name in the freshness field and SQL rows."""
    entity: Identifier
    location: str | None = Field(default=None, min_length=1)
    """The table's path (relative to the data root, or an absolute path / URI): a Delta table,
    or Parquet files or a folder of them (``format: parquet``). Either this or ``table``."""
    format: Literal["delta", "parquet"] = "delta"
    """What is at ``location``: a Delta table, or Parquet (one file, or a folder, partitioned or not)."""
    table: TableName | None = None
    """A table of Spark's catalog (``db.name``), instead of a ``location``."""
    layout: Literal["wide", "long"]
    """wide: one row per entity with a column per feature; long: entity, feature_name, value rows."""
    select_by: Literal["date", "event_time"] = "date"
    """date: a run reads the rows of one date (``date_column``); event_time: a run takes each
    entity's latest row by event time (``timestamp_column``) up to the end of its date, as
    ``feast materialize`` does, and stores that event time as the entity's as-of time."""
    date_column: ColumnName = "ds"
    """Date partition column (select_by: date): a run reads the rows of one date."""
    timestamp_column: ColumnName | None = None
    """select_by date: orders rows of one entity within a date (the latest wins); select_by
    event_time: the row's event time (Feast's ``timestamp_field``), required."""
    created_column: ColumnName | None = None
    """select_by event_time only: breaks ties of event time, the latest wins (Feast's ``created_timestamp_column``)."""
    lookback_seconds: NonNegativeInt | None = None
    """select_by event_time only: how late a row may arrive and still be loaded; an incremental
    run reads again this far before the end of the last window it recorded (default: one day)."""
    on_tie: Literal["fail", "keep_one"] = "fail"
    """An entity's latest rows tied (same timestamp and created time, different feature values):
    fail: the gate's uniqueness check blocks the run (which version is right is unknown);
    keep_one: one of them is written (the same on every run) and the summary counts the key, as
    Feast keeps one (imports set it)."""
    key_columns: list[ColumnName] | None = None
    """Source columns of the entity key parts, in key order; defaults to the entity's key names."""
    name_column: ColumnName | None = None
    """long only: the column holding the feature name."""
    value_column: ColumnName | None = None
    """long only: the column holding the value."""
    schedule: str = "nightly"
    """Schedule group (one nightly DAG per group)."""
    push_source: Identifier | None = None
    """select_by event_time only: the name pushes to this source use (Feast's PushSource name,
    ``POST /push``'s ``push_source_name``; feature_push/README.md). Sources may share one."""
    max_age_seconds: PositiveInt | None = None
    """Readers withhold this source's values (status OUTSIDE_MAX_AGE) once its stored as-of
    time is older than this; None: never too old (a request may still set its own)."""
    feast_ttl_seconds: NonNegativeInt | None = None
    """The ``ttl`` of the Feast view this source was imported from (0: none), written by
    ``import-feast`` for the record: nothing reads it. Feast 0.67 serves a value however old;
    ``max_age_seconds`` set to it withholds older ones (feature_defs/feast_import/README.md)."""
    features: list[FeatureDef] = Field(min_length=1)
    expectations: list[ExtraExpectation] = []
    """Further great-expectations checks of this source, beyond those derived from the features."""
    description: str = ""

    @model_validator(mode="after")
    def _layout_columns(self) -> SourceDef:
        if self.layout == "long":
            missing = [c for c in ("name_column", "value_column") if getattr(self, c) is None]
            if missing:
                raise ValueError(f"a long layout needs {' and '.join(missing)}")
        else:
            extra = [c for c in ("name_column", "value_column") if getattr(self, c) is not None]
            if extra:
                raise ValueError(f"{' and '.join(extra)} only apply to the long layout")
        return self

    @model_validator(mode="after")
    def _where_and_selection(self) -> SourceDef:
        if (self.location is None) == (self.table is None):
            raise ValueError("a source reads either a 'location' (a path) or a 'table' (Spark's catalog), not both or neither")
        if self.table is not None and "format" in self.model_fields_set:
            raise ValueError("'format' applies to a 'location'; a catalog 'table' knows its own format")
        if self.select_by == "event_time":
            if self.timestamp_column is None:
                raise ValueError("select_by: event_time needs a 'timestamp_column' (the event time)")
            if "date_column" in self.model_fields_set:
                raise ValueError("select_by: event_time reads no 'date_column': remove it, or select_by: date")
            if self.layout == "long":
                # a window holding some of an entity's feature rows would delete the others
                raise ValueError("select_by: event_time takes the wide layout (one row per entity and event time, as Feast's sources)")
        else:
            extra = [c for c in ("created_column", "lookback_seconds", "push_source") if getattr(self, c) is not None]
            if extra:
                raise ValueError(f"{' and '.join(extra)} appl{'y' if len(extra) > 1 else 'ies'} only to select_by: event_time")
        return self

    @property
    def by_event_time(self) -> bool:
        return self.select_by == "event_time"

    @property
    def freshness_field_id(self) -> int:
        return field_id_int(freshness_field_name(self.name))

    def feature(self, name: str) -> FeatureDef:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"source {self.name!r} has no feature {name!r}")


FeatureRef = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}(:[a-z][a-z0-9_]{0,127})?$")]


class FeatureServiceDef(_Strict):
    """A named set of features read together (Feast's feature service): ``source:feature``
    references, or a source's name for all of its features."""

    name: Identifier
    features: list[FeatureRef] = Field(min_length=1)
    description: str = ""


class FeatureServicesFile(_Strict):
    feature_services: list[FeatureServiceDef] = Field(min_length=1)


class EntitiesFile(_Strict):
    entities: list[EntityDef] = Field(min_length=1)


class SourceFile(_Strict):
    source: SourceDef

"""Declarative feature definitions: entity types and one YAML file per source table."""

from feature_defs.loader import DEFAULT_DIR, DefinitionError, Definitions, load_definitions
from feature_defs.models import EntityDef, FeatureDef, KeyColumn, SourceDef

__all__ = [
    "DEFAULT_DIR",
    "DefinitionError",
    "Definitions",
    "EntityDef",
    "FeatureDef",
    "KeyColumn",
    "SourceDef",
    "load_definitions",
]

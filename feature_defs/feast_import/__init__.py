"""Feast repositories to definition files: ``materialize import-feast`` (README.md here).

Feast's own code reads the repository, in the user's Feast environment (feast_env.py runs
feast_dump.py there); this package maps what it prints to entities, sources and feature
services (mapping.py, value_types.py) and writes them (output.py). It never imports Feast.
"""

from feature_defs.feast_import.command import DEFAULT_TIMEOUT, Imported, default_out, import_dump, import_feast, report
from feature_defs.feast_import.errors import FeastImportError

__all__ = ["DEFAULT_TIMEOUT", "FeastImportError", "Imported", "default_out", "import_dump", "import_feast", "report"]

"""What can be wrong with a source's table, one class each (raised by
jobs/pipeline/source_table.py and the schema check). Spark-free, so the command line can name
them in its one-line error handling without importing Spark."""

from __future__ import annotations

from fm_config import ConfigError
from stores.errors import TerminalError, TransientError


class SourceNotFound(FileNotFoundError):
    """Nothing to read where the source says: no table or files at its location, no such
    catalog table or database. Readiness counts it as no rows yet; a run fails on it."""


class SourceUnreadable(TerminalError):
    """Something is there but cannot be read as the source says (files that are not Parquet, a damaged table)."""


class CatalogUnavailable(TransientError):
    """The catalog did not answer (its metastore is down or unreachable): worth another try."""


class CatalogNotConfigured(ConfigError):
    """A source names a catalog table and the config sets no catalog."""


class SchemaDriftError(ValueError):
    """The source table does not have the columns or types its definition declares."""

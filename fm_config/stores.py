"""The online stores' names, one per store everywhere (config, command line, reader, ledger,
reports): ``redis`` and ``sql`` (the SQL store: CockroachDB or PostgreSQL).

``cockroach``, the SQL store's name before, is still accepted where a name is read (the
config's ``sinks`` and ``reader.stores``, ``--sink``, ``--store``, ledger rows written before),
with a one-line notice where a person wrote it. It will be refused in a later release.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from pydantic import BeforeValidator, ValidationInfo

log = logging.getLogger(__name__)

STORES = ("redis", "sql")
OLD_NAMES = {"cockroach": "sql"}
_noticed: set[str] = set()


def store_name(name: str, where: str | None = None) -> str:
    """``name`` as the store is called now; an old name is said once per place (``where``;
    None: data written before, such as a ledger row, renamed without a word)."""
    new = OLD_NAMES.get(name)
    if new is None:
        return name
    if where is not None and where not in _noticed:
        _noticed.add(where)
        log.warning("%s: %r is the SQL store's old name, now %r (the old name still works, for a while)", where, name, new)
    return new


def _from_config(value, info: ValidationInfo):
    return store_name(value, info.field_name) if isinstance(value, str) else value


StoreName = Annotated[Literal["redis", "sql"], BeforeValidator(_from_config)]
"""A store's name in the config: ``redis`` or ``sql`` (``cockroach`` read as ``sql``, with a notice)."""

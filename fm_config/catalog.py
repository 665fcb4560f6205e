"""Spark's catalog: where sources that name a ``table`` (``db.name``) rather than a location
are looked up. Spark-free: jobs/spark.py turns it into session settings."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from fm_config.base import Settings

CATALOG_HELP = "set spark.catalog in conf/<env>/*.yaml (type: hive with a metastore_uri or metastore_dir; conf/README.md#catalog)"


class CatalogConf(Settings):
    type: Literal["none", "hive", "session"] = "none"
    """none: no catalog (a ``table:`` source fails, saying how to set one); hive: Spark's Hive
    support, at ``metastore_uri`` or ``metastore_dir``; session: the catalog the Spark session
    already has (set by the cluster's spark-defaults/hive-site.xml, or ``spark.extra``)."""
    metastore_uri: str | None = None
    """hive: a Hive metastore service, thrift://host:9083 (several: comma-separated). Any
    number of processes share it."""
    metastore_dir: str | None = None
    """hive: an embedded Derby metastore in this local folder (relative: under the project
    root). One process at a time: a second one fails while the first runs."""
    warehouse: str | None = None
    """Where tables created through this session keep their files (spark.sql.warehouse.dir); reads
    need none. Default: <metastore_dir>/warehouse with a metastore_dir, else Spark's."""

    @model_validator(mode="after")
    def _where(self) -> CatalogConf:
        given = [k for k in ("metastore_uri", "metastore_dir", "warehouse") if getattr(self, k) is not None]
        if self.type != "hive":
            if given:
                raise ValueError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to type: hive")
            return self
        if (self.metastore_uri is None) == (self.metastore_dir is None):
            raise ValueError("type: hive needs either a metastore_uri (a metastore service) or a metastore_dir (embedded), not both")
        if self.metastore_uri is not None:
            bad = [u for u in self.metastore_uri.split(",") if not u.strip().startswith("thrift://")]
            if bad:
                raise ValueError(f"metastore_uri: {bad[0].strip()!r} is not a thrift://host:port address")
        return self

    @property
    def configured(self) -> bool:
        return self.type != "none"

    def describe(self) -> str:
        """Where tables are looked up, for messages: no password is ever part of it."""
        if self.type == "hive":
            return f"Hive metastore {self.metastore_uri}" if self.metastore_uri else f"embedded Hive metastore in {self.metastore_dir}"
        return "the Spark session's catalog" if self.type == "session" else "no catalog"

"""The soak's data: the standard table for two dates (the second with other values: the
"nightly" run), written by the real job; and, independently of the job and the reader,
the values each entity must be answered with, read from the table's Parquet files."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

OLD_DATE = dt.date(2026, 11, 20)
NEW_DATE = OLD_DATE + dt.timedelta(days=1)
PUSHED, PUSH_SOURCE = "soak_pushed", "soak_push"
"""A source of the standard entity selected by event time that takes pushes (the push phase):
no table, no read by the load; its pushes share the server and the stores with the reads."""
ENV = "soak"
"""The env of the server and the nightly run (a conf folder of its own: write_conf)."""
IN_PROCESS_ENV = "local"
"""The env whose conf the first write loads, every setting that matters overridden."""


def features() -> list[str]:
    """Every feature of the standard source, in definition order (50 values per entity)."""
    from bench.standard import FLOATS, INTS, SOURCE

    names = [f"f{j:02d}" for j in range(FLOATS)] + [f"n{j}" for j in range(INTS)] + ["recent_ids", "embedding"]
    return [f"{SOURCE}:{n}" for n in names]


def write_table(spark, path: Path, entities: int) -> None:
    """The standard rows for OLD_DATE and, for NEW_DATE, every value changed (floats scaled
    and shifted, ints + 1, lists reversed, embeddings negated): a nightly run writing the
    same keys with new values."""
    from pyspark.sql import functions as F

    from bench.standard import FLOATS, INTS, standard_frame

    old = standard_frame(spark, entities, OLD_DATE)
    new = old.select(
        "entity_id",
        *[F.round(F.col(f"f{j:02d}") * 2 + 1, 4).alias(f"f{j:02d}") for j in range(FLOATS)],
        *[(F.col(f"n{j}") + 1).alias(f"n{j}") for j in range(INTS)],
        F.reverse("recent_ids").alias("recent_ids"),
        F.transform("embedding", lambda x: -x).alias("embedding"),
        F.lit(NEW_DATE).alias("ds"),
    )
    old.unionByName(new).write.format("delta").mode("overwrite").save(str(path))


def conf_settings(root: Path, redis_url: str, dsn: str, **extra) -> dict:
    """The env's settings (conf/<env>/*.yaml): the job's and the server's."""
    return {
        "data_root": str(root / "data"),
        "reports_dir": str(root / "reports"),
        "definitions_dir": str(root / "defs"),
        "sinks": ["redis", "sql"],
        "redis": {"url": redis_url, "password_env": None, "namespace": None, "mode": "standalone", "capacity_bytes": 1 << 30},
        "sql": {"dsn": dsn, "password_env": None},
        "spark": {"master": "local[2]"},
        "quality": {"expectations": False},
        **extra,
    }


def write_conf(folder: Path, settings: dict) -> Path:
    """A conf folder of its own (FM_CONF_DIR): the project's base and this env's settings."""
    import shutil

    from fm_config import PROJECT_ROOT

    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(PROJECT_ROOT / "conf" / "base", folder / "base")
    (folder / ENV).mkdir(exist_ok=True)
    (folder / ENV / "soak.yaml").write_text(json.dumps(settings, indent=1))
    return folder


def prepare(spark, root: Path, entities: int, redis_url: str, dsn: str) -> None:
    """Definitions and table under ``root``; the real job writes OLD_DATE into Redis and PostgreSQL."""
    from bench.standard import SOURCE, write_definitions
    from feature_defs import load_definitions
    from fm_config import load_config
    from jobs.pipeline.run import run_source

    defs_dir = write_definitions(root / "defs")
    (defs_dir / f"{PUSHED}.yaml").write_text(pushed_yaml())
    write_table(spark, root / "data" / SOURCE, entities)
    conf = load_config(IN_PROCESS_ENV, conf_settings(root, redis_url, dsn))
    summary = run_source(spark, conf, load_definitions(defs_dir), SOURCE, OLD_DATE)
    if summary.status != "succeeded":
        raise RuntimeError(f"the job failed: {summary.error}")


def pushed_yaml() -> str:
    from bench.standard import ENTITY

    return (
        f"source:\n  name: {PUSHED}\n  entity: {ENTITY}\n  location: {PUSHED}\n  layout: wide\n  select_by: event_time\n"
        f"  timestamp_column: event_timestamp\n  push_source: {PUSH_SOURCE}\n  features:\n    - {{name: p, type: float}}\n"
    )


def _files(table: Path) -> list[Path]:
    """The table's current Parquet files, from its Delta log (adds minus removes, in order)."""
    live: dict[str, bool] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = True
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return [table / p for p in live]


def expected(table: Path) -> dict[dt.date, dict[int, tuple]]:
    """Per date, entity id -> its 50 values as the JSON answer must hold them, read with
    pyarrow from the Parquet files (not through Spark, the job or the reader)."""
    import pyarrow.parquet as pq

    names = [f.split(":", 1)[1] for f in features()]
    out: dict[dt.date, dict[int, tuple]] = {}
    for path in _files(table):
        t = pq.read_table(path).to_pydict()
        for i, eid in enumerate(t["entity_id"]):
            out.setdefault(t["ds"][i], {})[eid] = tuple(t[n][i] for n in names)
    return out

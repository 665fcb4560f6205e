"""The every_type and pair_daily sample written by the real job into a Redis and a PostgreSQL
(write_sample, write_sample_into), and what reading every_type back must give
(assert_expected): shared by the reader's, the reader cluster's, the feature server's and the
stored-data fuzz tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from feature_defs import Definitions, load_definitions
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings

from .every_type import AS_OF, DAY, ENTITIES, EVERY_TYPE, EXPECTED, PAIR, ROWS, SCHEMA, SERVICES


def assert_expected(result, store: str) -> None:
    for name, (values, statuses) in EXPECTED.items():
        col = result.column(name)
        assert col.statuses == statuses, (store, name)
        for got, want in zip(col.values, values):
            if name == "e" and want is not None:
                assert isinstance(got, np.ndarray) and got.dtype == np.float32, (store, name)
                assert not got.flags.writeable, (store, name)  # the cache hands the same array to every caller
                assert np.array_equal(got, np.asarray(want, np.float32)), (store, name)
            elif name == "f32" and want is not None:
                assert np.float32(got) == np.float32(want), (store, name)
            else:
                assert got == want and type(got) is type(want), (store, name, got, want)
        assert col.event_timestamps == [AS_OF, AS_OF, AS_OF, None], (store, name)


def write_sample(spark, root: Path, redis: RedisSettings, dsn: str) -> tuple[RunConf, Definitions]:
    """every_type and pair_daily (definitions, Delta tables under ``root``) written by the
    real job into that Redis and PostgreSQL; the conf the readers use."""
    from jobs.pipeline.run import run_source

    defs_dir = root / "defs"
    defs_dir.mkdir()
    (defs_dir / "entities.yaml").write_text(ENTITIES)
    (defs_dir / "every_type.yaml").write_text(EVERY_TYPE)
    (defs_dir / "pair_daily.yaml").write_text(PAIR)
    (defs_dir / "services.yaml").write_text(SERVICES)
    defs = load_definitions(defs_dir)
    spark.createDataFrame(ROWS, SCHEMA).write.format("delta").save(str(root / "every_type"))
    spark.createDataFrame([("eu", 7, 1.5, DAY), ("us", 7, 2.5, DAY)], "region string, store_id long, score double, ds date").write.format(
        "delta"
    ).save(str(root / "pair_daily"))
    conf = RunConf(
        env="test", data_root=str(root), reports_dir=str(root / "reports"), definitions_dir=str(defs_dir),
        sinks=["redis", "cockroach"], redis=redis, sql=SqlSettings(dsn=dsn, password_env=None),
        quality=QualityConf(expectations=False, max_bad_fraction=0.5, verify_sample=10),
        reader=ReaderSettings(timeout_ms=5000),
    )  # fmt: skip
    for name in ("every_type", "pair_daily"):
        summary = run_source(spark, conf, defs, name, DAY)
        assert summary.status == "succeeded", summary.error
    return conf, defs


def write_sample_into(spark, tmp_path_factory, redis_server, pg_server, db: int, name: str):
    """The sample written by the real job into Redis database ``db`` and an emptied PostgreSQL."""
    redis_server.client(db).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    redis = RedisSettings(url=redis_server.url.rsplit("/", 1)[0] + f"/{db}", password_env=None, mode="standalone")
    return write_sample(spark, tmp_path_factory.mktemp(name), redis, pg_server.dsn)

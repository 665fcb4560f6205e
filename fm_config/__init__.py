"""The configuration every part reads: ``conf/base`` + ``conf/<env>`` loaded and checked
(load.py), the run configuration (run.py) and each section's typed settings (redis.py,
sql.py, reader.py), with what a store connection is made from. Spark-free, and below
everything that reads it: it imports none of jobs/, sinks/, feature_reader/ or stores/."""

from fm_config.base import ConfigError, SecretRef, Settings
from fm_config.catalog import CatalogConf
from fm_config.load import CONF_DIR_VAR, ENV_VAR, conf_dir, load_config
from fm_config.run import DEFAULT_ENV, PROJECT_ROOT, LeaseConf, QualityConf, RunConf, SparkConf, StorageConf

__all__ = [
    "CatalogConf",
    "CONF_DIR_VAR",
    "DEFAULT_ENV",
    "ENV_VAR",
    "PROJECT_ROOT",
    "ConfigError",
    "LeaseConf",
    "QualityConf",
    "RunConf",
    "SecretRef",
    "Settings",
    "SparkConf",
    "StorageConf",
    "conf_dir",
    "load_config",
]

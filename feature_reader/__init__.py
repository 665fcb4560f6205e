"""Online reads of the features the pipeline writes: L1 cache -> Redis -> SQL (README.md here)."""

from feature_reader.errors import EntityKeyError, ReadTimeout, RequestError, StoreError, StoreUnavailable, UnknownNameError
from feature_reader.reader import AsyncFeatureReader, FeatureReader
from feature_reader.response import FeatureColumn, OnlineFeatures

__all__ = [
    "AsyncFeatureReader",
    "EntityKeyError",
    "FeatureColumn",
    "FeatureReader",
    "OnlineFeatures",
    "ReadTimeout",
    "RequestError",
    "StoreError",
    "StoreUnavailable",
    "UnknownNameError",
]

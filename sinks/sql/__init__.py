"""The SQL store (CockroachDB, or PostgreSQL on the same wire): one JSON row per entity and source.

settings -> config -> client; preflight (driver) -> writer (partitions). Beside them:
upserts.py (sorted multi-row upserts in short transactions), statements.py (the SQL text,
per dialect).
"""

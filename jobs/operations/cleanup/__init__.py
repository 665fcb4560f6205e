"""Stale-field cleanup, one ledger step over both stores: Redis (redis.py, which plans and records
the step) and the SQL store (sql.py)."""

"""Operator commands beside the nightly pipeline, in families:

- ledger/: the run ledger (events.py) and what is built on it: its files read without Spark
  (files.py), commits on a local disk (local_commits.py), one writer per source and store
  (lease.py), event-time windows (windows.py), the stores compared with what the ledger
  says they hold (store_state.py);
- doctor/: `materialize doctor`, one module per thing checked (run.py lists them in order);
- cleanup/: stale-field cleanup of Redis (redis.py) and of the SQL store (sql.py);
- backfill.py (date ranges), schema.py (the SQL tables), written_as.py (a source's stored names
  against the ledger's)."""

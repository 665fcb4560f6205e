"""Operator commands beside the nightly pipeline: the run ledger, backfills over date
ranges, stale-field cleanup and the SQL schema step (materialize runs|backfill|cleanup|schema)."""

"""The exit codes of ``materialize``, in one place: the CLI returns them and the Airflow DAGs
read them (through jobs/airflow_support.py). Standard library only, so the DAG files stay
cheap to parse."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
"""Bad arguments, or a name that is not defined."""
EXIT_NOT_READY = 3
"""The date's partition has no rows yet (`ready`; `run` and `validate`, which then write and record
nothing; `backfill` when no date of its range has rows): retrying later can help."""
EXIT_GATE_FAILED = 4
"""Every failure was the data-quality gate (nothing written): retrying the same data cannot help."""
EXIT_LEASE_HELD = 5
"""Another run holds the source's lease on a store (nothing was written)."""
EXIT_STORE_LOST = 6
"""Every source ran, but a store had lost data written before (emptied, restarted without
persistence, failed over to an empty replica): the output names the backfill that restores it."""

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
EXIT_TERMINAL = 7
"""Every failure was of a kind that retrying cannot fix (a source table not as defined, a
change the stores refuse, a store that is full, the gate), and not all of one kind with
its own code above."""

RETRY_CANNOT_FIX = frozenset({EXIT_USAGE, EXIT_GATE_FAILED, EXIT_STORE_LOST, EXIT_TERMINAL})
"""The exit codes a scheduler should not retry: the same input fails the same way (or, for
EXIT_STORE_LOST, what is needed is the backfill the output names). EXIT_FAILED,
EXIT_NOT_READY and EXIT_LEASE_HELD are worth another attempt later."""

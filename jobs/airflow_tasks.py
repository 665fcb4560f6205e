"""What the DAG tasks run: the project's CLI or spark-submit, with the exit code read.

A failure that retrying cannot fix (jobs/exit_codes.py ``RETRY_CANNOT_FIX``: bad input or
a failed gate, definitions or changes the stores refuse, a source table not as defined)
fails the task at once, without its retries; any other failure raises a plain error, which
Airflow retries. Imported by the DAG files only (Airflow is there already); still nothing
of Spark or the stores at parse time.
"""

from __future__ import annotations

import os
import subprocess
import sys

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from jobs import airflow_support as fm
from jobs.exit_codes import EXIT_NOT_READY, EXIT_OK, RETRY_CANNOT_FIX

MEANING = {
    1: "failed",
    2: "bad arguments or definitions",
    3: "not ready: no rows yet",
    4: "the data-quality gate failed",
    5: "another run holds the source's lease",
    6: "a store lost data written before: run the backfill the log names",
    7: "a failure retrying cannot fix",
}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The project's CLI in the worker's environment (plus FM_ENV, the venv on PATH), output to the task log."""
    done = subprocess.run(
        [str(fm.BIN_DIR / "materialize"), *args], env={**os.environ, **fm.task_env()}, capture_output=True, text=True, timeout=3 * 3600
    )
    print(done.stdout[-20000:])
    print(done.stderr[-20000:], file=sys.stderr)
    return done


def check_exit(code: int, what: str, *, skip_not_ready: bool = False) -> None:
    """Raise for a failed ``what`` by its exit code: AirflowFailException (no retry) when
    retrying cannot fix it, AirflowSkipException for 'no rows yet' when ``skip_not_ready``,
    else RuntimeError (retried)."""
    if code == EXIT_OK:
        return
    said = f"{what} exited with {code} ({MEANING.get(code, 'failed')})"
    if code in RETRY_CANNOT_FIX:
        raise AirflowFailException(f"{said}: not retried, the same input fails the same way; the reason is in the log above")
    if code == EXIT_NOT_READY and skip_not_ready:
        raise AirflowSkipException(f"{said}: nothing to load, nothing written")
    raise RuntimeError(f"{said}: retried")


def cli_task(*args: str, skip_not_ready: bool = False) -> None:
    """Run ``materialize *args`` and judge its exit code (:func:`check_exit`)."""
    check_exit(run_cli(*args).returncode, f"`materialize {' '.join(args)}`", skip_not_ready=skip_not_ready)


class MaterializeSubmit(SparkSubmitOperator):
    """spark-submit of jobs/materialize.py whose exit code is judged as the CLI's
    (:func:`check_exit`). spark-submit returns the driver's exit code in client deploy mode;
    in cluster deploy mode it does not know it, and every failure is retried."""

    def __init__(self, *, skip_not_ready: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.skip_not_ready = skip_not_ready

    def execute(self, context) -> None:
        try:
            super().execute(context)
        except AirflowException:
            code = getattr(getattr(self._hook, "_submit_sp", None), "returncode", None)
            if not isinstance(code, int) or code <= 0:
                raise
            check_exit(code, f"spark-submit of {self.application}", skip_not_ready=self.skip_not_ready)
            raise

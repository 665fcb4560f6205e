"""Progress lines for long Spark actions, read from the driver's status tracker."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


def _fmt_seconds(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


@contextmanager
def progress(spark, label: str, every: float = 10.0, out=print):
    """Run the body under a Spark job group; every ``every`` s print tasks done/total.

    Quiet for actions shorter than ``every`` seconds, so short runs stay readable.
    """
    sc = spark.sparkContext
    group = f"fm-{label}-{time.monotonic_ns()}"
    sc.setJobGroup(group, label)
    stop = threading.Event()
    start = time.monotonic()

    def report() -> None:
        tracker = sc.statusTracker()
        while not stop.wait(every):
            done = total = 0
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job else []:
                    stage = tracker.getStageInfo(stage_id)
                    if stage:
                        done += stage.numCompletedTasks
                        total += stage.numTasks
            out(f"[progress] {label}: {done}/{total} tasks done, {_fmt_seconds(time.monotonic() - start)} elapsed")

    thread = threading.Thread(target=report, name=f"progress-{label}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        sc.setLocalProperty("spark.jobGroup.id", None)

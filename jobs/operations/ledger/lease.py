"""One writer per (source, store) at a time: leases in a Delta table beside the ledger
(``<ledger>_leases``).

A run or backfill takes its lease on each (source, sink target) before it writes, a driver
thread renews it while the run goes on, and it is released when the run ends. Another
run of the same source into the same store finds it held: it waits (``--wait-for-lease``)
or stops with a message naming the holder. A lease whose holder stopped renewing (a
driver that crashed) is taken over once it has expired.

A claim is one Delta ``MERGE`` over the leases table: two claims at once conflict in
Delta's transaction log and the loser reads the winner's row. The table is partitioned by
source and every claim, renewal and release names its source's partition, so runs of
different sources (``parallel_sources``) do not conflict (unpartitioned, the claims of three
sources at once took up to 17 s of retries). On S3 that needs Delta's
multi-cluster log store (conf/README.md, "Locations"), as concurrent ledger appends do. On
a local disk every commit holds the table's commit lock (jobs/operations/ledger/local_commits.py):
Hadoop's local file system cannot refuse a second commit of the same version, so two
processes claiming at once would otherwise both win, and could leave the log unreadable.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from jobs.operations.ledger.local_commits import commit_lock, guarded

log = logging.getLogger(__name__)

SCHEMA = T.StructType([
    T.StructField("source", T.StringType()), T.StructField("target", T.StringType()),
    T.StructField("holder", T.StringType()), T.StructField("kind", T.StringType()),
    T.StructField("host", T.StringType()), T.StructField("pid", T.LongType()),
    T.StructField("taken_at", T.TimestampType()), T.StructField("expires_at", T.TimestampType()),
])  # fmt: skip

HOLDER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
"""This process's name in the leases table."""


class LeaseHeld(RuntimeError):
    """Another run holds the lease (terminal for this attempt: retry later, or wait)."""


@dataclass(frozen=True)
class Holder:
    source: str
    target: str
    holder: str
    kind: str
    host: str
    pid: int
    taken_at: dt.datetime
    expires_at: dt.datetime

    def describe(self) -> str:
        stamp = lambda t: t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")  # noqa: E731
        return f"{self.kind} on {self.host} (pid {self.pid}, since {stamp(self.taken_at)}, lease until {stamp(self.expires_at)})"


class Leases:
    """The leases table of a ledger: ``<ledger>_leases`` beside it (a table inside another's
    folder would be taken for part of it: Delta looks up the path for a ``_delta_log``)."""

    def __init__(self, spark: SparkSession, ledger_path: str, *, seconds: float, holder: str = HOLDER):
        self.spark, self.seconds, self.holder = spark, seconds, holder
        self.path = str(ledger_path).rstrip("/") + "_leases"
        self._held: dict[tuple[str, str], int] = {}  # (source, target) -> nesting depth (a backfill's steps run inside its lease)
        self._lock = threading.Lock()
        self._delta = None  # the table once found: each operation still reads its latest version

    def _table(self):
        from delta.tables import DeltaTable

        if self._delta is not None:
            return self._delta
        for attempt in range(5):
            with commit_lock(self.path):  # on a local disk, one process makes it: the others find it made
                if guarded(self.path, lambda: DeltaTable.isDeltaTable(self.spark, self.path)):
                    self._delta = DeltaTable.forPath(self.spark, self.path)
                    return self._delta
                try:
                    self.spark.createDataFrame([], SCHEMA).write.format("delta").partitionBy("source").mode("append").save(self.path)
                except Exception as exc:  # another process made it at the same moment (object stores)
                    log.info("leases table %s made elsewhere meanwhile (%s)", self.path, type(exc).__name__)
            time.sleep(0.2 * attempt)
        return DeltaTable.forPath(self.spark, self.path)

    def holders(self, source: str) -> dict[str, Holder]:
        """The current rows of ``source``, by target (expired ones too)."""
        from delta.tables import DeltaTable

        def read():
            if not DeltaTable.isDeltaTable(self.spark, self.path):
                return []
            return self.spark.read.format("delta").load(self.path).where(f"source = '{_quote(source)}'").collect()

        return {r["target"]: Holder(**r.asDict()) for r in guarded(self.path, read)}

    def _merge(self, source: str, targets: list[str], kind: str, now: dt.datetime, *, renew_only: bool) -> int:
        """The claim (or renewal) as one MERGE; returns the rows it wrote: one per target it got."""
        from pyspark.sql import functions as F

        rows = [
            (source, t, self.holder, kind, socket.gethostname(), os.getpid(), now, now + dt.timedelta(seconds=self.seconds))
            for t in targets
        ]
        claim = self.spark.createDataFrame(rows, SCHEMA).withColumn("now", F.lit(now))
        with commit_lock(self.path):  # read, write and commit: on a local disk no other process commits in between
            table = self._table().alias("t")
            # the literal source: Delta then checks a concurrent commit against this partition only
            merge = table.merge(claim.alias("c"), f"t.source = '{_quote(source)}' AND t.source = c.source AND t.target = c.target")
            if renew_only:
                merge = merge.whenMatchedUpdate(condition="t.holder = c.holder", set={"expires_at": "c.expires_at"})
            else:
                # free, expired, or ours already (a nested take): the claim's row replaces it, keeping our taken_at
                fields = {n: f"c.{n}" for n in SCHEMA.fieldNames()}
                merge = merge.whenMatchedUpdate(
                    condition="t.expires_at < c.now OR t.holder = c.holder",
                    set={**fields, "taken_at": "CASE WHEN t.holder = c.holder THEN t.taken_at ELSE c.taken_at END"},
                ).whenNotMatchedInsert(values=fields)
            return int(guarded(self.path, merge.execute).first()["num_affected_rows"])

    def take(self, source: str, targets: list[str], kind: str, *, wait: float = 0, poll: float = 5) -> bool:
        """Hold every (source, target) or none: raises LeaseHeld naming the holder once ``wait``
        seconds pass. True when this process held them already (a backfill's step)."""
        key = [(source, t) for t in targets]
        with self._lock:
            if all(k in self._held for k in key):
                for k in key:
                    self._held[k] += 1
                return True
        deadline = time.monotonic() + wait
        while True:
            now = dt.datetime.now(dt.UTC).replace(microsecond=0)
            # every claim row written: each target was free, expired or ours (no read needed)
            won = self._merge_retrying(source, targets, kind, now, renew_only=False) == len(targets)
            held = {} if won else self.holders(source)
            mine = targets if won else [t for t in targets if held.get(t) is not None and held[t].holder == self.holder]
            if len(mine) == len(targets):
                with self._lock:
                    for k in key:
                        self._held[k] = self._held.get(k, 0) + 1
                return False
            self._drop(source, mine)  # all or none
            others = [held[t] for t in targets if held.get(t) is not None and held[t].holder != self.holder]
            if not others:  # our claim lost a commit race to another source's: claim again
                time.sleep(random.uniform(0.05, 0.5))
                continue
            if time.monotonic() >= deadline:
                other = others[0]
                raise LeaseHeld(
                    f"source {source!r} is being written to {other.target} by {other.describe()}; "
                    f"one writer per source and store at a time: wait for it to end, or run again with --wait-for-lease SECONDS"
                )
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))

    def _merge_retrying(
        self, source: str, targets: list[str], kind: str, now: dt.datetime, *, renew_only: bool, attempts: int = 8
    ) -> int | None:
        """The MERGE, again after a commit lost to another claim (or renewal) of the same table:
        the table is one for every source, so claims of different sources conflict too. None:
        still losing after ``attempts`` (the caller reads who holds what)."""
        for attempt in range(attempts):
            try:
                return self._merge(source, targets, kind, now, renew_only=renew_only)
            except Exception as exc:
                if not _is_conflict(exc) or attempt == attempts - 1:
                    if _is_conflict(exc):
                        return None
                    raise
            time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))

    def renew(self, source: str, targets: list[str], kind: str) -> bool:
        """Push our leases' expiry on; False when one of them is no longer ours (it expired and was taken over)."""
        if self._merge_retrying(source, targets, kind, dt.datetime.now(dt.UTC).replace(microsecond=0), renew_only=True) == len(targets):
            return True
        held = self.holders(source)
        return all(held.get(t) is not None and held[t].holder == self.holder for t in targets)

    def release(self, source: str, targets: list[str]) -> None:
        key = [(source, t) for t in targets]
        with self._lock:
            for k in key:
                self._held[k] = self._held.get(k, 1) - 1
            if any(self._held[k] > 0 for k in key):
                return
            for k in key:
                del self._held[k]
        self._drop(source, targets)

    def _drop(self, source: str, targets: list[str]) -> None:
        if not targets:
            return
        listed = ", ".join(f"'{_quote(t)}'" for t in targets)
        condition = f"source = '{_quote(source)}' AND holder = '{_quote(self.holder)}' AND target IN ({listed})"
        for attempt in range(8):  # a delete loses commits to other claims as a MERGE does (object stores)
            try:
                with commit_lock(self.path):
                    guarded(self.path, lambda: self._table().delete(condition))
                return
            except Exception as exc:
                if not _is_conflict(exc) or attempt == 7:
                    raise
            time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))

    @contextmanager
    def hold(self, source: str, targets: list[str], kind: str, *, wait: float = 0):
        """Take the leases, renew them every third of their time while the body runs, release them after.
        A lease found lost at a renewal fails the run when the body ends (another writer may have written)."""
        if self.take(source, targets, kind, wait=wait):  # within our own hold: it renews them
            try:
                yield
            finally:
                self.release(source, targets)
            return
        stop, lost = threading.Event(), []

        def renew() -> None:
            while not stop.wait(self.seconds / 3):
                try:
                    if not self.renew(source, targets, kind):
                        lost.append(True)
                        log.error("the lease of %s on %s was taken over: another writer may be writing", source, ", ".join(targets))
                        return
                except Exception as exc:  # a failed renewal is retried at the next tick; the lease lasts 3 ticks
                    log.warning("could not renew the lease of %s: %s: %s", source, type(exc).__name__, exc)

        thread = threading.Thread(target=renew, name=f"lease-{source}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.release(source, targets)
        if lost:
            raise LeaseHeld(
                f"source {source!r}: its lease expired while it ran and another run took it over; "
                "the stores may hold both runs' writes: run the date again"
            )


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _is_conflict(exc: Exception) -> bool:
    """Delta's concurrent-modification errors (the commit lost to another), by name: they
    arrive as Py4J or Spark Connect errors depending on the session."""
    text = f"{type(exc).__name__}: {exc}"
    return any(
        n in text
        for n in (
            "ConcurrentAppend",
            "ConcurrentModification",
            "ConcurrentDeleteRead",
            "ConcurrentDeleteDelete",
            "ConcurrentTransaction",
            "DELTA_CONCURRENT",
            "ProtocolChanged",
            "MetadataChanged",
        )
    )

"""Commits to the ledger's Delta tables (the ledger and its leases) from several processes on
one disk.

Delta commits version N by writing ``_delta_log/N.json`` only if no one has yet. HDFS, ADLS and
GCS make that put-if-absent atomic. On a local disk Hadoop's file system does it in steps: it
checks that the file is absent, renames the new file over the path, then renames its checksum
file (``.N.json.crc``) in a second step. Two processes committing the same version at once
can both pass the check: the later rename replaces the earlier's file, whose process was told
it committed (two winners of one lease, a ledger event that never was), and the log can keep
one process's file beside the other's checksum, which every later read refuses with a
``ChecksumException`` until the checksum file is removed. Delta guards against this within
one JVM only. (Measured from 4 JVMs calling Delta's commit for the same version at the same
microsecond, 3,000 times: 7 and 10 files left beside another's checksum; with Hadoop's
checksum-less local file system, 16 versions two processes both committed; with this lock, none.)

So every commit to such a table on a local path (or a ``file://`` URI) holds an exclusive lock
on ``_commits.lock`` in the table's folder, for the whole operation: reading the latest version,
writing and committing. No other process commits in between, so Delta sees no conflict
either. ``flock`` is released by the kernel when its process dies: a crashed driver leaves
no lock behind. Threads of one process also take a lock of the process first (between
threads of one process, flock over NFS does not exclude). Tables on object stores and HDFS
take no lock: their put-if-absent is atomic (S3's needs Delta's DynamoDB log store,
conf/README.md "Concurrent writers on S3").

A log left damaged by an older version is checked once per process before the table is
first used (``check_log``), and again when a read fails on a checksum: a commit whose checksum
file is another commit's loses that checksum file (Hadoop then reads it unchecked), a
cached summary (``N.crc``, ``_last_checkpoint``) that does not match its checksum is removed
(Delta rebuilds it from the log), and anything else stops with ``DeltaLogError`` naming the
file and what to do.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import logging
import os
import random
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from fm_config.locations import is_uri

log = logging.getLogger(__name__)

LOCK_NAME = "_commits.lock"
"""In the table's folder: Delta and Spark leave files whose names start with ``_`` alone."""
LOCK_TIMEOUT = 600.0
"""Seconds to wait for another process's commit; a commit takes seconds, so past this the holder is stuck."""

T = TypeVar("T")


class DeltaLogError(RuntimeError):
    """A ledger table's log cannot be read as it is (terminal: a person has to look), or its commit lock cannot be had."""


class _TableLock:
    def __init__(self, file: Path):
        self.file = file
        self.threads = threading.RLock()
        self.depth = 0  # nested holds of the owning thread (a claim that makes the table first)
        self.fd: int | None = None


_locks: dict[Path, _TableLock] = {}
_checked: set[Path] = set()
_registry = threading.Lock()
_unlockable: set[Path] = set()


def local_folder(table: str) -> Path | None:
    """The table's folder when it is on this machine's disk (a local path or a ``file:`` URI), else None."""
    text = str(table)
    if text.startswith("file:"):  # file:///x, and Hadoop's spelling file:/x
        return Path(os.path.abspath(urlsplit(text).path))
    return None if is_uri(text) else Path(os.path.abspath(text))


@contextmanager
def commit_lock(table: str, timeout: float = LOCK_TIMEOUT):
    """Hold the table's commit lock while the body runs (nothing on object stores and HDFS)."""
    folder = local_folder(table)
    if folder is None:
        yield
        return
    with _registry:
        lock = _locks.setdefault(folder, _TableLock(folder / LOCK_NAME))
    deadline = time.monotonic() + timeout
    if not lock.threads.acquire(timeout=timeout):
        raise DeltaLogError(f"waited {timeout:g} s for another thread's commit to {table}: it is stuck")
    try:
        if lock.depth == 0:
            lock.fd = _take(lock.file, deadline, timeout)
        lock.depth += 1
        try:
            yield
        finally:
            lock.depth -= 1
            if lock.depth == 0 and lock.fd is not None:
                os.close(lock.fd)  # releases the flock
                lock.fd = None
    finally:
        lock.threads.release()


def _take(file: Path, deadline: float, timeout: float) -> int | None:
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o664)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                os.close(fd)
                raise DeltaLogError(
                    f"the commit lock {file} has been held for over {timeout:g} s ({holder}): "
                    "if that process is stuck, stop it (the lock goes with it)"
                ) from None
            time.sleep(random.uniform(0.01, 0.05))
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            os.close(fd)
            if file not in _unlockable:
                _unlockable.add(file)
                log.warning(
                    "cannot lock %s (%s): this file system has no file locks, so two processes committing to %s at once "
                    "can lose a commit; run one driver at a time, or put ledger_root on HDFS or a local disk",
                    file,
                    os.strerror(exc.errno),
                    file.parent,
                )
            return None
    # who holds it, for the message of a process that waits too long (advisory: nothing reads it otherwise)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"held by {socket.gethostname()} pid {os.getpid()} since {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC\n".encode(), 0)
    return fd


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "holder unknown"
    except OSError:
        return "holder unknown"


# -- a log damaged by an older version ------------------------------------------------------

_VERSIONED = re.compile(r"^(\d{20})\.(json|crc|checkpoint\..*parquet|checkpoint\..*json)$")
_CHECKSUM_ERROR = re.compile(r"ChecksumException: Checksum error: (\S+) at \d+")


def check_log(table: str) -> None:
    """Once per process and table, before its first use: the files Delta reads of a local
    table's log (from its latest checkpoint on) match their checksum files, or are repaired."""
    folder = local_folder(table)
    if folder is None:
        return
    with _registry:
        if folder in _checked:
            return
    logs = folder / "_delta_log"
    if logs.is_dir():
        with _lock_to_repair(table):
            for file in _files_read(logs):
                repair(file)
    with _registry:
        _checked.add(folder)


@contextmanager
def _lock_to_repair(table: str):
    """The commit lock, or none for a user who may read the table but not write there (``materialize
    runs``, ``doctor``): it checks all the same, and a file it would have to remove stops it."""
    with ExitStack() as stack:
        try:
            stack.enter_context(commit_lock(table))
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or exc.filename != str(local_folder(table) / LOCK_NAME):
                raise
        yield


def guarded(table: str, action: Callable[[], T]) -> T:
    """``action`` on the table, once more after repairing a log file a read refused on its checksum."""
    check_log(table)
    try:
        return action()
    except Exception as exc:
        damaged = checksum_failure(exc, table)
        if damaged is None:
            raise
        with _lock_to_repair(table):
            repair(damaged, failed=True)
    return action()


def checksum_failure(exc: BaseException, table: str) -> Path | None:
    """The file of the table's log that a read refused on its checksum, if that is what ``exc`` says."""
    folder = local_folder(table)
    found = _CHECKSUM_ERROR.search(str(exc))
    if folder is None or found is None:
        return None
    file = local_folder(found.group(1))
    return file if file is not None and file.parent == folder / "_delta_log" else None


def _files_read(logs: Path) -> list[Path]:
    """The log's files a reader of the latest version reads: from the latest checkpoint on."""
    versions: dict[Path, int] = {}
    checkpoint = -1
    for file in logs.iterdir():
        found = _VERSIONED.match(file.name)
        if found:
            versions[file] = int(found.group(1))
            if found.group(2).startswith("checkpoint"):
                checkpoint = max(checkpoint, versions[file])
    # commits after the checkpoint; the checkpoint itself and the summaries from it on
    files = sorted(f for f, v in versions.items() if v > checkpoint or v == checkpoint and _VERSIONED.match(f.name).group(2) != "json")
    return [*files, logs / "_last_checkpoint"]


def checksum_matches(file: Path) -> bool:
    """Whether ``file`` matches Hadoop's checksum file beside it (``.<name>.crc``: a header,
    the bytes per checksum, then a CRC-32 per chunk); True when there is none."""
    sidecar = file.with_name(f".{file.name}.crc")
    if not sidecar.exists() or not file.exists():
        return True
    raw = sidecar.read_bytes()
    if raw[:4] != b"crc\x00" or len(raw) < 8:
        return False
    (chunk,) = struct.unpack(">i", raw[4:8])
    if chunk <= 0:
        return False
    data = file.read_bytes()
    sums = b"".join(struct.pack(">I", zlib.crc32(data[i : i + chunk])) for i in range(0, len(data), chunk))
    return sums == raw[8:]


def repair(file: Path, *, failed: bool = False) -> None:
    """Make a log file whose checksum file does not match readable again, or raise DeltaLogError.
    ``failed``: a read refused it (its checksum file then cannot be one that matches)."""
    if not failed and checksum_matches(file):
        return
    sidecar = file.with_name(f".{file.name}.crc")
    if not sidecar.exists():  # the read failed on a checksum file since removed (by another process's repair)
        return
    if file.name.endswith(".json") and _VERSIONED.match(file.name) and _whole_commit(file):
        # the commit is whole (renames are atomic): the checksum file is the other racer's
        _remove(sidecar, file)
        log.warning(
            "%s: its checksum file %s was another process's commit of the same version (two commits at once by an older "
            "version); removed it, the commit reads whole",
            file,
            sidecar.name,
        )
        return
    if file.name == "_last_checkpoint" or file.name.endswith(".crc"):
        # a summary Delta keeps to read faster, and rebuilds from the log when it is missing
        for f in (file, sidecar):
            _remove(f, file)
        log.warning("%s did not match its checksum file %s: removed both (Delta rebuilds it from the log)", file, sidecar.name)
        return
    raise DeltaLogError(
        f"{file} does not match its checksum file {sidecar} and cannot be repaired here: "
        f"if {file.name} is intact (restored from a backup, or checked by hand), delete {sidecar.name}; otherwise "
        f"move {file.parent.parent} aside to start the table afresh (the ledger then forgets what ran; the leases "
        "table holds only live leases and can be moved aside while no run is running)"
    )


def _remove(path: Path, damaged: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except PermissionError:
        raise DeltaLogError(
            f"{damaged} does not match its checksum file; {path} has to be removed for the table to be read "
            "(what an older version's commits at once left), and this user may not: run once as the user that runs the jobs"
        ) from None


def _whole_commit(file: Path) -> bool:
    """Every line of the file is one JSON action (an object with one key): a commit written whole."""
    try:
        actions = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return bool(actions) and all(isinstance(a, dict) and len(a) == 1 for a in actions)

"""`materialize serve` with a probe of what holds its memory (``--gc-probe``, a diagnosis, off
by default: it changes the server's memory by collecting). ``python -m bench.soak.gc_probe
DIR serve ...`` runs the CLI with a thread that, whenever DIR/collect appears, runs a full
garbage collection keeping what it finds (gc.DEBUG_SAVEALL), then frees it and asks glibc
to give freed memory back (malloc_trim), and appends one JSON line to DIR/gc.jsonl: the
RSS before, after the collection and after the trim, and what the collection found, by type."""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pymalloc() -> dict:
    """Python's small-object allocator after the collection (sys._debugmallocstats, which writes to fd 2):
    its arenas (1 MiB each, given back only when empty) against the bytes its live objects use."""
    with tempfile.TemporaryFile(mode="w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        lines = out.read().splitlines()
    found = {}
    for line in lines:
        name, _, value = line.partition("=")
        name = name.strip("# ").strip()
        if name in ("arenas allocated current", "bytes in allocated blocks", "bytes in available blocks"):
            found[name] = int(value.strip().replace(",", ""))
    mib = {k: round(v / 2**20, 1) for k, v in found.items() if k.startswith("bytes")}
    return {"arenas_mib": found.get("arenas allocated current"), "live_small_objects_mib": mib.get("bytes in allocated blocks"),
            "free_blocks_in_arenas_mib": mib.get("bytes in available blocks")}  # fmt: skip


def probe() -> dict:
    before = _rss_mib()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found = gc.collect()
    garbage = list(gc.garbage)
    gc.garbage.clear()
    gc.set_debug(0)
    types = collections.Counter(type(o).__name__ for o in garbage).most_common(12)
    del garbage
    gc.collect()  # what DEBUG_SAVEALL kept, freed now
    collected = _rss_mib()
    ctypes.CDLL(None).malloc_trim(0)
    return {"rss_mib": round(before, 1), "unreachable_objects": found, "by_type": types,
            "rss_after_full_collection_mib": round(collected, 1), "rss_after_malloc_trim_mib": round(_rss_mib(), 1),
            "pymalloc": _pymalloc()}  # fmt: skip


def _watch(folder: Path) -> None:
    trigger = folder / "collect"
    while True:
        time.sleep(0.2)
        if trigger.exists():
            trigger.unlink()
            with (folder / "gc.jsonl").open("a") as out:
                out.write(json.dumps(probe()) + "\n")


def request(folder: Path, timeout: float = 30) -> dict | None:
    """Ask the probed server for a probe; its line (None past ``timeout``)."""
    log = folder / "gc.jsonl"
    seen = len(log.read_text().splitlines()) if log.exists() else 0
    (folder / "collect").touch()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) > seen:
            return json.loads(lines[seen])
        time.sleep(0.2)
    return None


if __name__ == "__main__":
    from jobs.cli import main

    threading.Thread(target=_watch, args=(Path(sys.argv[1]),), daemon=True).start()
    sys.exit(main(sys.argv[2:]))

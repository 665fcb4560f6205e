"""Servers under test: the CPU each side is pinned to, waiting until a server answers, and stopping it.

A server under test runs as one process pinned to ``SERVER_CPU``; the load (vegeta or a
client) and Redis to ``LOAD_CPU``. Servers are started with ``start_new_session=True``, so
``stop_process`` ends the whole process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request

SERVER_CPU, LOAD_CPU = "0", "1"


def wait_http(url: str, process: subprocess.Popen, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f} s")


def wait_answering(url: str, process: subprocess.Popen, context=None) -> None:
    """Until ``url`` answers (``context``: its TLS trust); a server that exits first or never answers is an error."""
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"the server ({url}) exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=context):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server did not answer {url}")


def stop_process(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

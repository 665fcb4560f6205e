"""vegeta, the open-loop HTTP load generator (fixed rate: a slow answer does not slow the
next request, so the latencies are free of coordinated omission), pinned and installed
from the Go module proxy; and the CPU a process tree used over an attack."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

from fm_config import PROJECT_ROOT

MODULE = "github.com/tsenart/vegeta/v12@v12.13.0"
BIN = PROJECT_ROOT / ".run" / "bin"


def vegeta_bin() -> Path:
    """The pinned vegeta, built with ``go install`` when missing."""
    exe, pinned = BIN / "vegeta", BIN / ".vegeta-pinned"
    if exe.exists() and pinned.is_file() and pinned.read_text() == MODULE:
        return exe
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.path.exists(p)), None)
    if go is None:
        raise SystemExit(
            "the load benchmark builds vegeta with Go: install Go (https://go.dev/dl, or apt-get install golang-go) and run again"
        )
    print(f"installing {MODULE} into {BIN} (once)", flush=True)
    BIN.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "install", MODULE], check=True, env={**os.environ, "GOBIN": str(BIN), "CGO_ENABLED": "0"})
    pinned.write_text(MODULE)
    return exe


def write_targets(path: Path, url: str, bodies: list[bytes]) -> Path:
    """vegeta's JSON target format: one POST per body; vegeta sends them round-robin."""
    with path.open("w") as out:
        for body in bodies:
            target = {
                "method": "POST",
                "url": url,
                "header": {"Content-Type": ["application/json"]},
                "body": base64.b64encode(body).decode(),
            }
            out.write(json.dumps(target) + "\n")
    return path


def attack(targets: Path, rate: int, seconds: float, cpu: str | None = None, timeout: str = "5s", extra: tuple[str, ...] = ()) -> dict:
    """vegeta's JSON report of ``rate`` requests/s for ``seconds`` (on CPU ``cpu`` when
    given), with ``p999`` (ns) from its HDR percentiles. Response bodies are not kept.
    ``extra``: more flags of ``vegeta attack`` (e.g. ``-root-certs ca.pem`` for HTTPS)."""
    exe = str(vegeta_bin())
    pin = ["taskset", "-c", cpu] if cpu is not None else []
    results = targets.with_suffix(".results.gob")
    run = [
        *pin,
        exe,
        "attack",
        "-format=json",
        f"-targets={targets}",
        f"-rate={rate}",
        f"-duration={seconds}s",
        f"-timeout={timeout}",
        "-max-body=0",
        f"-output={results}",
        *extra,
    ]
    subprocess.run(run, check=True)
    report = json.loads(subprocess.run([exe, "report", "-type=json", str(results)], capture_output=True, check=True).stdout)
    plot = subprocess.run([exe, "report", "-type=hdrplot", str(results)], capture_output=True, check=True, text=True).stdout
    report["p999"] = _percentile(plot, 0.999)
    results.unlink()
    return report


def _percentile(hdrplot: str, q: float) -> float | None:
    """From vegeta's hdrplot lines (value in ms, percentile, count, ...): the first value at ``q`` or past it, in ns."""
    for line in hdrplot.splitlines():
        parts = line.split()
        try:
            value, at = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            continue
        if at >= q:
            return value * 1e6
    return None


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    return kids


def cpu_seconds(root: int) -> float:
    """User + system CPU of a process and its descendants (all threads), in seconds."""
    kids, stack, ticks = _children(), [root], 0
    while stack:
        pid = stack.pop()
        stack += kids.get(pid, [])
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")

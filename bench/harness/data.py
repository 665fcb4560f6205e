"""What a read or serve benchmark works on: the standard table written by the real job, the
reader's conf over it, and the request bodies sent to a server.

- ``load_standard``: the job (bench/stage_profile.py in a child process) writes the standard
  table (bench/standard.py) into a Redis server and the env's SQL store;
- ``reader_conf``: a ``local`` conf reading ``defs`` from that Redis (and ``sinks``), with ``reader:`` settings;
- ``request_bodies``: ``BODIES`` distinct ``/get-online-features`` bodies of ``shape`` entities,
  keys uniform over the table or drawn from a Zipf distribution (s = ``ZIPF_S``, hot keys spread over the table).
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

from fm_config import PROJECT_ROOT

BODIES = 4000
"""Distinct request bodies per (shape, key distribution), sent round-robin."""
ZIPF_S = 1.1


def load_standard(workdir: Path, entities: int, redis_url: str) -> None:
    """The real job writes the standard table (made when missing) into ``redis_url`` and the
    env's SQL store (PostgreSQL of `make services-start`)."""
    out = workdir / "reads-load.json"
    child = json.dumps([entities, "wide", ["redis", "sql"], redis_url, {}, str(out)])
    subprocess.run([sys.executable, "-m", "bench.stage_profile", "--workdir", str(workdir), "--child", child], check=True, cwd=PROJECT_ROOT)


def reader_conf(redis_url: str, defs: Path, sinks: tuple[str, ...] = ("redis",), **reader):
    from fm_config import load_config

    return load_config(
        "local",
        {"sinks": list(sinks), "definitions_dir": str(defs), "reader": reader,
         "redis": {"url": redis_url, "password_env": None, "namespace": None, "mode": "standalone"}},
    )  # fmt: skip


def request_bodies(entities: int, shape: int, features: list[str], zipf: bool, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    if zipf:
        ranked = rng.sample(range(entities), entities)  # rank -> entity, so hot keys are spread over the table
        weights = list(itertools.accumulate(1 / (r + 1) ** ZIPF_S for r in range(entities)))
        draw = lambda: ranked[rng.choices(range(entities), cum_weights=weights)[0]]  # noqa: E731
    else:
        draw = lambda: rng.randrange(entities)  # noqa: E731
    out = []
    for _ in range(BODIES):
        ids: list[int] = []
        while len(ids) < shape:
            i = draw()
            if i not in ids:
                ids.append(i)
        out.append(json.dumps({"features": features, "entities": {"entity_id": ids}}).encode())
    return out

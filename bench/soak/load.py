"""The soak's load: open loop (each request sent at its scheduled time, whatever the
answers before it took; latency counted from that time, so a stall is not hidden), over
keep-alive HTTP/1.1 connections on raw asyncio streams, and every 200 answer checked.

Run as a process of its own (``python -m bench.soak.load SPEC``), so the fault driver's
blocking calls never delay a request. SPEC (JSON): streams (url, rate, and either entity id
lists sent round-robin or how to draw ids afresh for each request), the bearer token every
request carries, the table the expected values come from, the wall-clock start, and a
stop file: the load runs until that file exists, then waits for the answers in flight and
writes one record per request to ``out``.

A checked answer: the entity column is the request's ids; for an entity of the table, its
50 values are exactly those of one date of the table (OLD or NEW, never some of each),
status PRESENT or STALE; for an id not in the table, every value null and NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

import orjson

TIMEOUT = 10.0
"""A request not answered by then counts as an error (status -2)."""
MAX_CONNECTIONS = 512
IDLE_REUSE = 2.0
"""Seconds an idle connection is reused for: well under a server's keep-alive timeout (uvicorn's is 5 s)."""
CONNECT_ERROR, TIMED_OUT, BAD_REPLY = -1, -2, -3
OK_STATUSES = frozenset(("PRESENT", "STALE"))


class Pool:
    """Idle keep-alive connections to one server; a new one when none is idle."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.idle = host, port, []
        self.slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        async with self.slots:
            while self.idle:
                reader, writer, since = self.idle.pop()
                if time.monotonic() - since < IDLE_REUSE:
                    try:
                        return await self._exchange(reader, writer, head, body)
                    except (ConnectionError, asyncio.IncompleteReadError) as exc:
                        if getattr(exc, "partial", b""):
                            raise
                        # closed by the server while idle, before any byte of an answer: a new connection, as HTTP clients do
                else:
                    writer.close()
            reader, writer = await asyncio.open_connection(self.host, self.port)
            return await self._exchange(reader, writer, head, body)

    async def _exchange(self, reader, writer, head: bytes, body: bytes) -> tuple[int, bytes]:
        try:
            writer.write(head + body)
            header = await reader.readuntil(b"\r\n\r\n")
            status = int(header[9:12])
            length, close = 0, False
            for line in header.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            data = await reader.readexactly(length)
        except BaseException:
            writer.close()
            raise
        if close:
            writer.close()
        else:
            self.idle.append((reader, writer, time.monotonic()))
        return status, data


def check(body: bytes, ids: list[int], old: dict, new: dict, detail: list) -> tuple[int, int, int, int]:
    """(entities answered with OLD values, with NEW values, absent and rightly NOT_FOUND, wrong);
    the first wrong ones are described in ``detail``."""
    try:
        results = orjson.loads(body)["results"]
        if results[0]["values"] != ids:
            raise ValueError(f"entity column {results[0]['values'][:5]}... is not the request's {ids[:5]}...")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        if len(detail) < 20:
            detail.append({"error": f"unreadable answer: {exc}"[:300]})
        return 0, 0, 0, len(ids)
    columns = results[1:]
    n_old = n_new = absent = wrong = 0
    for k, eid in enumerate(ids):
        got = tuple(c["values"][k] for c in columns)
        statuses = {c["statuses"][k] for c in columns}
        if eid not in old:
            if statuses == {"NOT_FOUND"} and all(v is None for v in got):
                absent += 1
                continue
        elif got == old[eid] and statuses <= OK_STATUSES:
            n_old += 1
            continue
        elif got == new.get(eid) and statuses <= OK_STATUSES:
            n_new += 1
            continue
        wrong += 1
        if len(detail) < 20:
            detail.append(_describe(eid, got, statuses, old.get(eid), new.get(eid)))
    return n_old, n_new, absent, wrong


def _describe(eid: int, got: tuple, statuses: set, old: tuple | None, new: tuple | None) -> dict:
    if old is None:
        return {"entity": eid, "problem": "not in the table, yet answered", "statuses": sorted(statuses)}
    as_old = sum(a == b for a, b in zip(got, old))
    as_new = sum(a == b for a, b in zip(got, new or ()))
    first = next((i for i, (a, b) in enumerate(zip(got, old)) if a != b and (new is None or a != new[i])), None)
    return {
        "entity": eid,
        "problem": "a mix of old and new values" if as_old and as_new and as_old + as_new >= len(got) else "wrong values",
        "values_as_old": as_old, "values_as_new": as_new, "statuses": sorted(statuses),
        "first_wrong": None if first is None else {"index": first, "got": got[first], "old": old[first], "new": new and new[first]},
    }  # fmt: skip


def draw_ids(rng: random.Random, shape: int, entities: int, absent_share: float, absent: int = 1000) -> list[int]:
    """``shape`` distinct ids uniform over the table's ``entities``; ``absent_share`` of them
    drawn from ``absent`` ids past its end (not in the table)."""
    ids: list[int] = []
    while len(ids) < shape:
        i = entities + rng.randrange(absent) if rng.random() < absent_share else rng.randrange(entities)
        if i not in ids:
            ids.append(i)
    return ids


def _error_type(body: bytes) -> str:
    try:
        return str(orjson.loads(body).get("type"))
    except (ValueError, AttributeError):
        return body[:40].decode(errors="replace")


def _streams(spec: dict, names: list[str]) -> list[dict]:
    """Each stream's pool, rate, request head (with the bearer token when the spec has one) and bodies or how to draw them."""
    auth = f"Authorization: Bearer {spec['token']}\r\n" if spec.get("token") else ""
    streams = []
    for s in spec["streams"]:
        host, port = s["url"].split("//", 1)[1].split(":")
        head = (f"POST /get-online-features HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{auth}"
                "Content-Length: ").encode()  # fmt: skip
        bodies = [orjson.dumps({"features": names, "entities": {"entity_id": ids}}) for ids in s.get("ids", ())]
        draw = s.get("draw")
        rng = random.Random(draw["seed"]) if draw else None
        streams.append({"pool": Pool(host, int(port)), "rate": s["rate"], "head": head, "bodies": bodies, "ids": s.get("ids"),
                        "draw": draw, "rng": rng})  # fmt: skip
    return streams


async def run(spec: dict) -> dict:
    from bench.soak.data import NEW_DATE, OLD_DATE, expected, features

    values = expected(Path(spec["table"]))
    old, new = values[OLD_DATE], values[NEW_DATE]
    names = features()
    streams = _streams(spec, names)
    records: list[list] = []
    detail: list = []
    samples: dict[str, str] = {}
    last: dict[str, bytes] = {}  # the last body of each kind: a fault's first errors may differ from those that persist
    tasks: set[asyncio.Task] = set()

    async def one(i: int, n: int, sched: float) -> None:
        s = streams[i]
        if s["draw"] is None:  # hot: a few bodies, round-robin
            ids = s["ids"][n % len(s["bodies"])]
            body = s["bodies"][n % len(s["bodies"])]
        else:  # cold: drawn afresh for each request, over the whole table
            ids = draw_ids(s["rng"], **{k: v for k, v in s["draw"].items() if k != "seed"})
            body = orjson.dumps({"features": names, "entities": {"entity_id": ids}})
        try:
            async with asyncio.timeout(TIMEOUT):
                status, data = await s["pool"].request(s["head"] + b"%d\r\n\r\n" % len(body), body)
        except TimeoutError:
            status, data = TIMED_OUT, b""
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            status, data = CONNECT_ERROR, type(exc).__name__.encode()
        latency = time.time() - sched
        counts = check(data, ids, old, new, detail) if status == 200 else (0, 0, 0, 0)
        if status != 200:
            kind = f"{status} {_error_type(data)} (port {s['pool'].port})"  # per server: their errors differ
            if kind not in samples:
                samples[kind] = data[:300].decode(errors="replace")
            last[kind] = data[:300]
        records.append([i, round(sched, 4), round(latency * 1000, 3), status, *counts])

    await _schedule(spec, streams, one, tasks)
    if tasks:
        await asyncio.wait(tasks)
    last_samples = {k: v.decode(errors="replace") for k, v in last.items()}
    return {"records": records, "wrong_detail": detail, "error_samples": samples, "error_samples_last": last_samples}


async def _schedule(spec: dict, streams: list[dict], one, tasks: set) -> None:
    """Start each request at its time, the earliest due among the streams first, until the stop file exists."""
    start, stop = spec["start"], Path(spec["stop"])
    nexts = [0] * len(streams)
    checked_stop = 0.0
    while True:
        now = time.time()
        if now - checked_stop > 0.25:
            checked_stop = now
            if stop.exists():
                return
        i = min(range(len(streams)), key=lambda j: nexts[j] / streams[j]["rate"])
        sched = start + nexts[i] / streams[i]["rate"]
        if sched > now:
            await asyncio.sleep(min(sched - now, 0.25))
            continue
        task = asyncio.get_running_loop().create_task(one(i, nexts[i], sched))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        nexts[i] += 1


def main(argv: list[str]) -> int:
    import uvloop

    spec = json.loads(Path(argv[0]).read_text())
    out = uvloop.run(run(spec))
    Path(spec["out"]).write_bytes(orjson.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

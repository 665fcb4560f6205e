"""The two push routes of Feast 0.67's feature server, answered by ``materialize serve``:

- ``POST /push``: ``{"push_source_name", "df": {column: [values]}, "to": "online" |
  "offline" | "online_and_offline"}``: every source whose ``push_source`` is that name;
- ``POST /write-to-online-store``: ``{"feature_view_name", "df"}``: that source (what Feast's
  SDK sends for ``FeatureStore.push`` and ``write_to_online_store`` with ``online_store:
  {type: remote}``).

A push is checked whole before anything is written (feature_push/rows.py); the offline
append, when asked for, comes before the stores, so a refused append writes nothing. Then
the stores (feature_push/stores.py), then this server's cache forgets the entities.
"""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from feature_defs import Definitions, SourceDef
from feature_push.errors import PushError
from feature_push.rows import Pushed, df_rows, pushed_rows, source_columns
from feature_push.stores import PushStores
from fm_config import RunConf
from serializers.errors import BadValue
from serializers.json_value import parse_text

PUSH, WRITE = "/push", "/write-to-online-store"
MODES = ("online", "offline", "online_and_offline")


class PushHandler:
    def __init__(self, conf: RunConf, defs: Definitions, reader):
        self.conf, self.defs, self.reader = conf, defs, reader
        self.settings = conf.server.push
        self.stores = PushStores(conf, defs.lock)  # reads the push credentials now: a missing one stops the start
        self.by_push_name: dict[str, list[SourceDef]] = {}
        for source in defs.sources.values():
            if source.push_source:
                self.by_push_name.setdefault(source.push_source, []).append(source)
        self.stats = {"pushes": 0, "rows": 0, "refused": 0}
        # two threads of their own: pushes waiting on a store never hold the threads reads borrow
        # (the reader fetches descriptions and makes connections in the loop's default executor); more
        # would only contend for the GIL with the reads' event loop (the soak's push phase: 1, 2 and 8
        # threads wrote 1,846, 1,904 and 1,550 pushes in 15 s, the reads' p99 best with 1-2); the loop
        # takes the GIL back within 1 ms, not Python's default 5
        self._threads = ThreadPoolExecutor(min(2, self.settings.max_in_flight), thread_name_prefix="push")
        sys.setswitchinterval(0.001)

    def collect(self):
        """Its counters in the server's /metrics (a Prometheus collector)."""
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily("feature_server_pushes", "Pushes written", value=self.stats["pushes"])
        yield CounterMetricFamily("feature_server_pushed_rows", "Rows of the pushes written", value=self.stats["rows"])
        yield CounterMetricFamily("feature_server_pushes_refused", "Pushes refused or failed (nothing of them written, or one store)",
                                  value=self.stats["refused"])  # fmt: skip

    def close(self) -> None:
        """The writers kept open between pushes (at the server's shutdown)."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.stores.close()

    async def _in_thread(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)

    async def handle(self, path: str, body: bytes, grants) -> bytes:
        try:
            return await self._handle(path, body, grants)
        except PushError:
            self.stats["refused"] += 1
            raise

    async def _handle(self, path: str, body: bytes, grants) -> bytes:
        # the body read and every row checked in the push's thread: on the event loop they held up
        # the reads for the whole check (the soak's push phase); a thread gives the GIL back each ms
        sources, to, df, rows, pushed = await self._in_thread(self._read, path, body, grants)
        # everything that can refuse the push is checked before the offline append, which cannot be taken back
        prepared = await self._in_thread(self.stores.prepare, pushed)
        appended = await self._offline(sources, df) if to != "online" else {}
        written: dict = {}
        if to != "offline":
            try:
                written = await self._in_thread(self.stores.write, prepared)
            except PushError as exc:
                if appended:  # a retry of the same push would append its rows again
                    raise PushError(
                        f"{exc} The rows were appended to the offline store already: retry with to: online.", exc.status, exc.kind
                    ) from None
                raise
            finally:  # whatever was written (a store may have taken it before another failed) is read anew
                for p in pushed:
                    self.reader.forget(p.source.name, p.ids)
        self.stats["pushes"] += 1
        self.stats["rows"] += rows
        return orjson.dumps({"status": "ok", "rows": rows, "written": written, **({"offline": appended} if appended else {})})

    def _read(self, path: str, body: bytes, grants) -> tuple:
        """The push's sources, ``to``, ``df``, its rows and each source's checked rows; PushError
        when anything refuses it."""
        request = _object(body)
        sources, to = self._targets(path, request, grants)
        df = request.get("df")
        rows = df_rows(df)  # a malformed df refuses the push, never answers 200 with nothing written
        if rows > self.settings.max_rows:
            limit = self.settings.max_rows
            raise PushError(f"the push holds {rows:,} rows; the limit is {limit:,} (server.push.max_rows)", 413, "TooManyRows")
        # every row checked as the stores would take it, whatever `to` says: an offline append the
        # run would refuse (a null key, a time no run accepts, a value its type refuses) stops its nights
        return sources, to, df, rows, self._checked(sources, df)

    def _checked(self, sources: list[SourceDef], df: dict) -> list[Pushed]:
        """Each source's rows of ``df``; a column one source lacks may be another's (one push
        source read by several sources with different features)."""
        entities = self.defs.entities
        columns = {s.name: source_columns(s, entities[s.entity]) for s in sources}
        max_key, skew = self.conf.reader.max_key_bytes, self.settings.clock_skew_seconds
        out = []
        for s in sources:
            others = frozenset().union(*(c for n, c in columns.items() if n != s.name))
            out.append(pushed_rows(s, entities[s.entity], df, max_key_bytes=max_key, skew_seconds=skew, others=others))
        return out

    def _targets(self, path: str, request: dict, grants) -> tuple[list[SourceDef], str]:
        if path == PUSH:
            name = request.get("push_source_name")
            if not isinstance(name, str):
                raise PushError("'push_source_name' must be the name of a push source")
            sources = self.by_push_name.get(name)
            if not sources:
                names = [n for n, ss in self.by_push_name.items() if grants is None or any(grants.may_push(s.name) for s in ss)]
                known = ", ".join(sorted(names)) or "none (a source takes pushes with push_source: <name>)"
                raise PushError(f"unknown push source {_cut(name)!r}; push sources: {known}", 404, "UnknownPushSource")
            to = request.get("to", "online")
            if to not in MODES:
                raise PushError(f"'to' must be one of {', '.join(MODES)}, not {_cut(to)!r}")
        else:
            name = request.get("feature_view_name")
            if not isinstance(name, str):
                raise PushError("'feature_view_name' must be the name of a source (Feast's feature view)")
            source = self.defs.sources.get(name)
            if grants is not None and not grants.may_push(name):  # before saying whether it exists
                raise PushError(f"this token does not grant pushing to {_cut(name)!r} (server.auth.grants: push)", 403, "Forbidden")
            if source is None:
                raise PushError(f"unknown feature view {_cut(name)!r}", 404, "UnknownFeatureView")
            sources, to = [source], "online"
        if grants is not None:
            refused = [s.name for s in sources if not grants.may_push(s.name)]
            if refused:
                names = ", ".join(map(repr, refused))
                raise PushError(f"this token does not grant pushing to {names} (server.auth.grants: push)", 403, "Forbidden")
        for s in sources:
            if not s.by_event_time:
                raise PushError(
                    f"source {s.name!r} is selected by date: it takes no pushes (a pushed row's event time is its as-of time; "
                    "select_by: event_time)",
                    400,
                    "NotPushable",
                )
        return sources, to

    async def _offline(self, sources: list[SourceDef], df: dict) -> dict[str, int]:
        if not self.settings.offline:
            raise PushError("pushes to the offline store are off on this server (server.push.offline: false)", 403, "OfflineOff")
        from feature_push.offline import append_offline

        tables: dict[Any, SourceDef] = {}
        for s in sources:  # views sharing one batch table append once
            tables.setdefault(s.location or s.table, s)
        done = {}
        for s in tables.values():
            keys = s.key_columns or [k.name for k in self.defs.entities[s.entity].keys]
            done[s.name] = await self._in_thread(append_offline, self.conf, s, df, keys)
        return done


def _object(body: bytes) -> dict:
    """The body as Python's json reads it, refusing duplicate keys and NaN: a json feature's
    value given as an object keeps every integer exact (orjson makes a float of one past 64
    bits, and keeps the last of two equal keys, where the run refuses both)."""
    try:
        request = parse_text(body)
    except BadValue as exc:
        raise PushError(f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise PushError("the body must be a JSON object")
    try:
        orjson.dumps(request)  # refuses a lone surrogate, in C: the walk below only names where
        where = None
    except orjson.JSONEncodeError:  # or an integer past 64 bits, which the row checks name
        where = _surrogate(request)
    if where is not None:  # Python's json reads "\\ud800" alone; no store can hold it (not UTF-8)
        raise PushError(f"{where}: a lone surrogate escape (\\ud800-\\udfff without its pair) is not text any store can hold")
    return request


def _surrogate(value: Any, where: str = "the body") -> str | None:
    """Where the first string holding a lone surrogate is (a key or a value), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        if isinstance(k, str) and _surrogate(k) is not None:
            return f"{where}, a key"
        found = _surrogate(v, f"{where}[{k!r}]" if isinstance(k, str) else f"{where}[{k}]")
        if found is not None:
            return found
    return None


def _cut(value: Any, n: int = 80) -> str:
    text = str(value)
    return text if len(text) <= n else text[:n] + "..."

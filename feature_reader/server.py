"""``materialize serve``: Feast's feature-server HTTP API on the asyncio reader.

An ASGI application served by uvicorn (httptools, uvloop), JSON by orjson: the stack
measured fastest among well-kept ones (bench/README.md, "The feature server"). Routes:

- ``POST /get-online-features``: Feast's request body, Feast's response body, byte for
  byte what ``materialize get`` prints for the same request;
- ``GET /health``: 200 when every configured store answers, else 503 naming the one that does not;
- ``GET /metrics``: Prometheus text (request latency by route and status, the reader's counters, requests in flight).

Limits from ``server:`` in conf: body bytes (413), requests in flight (503 at once:
back-pressure rather than a queue that grows), a deadline per request (504); entities per
request from ``reader.max_entities`` (400). Errors are JSON ``{"error": ..., "type": ...}``
naming the bad part; never a stack trace, a connection string or a password.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from feature_defs import load_definitions
from feature_reader.errors import EntityKeyError, ReadTimeout, RequestError, StoreError, UnknownNameError
from feature_reader.feast_request import parse_body
from feature_reader.reader import COUNTERS, AsyncFeatureReader
from fm_config import load_config

log = logging.getLogger("feature_reader.server")

ONLINE = "/get-online-features"
ROUTES = {ONLINE: b"POST", "/health": b"GET", "/metrics": b"GET"}
JSON = b"application/json"
GC_THRESHOLDS = (700, 10, 1000)
"""Python's defaults but the last: a full collection after 1,000 middle ones, not 10."""
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.kind = status, kind


class _ReaderCounters:
    """The reader's counters as Prometheus counters, read when scraped."""

    def __init__(self, reader: AsyncFeatureReader):
        self.reader = reader

    def collect(self):
        stats = self.reader.stats
        for name in COUNTERS:
            yield CounterMetricFamily(f"feature_reader_{name}", f"reader.stats['{name}']", value=stats[name])
        cache = self.reader.cache
        if cache is not None:
            cache.sweep()  # entries past their stale window leave even when nothing is read
            yield GaugeMetricFamily("feature_reader_cache_entries", "Entries in the L1 cache", value=len(cache))
            yield GaugeMetricFamily("feature_reader_cache_bytes", "Bytes the L1 cache holds (reader.cache.max_bytes)", value=cache.bytes)


class FeatureServer:
    """The ASGI application: one asyncio reader (L1 cache and single-flight as conf says)."""

    def __init__(self, reader: AsyncFeatureReader):
        self.reader = reader
        self.settings = reader.conf.server
        self.in_flight = 0
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "feature_server_request_seconds", "Time to answer a request, by route and status", ["route", "status"],
            buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._series: dict[tuple[str, int], Any] = {}
        self.in_flight_gauge = Gauge("feature_server_in_flight_requests", "Requests being answered", registry=self.registry)
        self.in_flight_gauge.set_function(lambda: self.in_flight)
        self.registry.register(_ReaderCounters(reader))

    @classmethod
    def from_conf(cls, env: str | None = None, *, overrides: dict | None = None) -> FeatureServer:
        return cls(_reader(load_config(env, overrides)))

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        start = time.perf_counter()
        path = scope["path"]
        route = path if path in ROUTES else "other"
        try:
            status, body, kind = await self._answer(scope, receive, path)
        except _Refused as exc:
            status, body, kind = exc.status, orjson.dumps({"error": str(exc), "type": exc.kind}), JSON
        except Exception as exc:  # a bug: logged by type and first line, answered without details
            log.error("%s %s failed: %s: %s", scope["method"], path, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            status, body, kind = 500, orjson.dumps({"error": "internal error (logged by the server)", "type": "InternalError"}), JSON
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(body))]}
        )
        await send({"type": "http.response.body", "body": body})
        series = self._series.get((route, status))
        if series is None:  # labels() takes a lock and builds the key each call: kept per (route, status)
            series = self._series[(route, status)] = self.latency.labels(route, str(status))
        series.observe(time.perf_counter() - start)

    async def _answer(self, scope: dict, receive, path: str) -> tuple[int, bytes, bytes]:
        method = scope["method"].encode()
        if path not in ROUTES:
            raise _Refused(404, f"no route {path}; routes: {', '.join(ROUTES)}", "NotFound")
        if method != ROUTES[path]:
            raise _Refused(405, f"{path} takes {ROUTES[path].decode()}, not {method.decode()}", "MethodNotAllowed")
        if path == ONLINE:
            return await self._online(scope, receive)
        if path == "/health":
            stores = await self.reader.ping()
            ready = all(v == "ok" for v in stores.values())
            return (200 if ready else 503), orjson.dumps({"status": "ready" if ready else "unavailable", "stores": stores}), JSON
        return 200, generate_latest(self.registry), b"text/plain; version=0.0.4; charset=utf-8"

    async def _online(self, scope: dict, receive) -> tuple[int, bytes, bytes]:
        if self.in_flight >= self.settings.max_in_flight:
            raise _Refused(503, f"overloaded: {self.in_flight} requests in flight (server.max_in_flight); retry later", "Overloaded")
        self.in_flight += 1
        try:
            body = await self._body(scope, receive)
            try:
                args = parse_body(body)
                async with asyncio.timeout(self.settings.deadline_ms / 1000):
                    result = await self.reader.get_online_features(**args)
            except UnknownNameError as exc:
                raise _Refused(404, str(exc), type(exc).__name__) from None
            except EntityKeyError as exc:
                raise _Refused(422, str(exc), type(exc).__name__) from None
            except RequestError as exc:
                raise _Refused(400, str(exc), type(exc).__name__) from None
            except (ReadTimeout, TimeoutError) as exc:
                message = str(exc) or f"no answer within {self.settings.deadline_ms:.0f} ms (server.deadline_ms)"
                raise _Refused(504, message, "ReadTimeout") from None
            except StoreError as exc:
                raise _Refused(503, str(exc), type(exc).__name__) from None
            return 200, result.to_feast_json(), JSON
        finally:
            self.in_flight -= 1

    async def _body(self, scope: dict, receive) -> bytes:
        limit = self.settings.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _Refused(
                    413, f"the request body is {int(value):,} bytes; the limit is {limit:,} (server.max_body_bytes)", "BodyTooLarge"
                )
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "the client went away before sending its body", "Disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Refused(413, f"the request body passes {limit:,} bytes (server.max_body_bytes)", "BodyTooLarge")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                gc.collect()
                gc.freeze()  # what start-up made is not garbage: full collections then skip it
                # the cache holds up to reader.cache.max_entries rows, a few tracked objects
                # each; a full collection walks them all (130 ms at 180,000 rows, measured), and
                # with the default thresholds it came every few seconds while the cache filled
                gc.set_threshold(*GC_THRESHOLDS)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.reader.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def serve(env: str | None, host: str | None, port: int | None, workers: int = 1) -> None:
    """Run the server until SIGTERM or Ctrl-C (in-flight requests finish first)."""
    serve_conf(load_config(env), host, port, workers)


def serve_conf(conf, host: str | None = None, port: int | None = None, workers: int = 1) -> None:
    """``serve`` on a loaded conf (the load benchmark builds its own)."""
    import os

    import uvicorn

    from feature_reader.one_write import OneWriteProtocol

    host = host or conf.server.host
    port = conf.server.port if port is None else port
    # proxy_headers off: X-Forwarded-For only sets the client's address, which nothing here logs
    options: dict[str, Any] = dict(
        host=host,
        port=port,
        loop="uvloop",
        http=OneWriteProtocol,
        ws="none",
        access_log=False,
        proxy_headers=False,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=30,
    )
    print(f"[serve] Feast's feature-server API on http://{host}:{port} (env {conf.env}; {workers} worker{'s' * (workers > 1)}): "
          f"POST /get-online-features, GET /health, GET /metrics. Ctrl-C or SIGTERM stops it.", flush=True)  # fmt: skip
    if workers > 1:
        os.environ["FM_SERVE_ENV"] = conf.env
        uvicorn.run("feature_reader.server:_app_from_env", factory=True, workers=workers, **options)
    else:
        uvicorn.run(FeatureServer(_reader(conf)), **options)
    print("[serve] stopped", flush=True)


def _reader(conf) -> AsyncFeatureReader:
    """The server's reader: embeddings decoded straight to lists (the body is JSON)."""
    conf = conf.model_copy(update={"reader": conf.reader.model_copy(update={"embeddings": "list"})})
    return AsyncFeatureReader(conf, load_definitions(conf.path(conf.definitions_dir)))


def _app_from_env() -> FeatureServer:
    """Each worker process's application (uvicorn's factory for --workers > 1)."""
    import os

    return FeatureServer.from_conf(os.environ.get("FM_SERVE_ENV"))

"""``materialize serve``: Feast's feature-server HTTP API on the asyncio reader.

An ASGI application served by uvicorn (httptools, uvloop), JSON by orjson: the stack
measured fastest among well-kept ones (bench/README.md, "The feature server"). Routes:

- ``POST /get-online-features``: Feast's request body, Feast's response body, byte for
  byte what ``materialize get`` prints for the same request;
- ``GET /health`` (and ``GET /health/ready``, readiness): 200 when every configured store
  answers on the reader's own connections, else 503 naming the one that does not (with
  server.auth, why only to a caller whose token verifies: others get "unavailable", the log
  gets the reason once per change); the answer is kept ``server.health_cache_ms`` (unless a
  store call failed since), so probes at any rate cost one check per period;
- ``GET /health/live`` (liveness): 200 while the process answers, whatever the stores;
- ``GET /metrics``: Prometheus text (request latency by route and status, the reader's counters, requests in flight,
  the last readiness check: ready, each store up, entity types a store does not describe);
- ``GET /openapi.json``: the OpenAPI document of these routes (feature_reader/openapi.py);
- ``POST /push`` and ``POST /write-to-online-store``: Feast's push API, when the server was
  built with a push handler (``server.push.enabled``: feature_push/); else 403 saying so.

Every GET route answers HEAD too; a wrong method gets 405 with ``Allow``.

Limits from ``server:`` in conf: body bytes (413), requests in flight (503 at once:
back-pressure rather than a queue that grows; a request counts once its body is read),
a deadline per request (504); entities per request from ``reader.max_entities`` (400).
Connections (read timeout, idle timeout, write deadline, header size and count, how many, unsent answer bytes): one_write.py.
A POST body must be JSON (415 otherwise). Errors are JSON ``{"error": ..., "type": ...}``
naming the bad part, names cut to 100 characters; never a stack trace, a connection
string or a password.
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
from feature_reader.auth import Authenticator, AuthError
from feature_reader.errors import EntityKeyError, ReadTimeout, RequestError, StoreError, UnknownNameError, shown
from feature_reader.feast_request import parse_body
from feature_reader.openapi import openapi_json
from feature_reader.reader import COUNTERS, AsyncFeatureReader
from fm_config import load_config

log = logging.getLogger("feature_reader.server")

ONLINE = "/get-online-features"
PUSHES = ("/push", "/write-to-online-store")
ROUTES = {
    ONLINE: b"POST", "/health": b"GET", "/health/live": b"GET", "/health/ready": b"GET", "/metrics": b"GET", "/openapi.json": b"GET",
    PUSHES[0]: b"POST", PUSHES[1]: b"POST",
}  # fmt: skip
"""Route -> its method; every GET route answers HEAD too (uvicorn sends the head only)."""
JSON = b"application/json"
GC_THRESHOLDS = (700, 10, 1000)
"""Python's defaults but the last: a full collection after 1,000 middle ones, not 10."""
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: tuple = ()):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, list(headers)


def allowed(path: str) -> tuple[bytes, ...]:
    """The methods a route answers."""
    method = ROUTES[path]
    return (method, b"HEAD") if method == b"GET" else (method,)


class _ReaderCounters:
    """The reader's counters as Prometheus counters, read when scraped."""

    def __init__(self, reader: AsyncFeatureReader):
        self.reader = reader

    def collect(self):
        stats = self.reader.stats
        for name in COUNTERS:
            yield CounterMetricFamily(f"feature_reader_{name}", f"reader.stats['{name}']", value=stats[name])
        breakers = GaugeMetricFamily(
            "feature_reader_breaker_state", "A store's circuit breaker: 0 closed, 1 open (calls skipped), 2 half-open", labels=["store"]
        )
        for store, state in self.reader.breaker_states.items():
            breakers.add_metric([store], state)
        yield breakers
        yield GaugeMetricFamily(
            "feature_reader_refused_features",
            "Features a store holds as something else than the definitions say: their cells answer INVALID",
            value=self.reader.refused_features,
        )
        cache = self.reader.cache
        if cache is not None:
            cache.sweep()  # entries past their stale window leave even when nothing is read
            yield GaugeMetricFamily("feature_reader_cache_entries", "Entries in the L1 cache", value=len(cache))
            yield GaugeMetricFamily("feature_reader_cache_bytes", "Bytes the L1 cache holds (reader.cache.max_bytes)", value=cache.bytes)


class _HealthGauges:
    """The last readiness check as gauges (the alert rules read them: conf/base/monitoring)."""

    def __init__(self, server: FeatureServer):
        self.server = server

    def collect(self):
        kept = self.server._health
        yield GaugeMetricFamily(
            "feature_server_ready", "1 when every store answered the last readiness check", value=int(kept[2] == 200 if kept else 0)
        )
        up = GaugeMetricFamily("feature_server_store_up", "1 when the store answered the last readiness check", labels=["store"])
        for store, state in self.server._store_states.items():
            up.add_metric([store], int(state == "ok"))
        yield up
        undescribed = GaugeMetricFamily(
            "feature_server_undescribed_entity_types",
            "Entity types a store holds no description of (their reads answer INVALID)",
            labels=["store"],
        )
        for store, said in self.server.reader.descriptions.items():
            undescribed.add_metric([store], len(said.get("undescribed", [])))
        yield undescribed


class FeatureServer:
    """The ASGI application: one asyncio reader (L1 cache and single-flight as conf says)."""

    def __init__(self, reader: AsyncFeatureReader, push=None):
        self.reader = reader
        self.push = push
        """The push routes' handler (feature_push.handler.PushHandler), None: push is off."""
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
        from feature_reader.one_write import LARGE, UNSENT, give_back_soon  # uvicorn's protocol: the [server] extra

        self._large, self._give_back = LARGE, give_back_soon

        unsent = Gauge(
            "feature_server_unsent_bytes", "Answer bytes written and not yet taken by slow clients (server.max_unsent_bytes)",
            registry=self.registry,
        )  # fmt: skip
        unsent.set_function(lambda: UNSENT.bytes)
        self.registry.register(_ReaderCounters(reader))
        self.registry.register(_HealthGauges(self))
        self.pushes_in_flight = 0
        if push is not None:
            self.registry.register(push)  # its counters: pushes, rows, refused
            gauge = Gauge("feature_server_pushes_in_flight", "Pushes being answered", registry=self.registry)
            gauge.set_function(lambda: self.pushes_in_flight)
        # (when, failed calls then, status, body, body without the stores' details) of the last check
        self._health: tuple[float, int, int, bytes, bytes] | None = None
        self._store_states: dict[str, str] = {}  # each store's last health answer: a change is logged
        self._checking: asyncio.Future | None = None
        auth = self.settings.auth
        # max_features checked before authorizing: an oversized request is refused before its names are looked at
        limit = reader.conf.reader.max_features
        self.auth = Authenticator(auth, reader.defs, reader.conf.path, max_features=limit) if auth.mode == "jwt" else None
        if self.auth:
            self.auth.register(self.registry)

    @classmethod
    def from_conf(cls, env: str | None = None, *, overrides: dict | None = None) -> FeatureServer:
        return cls(server_reader(load_config(env, overrides)))

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        start = time.perf_counter()
        path = scope["path"]
        route = path if path in ROUTES else "other"
        extra: list = []
        try:
            status, body, kind = await self._answer(scope, receive, path)
        except _Refused as exc:
            status, body, kind, extra = exc.status, orjson.dumps({"error": str(exc), "type": exc.kind}), JSON, exc.headers
        except asyncio.CancelledError:  # uvicorn's shutdown grace ran out while this was being answered
            log.warning("%s %s cancelled: the shutdown grace (server.shutdown_grace_ms) ran out", scope["method"], shown(path))
            status, body, kind = 503, orjson.dumps({"error": "the server is stopping", "type": "ShuttingDown"}), JSON
            extra = [(b"connection", b"close")]
        except AuthError as exc:  # 401 with its WWW-Authenticate, 403, or 503 while the JWKS cannot be fetched
            status, body, kind, extra = exc.status, orjson.dumps({"error": str(exc), "type": exc.kind}), JSON, exc.headers
        except Exception as exc:  # a bug: logged by type and first line, answered without details
            log.error("%s %s failed: %s: %s", scope["method"], shown(path), type(exc).__name__, shown(str(exc).split("\n")[0], 200))
            status, body, kind = 500, orjson.dumps({"error": "internal error (logged by the server)", "type": "InternalError"}), JSON
        await send(
            {
                "type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(body)), *extra],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})
        series = self._series.get((route, status))
        if series is None:  # labels() takes a lock and builds the key each call: kept per (route, status)
            series = self._series[(route, status)] = self.latency.labels(route, str(status))
        series.observe(time.perf_counter() - start)

    async def _answer(self, scope: dict, receive, path: str) -> tuple[int, bytes, bytes]:
        method = scope["method"].encode()
        if path not in ROUTES:
            raise _Refused(404, f"no route {shown(path)}; routes: {', '.join(ROUTES)}", "NotFound")
        methods = allowed(path)
        if method not in methods:
            names = ", ".join(m.decode() for m in methods)
            raise _Refused(405, f"{path} takes {names}, not {shown(method.decode())}", "MethodNotAllowed", [(b"allow", names.encode())])
        grants = await self.auth.authenticate(path, scope["headers"]) if self.auth else None
        if path == ONLINE:
            return await self._online(scope, receive, grants)
        if path in PUSHES:
            return await self._push(scope, receive, path, grants)
        if path == "/health" or path == "/health/ready":
            status, detailed, brief = await self._ready()
            return status, (detailed if await self._shown_details(scope["headers"]) else brief), JSON
        if path == "/health/live":
            return 200, b'{"status":"alive"}', JSON
        if path == "/openapi.json":
            return 200, openapi_json(), JSON
        await self._ready()  # the stores' state for the health gauges: the kept check, as probes get it
        return 200, generate_latest(self.registry), b"text/plain; version=0.0.4; charset=utf-8"

    async def _shown_details(self, headers) -> bool:
        """Whether a health answer may name the stores' addresses and errors: to every caller
        without server.auth (a read's 503 names them too), else to a caller whose token verifies."""
        if self.auth is None:
            return True
        if not any(name == b"authorization" for name, _ in headers):
            return False
        try:
            await self.auth.authenticate(ONLINE, headers)  # as for a read: the health routes themselves are open
        except AuthError:
            return False  # still the open answer: a probe with a stale token is a probe
        return True

    async def _ready(self) -> tuple[int, bytes, bytes]:
        """The stores' check (status, body, body without details), kept server.health_cache_ms
        unless a store call failed since; probes arriving during one share it."""
        kept = self._health
        if kept is not None and kept[1] == self.reader.failed_calls and time.monotonic() - kept[0] < self.settings.health_cache_ms / 1000:
            return kept[2], kept[3], kept[4]
        if self._checking is None or self._checking.done():
            self._checking = asyncio.ensure_future(self._check())
        return await asyncio.shield(self._checking)

    async def _check(self) -> tuple[int, bytes, bytes]:
        failed = self.reader.failed_calls
        stores = await self.reader.ping()
        self._log_stores(stores)
        ready = all(v == "ok" for v in stores.values())
        answer = {"status": "ready" if ready else "unavailable", "stores": stores}
        # what each store holds against the definitions: features refused there, entity types not yet described
        described = await self.reader.describe()
        if described:
            answer["descriptions"] = described
        status, body = (200 if ready else 503), orjson.dumps(answer)
        brief = {"status": answer["status"], "stores": {name: "ok" if v == "ok" else "unavailable" for name, v in stores.items()}}
        self._health = (time.monotonic(), failed, status, body, orjson.dumps(brief))
        return status, body, self._health[4]

    def _log_stores(self, stores: dict[str, str]) -> None:
        """A store's failure logged when it begins or changes, and its return: once per change
        however often probes come (the open health answer says only 'unavailable')."""
        for name, state in stores.items():
            if state != self._store_states.get(name, "ok"):
                if state == "ok":
                    log.warning("store %s answers again", name)
                else:
                    log.warning("store %s does not answer: %s", name, shown(state, 300))
        self._store_states = stores

    async def _online(self, scope: dict, receive, grants=None) -> tuple[int, bytes, bytes]:
        _json_only(scope["headers"], self.settings.require_content_type)
        body = await self._body(scope, receive)  # not in flight yet: the connection's read timeout bounds this
        if len(body) >= self._large:  # its parts come from the heap: given back once this request is done
            self._give_back(asyncio.get_running_loop())
        if self.in_flight >= self.settings.max_in_flight:
            raise _Refused(503, f"overloaded: {self.in_flight} requests in flight (server.max_in_flight); retry later", "Overloaded")
        self.in_flight += 1
        try:
            try:
                args = parse_body(body)
                if grants is not None:
                    self.auth.authorize(grants, args)
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

    async def _push(self, scope: dict, receive, path: str, grants) -> tuple[int, bytes, bytes]:
        if self.push is None:
            raise _Refused(403, "this server takes no pushes (server.push.enabled: false)", "PushDisabled")
        _json_only(scope["headers"], self.settings.require_content_type)
        body = await self._body(scope, receive)
        if self.in_flight >= self.settings.max_in_flight:
            raise _Refused(503, f"overloaded: {self.in_flight} requests in flight (server.max_in_flight); retry later", "Overloaded")
        if self.pushes_in_flight >= self.settings.push.max_in_flight:  # reads keep the rest of max_in_flight
            raise _Refused(
                503, f"overloaded: {self.pushes_in_flight} pushes in flight (server.push.max_in_flight); retry later", "Overloaded"
            )
        self.in_flight += 1
        self.pushes_in_flight += 1
        try:  # no deadline: a push cut short would still be written, and its answer would say otherwise
            return 200, await self.push.handle(path, body, grants), JSON
        except Exception as exc:
            if hasattr(exc, "status") and hasattr(exc, "kind"):  # feature_push.errors.PushError
                raise _Refused(exc.status, str(exc), exc.kind) from None
            raise
        finally:
            self.in_flight -= 1
            self.pushes_in_flight -= 1

    async def _body(self, scope: dict, receive) -> bytes:
        limit = self.settings.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise _Refused(
                    413, f"the request body is {int(value):,} bytes; the limit is {limit:,} (server.max_body_bytes)", "BodyTooLarge",
                    [(b"connection", b"close")],  # its body is not read: the connection cannot carry another request
                )  # fmt: skip
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refused(400, "the client went away before sending its body", "Disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                text = f"the request body passes {limit:,} bytes (server.max_body_bytes)"
                raise _Refused(413, text, "BodyTooLarge", [(b"connection", b"close")])
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                gc.collect()
                gc.freeze()  # what start-up made is not garbage: full collections then skip it
                from feature_reader.one_write import fixed_mmap_threshold

                fixed_mmap_threshold()
                # the cache holds up to reader.cache.max_entries rows, a few tracked objects
                # each; a full collection walks them all (130 ms at 180,000 rows, measured), and
                # with the default thresholds it came every few seconds while the cache filled
                gc.set_threshold(*GC_THRESHOLDS)
                self.reader.warm()  # the stores' connections open in the background; a store down does not stop the start
                if self.auth:
                    self.auth.start()  # the JWKS URL's first fetch, in the background: reads get 503 until keys arrive
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.reader.close()
                if self.push is not None:
                    self.push.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _json_only(headers: list, required: bool) -> None:
    """415 unless the body is declared JSON. A missing Content-Type passes unless ``required``:
    Feast's remote online-store client sends none."""
    for name, value in headers:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            if media == JSON or (media.startswith(b"application/") and media.endswith(b"+json")):
                return
            raise _Refused(415, f"the request body must be JSON (Content-Type: application/json), not {shown(media.decode('latin-1'))}",
                           "UnsupportedMediaType")  # fmt: skip
    if required:
        raise _Refused(415, "the request has no Content-Type; send Content-Type: application/json (server.require_content_type)",
                       "UnsupportedMediaType")  # fmt: skip


APP = "feature_reader.server:build_app"
"""What builds the application: ``module:function`` taking a loaded conf (or none: then the
env's, in each worker process). The command line's builds one that takes pushes too."""


def serve(env: str | None, host: str | None, port: int | None, workers: int = 1, insecure_no_auth: bool = False, app: str = APP) -> None:
    """Run the server until SIGTERM or Ctrl-C (in-flight requests finish first)."""
    serve_conf(load_config(env), host, port, workers, insecure_no_auth, app)


def serve_conf(
    conf, host: str | None = None, port: int | None = None, workers: int = 1, insecure_no_auth: bool = False, app: str = APP
) -> None:
    """``serve`` on a loaded conf (the load benchmark builds its own); AuthConfigError when it must not start."""
    import importlib
    import os
    from functools import partial

    from feature_reader.auth import AuthConfigError, check_start, is_loopback
    from feature_reader.one_write import Limits, OneWriteProtocol
    from feature_reader.tls import start_error, uvicorn_options

    host = host or conf.server.host
    port = conf.server.port if port is None else port
    auth = check_start(conf.server, host, insecure_no_auth, conf.path)
    if (problem := start_error(conf.server.tls, conf.path)) is not None:
        raise AuthConfigError(problem)
    tls = uvicorn_options(conf.server.tls, conf.path)
    _open_files(conf.server.max_connections)
    # proxy_headers off: X-Forwarded-For only sets the client's address, which nothing here logs
    options: dict[str, Any] = dict(
        host=host,
        port=port,
        loop="uvloop",
        http=partial(OneWriteProtocol, limits=Limits.from_settings(conf.server)),
        ws="none",
        access_log=False,
        proxy_headers=False,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=conf.server.shutdown_grace_ms / 1000,
        **tls,
    )
    scheme = "https" if tls else "http"
    who = "bearer tokens (server.auth)" if auth == "jwt" else "no authentication"
    if tls.get("ssl_ca_certs"):
        who += f", client certificates {conf.server.tls.client_cert}"
    pushes = "POST /push, POST /write-to-online-store, " if conf.server.push.enabled and app != APP else ""
    if pushes and auth == "none" and not is_loopback(host):
        who += ", so anyone who reaches the port may push (write) to the stores"
    banner = (f"[serve] Feast's feature-server API on {scheme}://{host}:{port} (env {conf.env}; {workers} worker{'s' * (workers > 1)}; "
              f"{who}): POST /get-online-features, {pushes}GET /health[/live|/ready], GET /metrics, GET /openapi.json. "
              "Ctrl-C or SIGTERM stops it.")  # fmt: skip
    if workers > 1:
        os.environ["FM_SERVE_ENV"] = conf.env
        _run(app, workers, banner, options)
    else:
        module, _, function = app.partition(":")
        _run(getattr(importlib.import_module(module), function)(conf), workers, banner, options)
    print("[serve] stopped", flush=True)


def _run(app, workers: int, banner: str, options: dict) -> None:
    """uvicorn.run, printing ``banner`` once the port is bound (a start that never binds must not say it serves)."""
    import sys

    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(app, workers=workers, factory=workers > 1, **options)
    if workers > 1:
        sockets = [config.bind_socket()]
        print(banner, flush=True)
        Multiprocess(config, sockets=sockets).run()
        return

    class Bound(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                print(banner, flush=True)

    server = Bound(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _open_files(connections: int) -> None:
    """The soft open-file limit raised to what server.max_connections needs, plus room for the
    stores' connections and the process's own files, as far as the hard limit allows."""
    import resource

    want = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < want:
        print(f"[serve] warning: open files are limited to {raised} (ulimit -n); server.max_connections {connections} needs {want}: "
              f"connections past the limit fail to be accepted", flush=True)  # fmt: skip


def server_reader(conf) -> AsyncFeatureReader:
    """The server's reader: embeddings decoded straight to lists (the body is JSON)."""
    conf = conf.model_copy(update={"reader": conf.reader.model_copy(update={"embeddings": "list"})})
    return AsyncFeatureReader(conf, load_definitions(conf.path(conf.definitions_dir)))


def build_app(conf=None) -> FeatureServer:
    """The application on ``conf``; without one (uvicorn's factory in each worker process for
    --workers > 1), on the env ``serve`` was given."""
    import os

    return FeatureServer(server_reader(conf or load_config(os.environ.get("FM_SERVE_ENV"))))

"""Reading and serving features: ``get`` and ``serve``."""

from __future__ import annotations

import sys

from jobs.cli.common import load
from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
)


def add_get(sub) -> None:
    get = sub.add_parser(
        "get",
        help="read features as a model does; print Feast's response body",
        description="Read a Feast get-online-features request body (JSON: features or feature_service, entities, "
        "full_feature_names; from --request or stdin) and print the response body the feature server returns for it "
        "(results with values, statuses and event_timestamps; metadata.feature_names). No Spark needed.",
    )
    get.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    get.add_argument("--request", metavar="FILE", help="the request body (default: stdin)")
    get.add_argument(
        "--store", choices=["redis", "sql", "cockroach"], help="read this store only (default: each source's stores from conf, Redis first)"
    )
    get.add_argument("--redis-url", help="another Redis than redis.url")
    get.add_argument("--pretty", action="store_true", help="indent the JSON (default: compact, as the server sends it)")


def add_serve(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve features over HTTP: Feast's feature-server API",
        description="Serve POST /get-online-features (Feast's request and response bodies), GET /health and GET /metrics "
        "(Prometheus) on the asyncio reader of the env's conf and definitions. Stops on SIGTERM or Ctrl-C once the "
        "requests in flight are answered. Limits: server.* and reader.max_entities in conf. HTTPS: server.tls; bearer tokens: "
        "server.auth (off on a loopback address; on any other, serve refuses to start without it unless told so).",
    )
    serve.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    serve.add_argument("--host", help="address to listen on (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: server.port, 6566 as Feast's)")
    serve.add_argument("--workers", type=int, default=1, help="server processes, each with its own reader and cache (default 1)")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without authentication on a non-loopback address (refused otherwise unless server.auth.mode is set; "
        "e.g. behind a proxy that authenticates)",
    )


STORE_LABELS = {"redis": "Redis", "sql": "the SQL store"}


def cmd_get(args) -> int:
    import json

    from feature_reader import FeatureReader, RequestError, StoreError
    from feature_reader.feast_request import parse_body
    from fm_config.stores import store_name

    try:
        body = open(args.request, "rb").read() if args.request else sys.stdin.buffer.read()
    except OSError as exc:
        print(f"error: cannot read the request {args.request}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    conf, defs = load(args)
    try:
        request = parse_body(body)
        with FeatureReader(conf, defs, cache=False, redis_url=args.redis_url) as reader:
            result = reader.get_online_features(**request, store=args.store and store_name(args.store, "--store"))
            described = reader.descriptions
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for store, said in described.items():  # what the stores read hold against the definitions (serializers/FORMAT.md)
        for line in said["refused"]:
            print(f"note: INVALID: {line}", file=sys.stderr)
        if said["undescribed"]:
            print(f"note: {STORE_LABELS[store]} does not describe {', '.join(said['undescribed'])} yet (read as written)", file=sys.stderr)
    if args.pretty:
        print(json.dumps(result.to_feast(), indent=1, ensure_ascii=False))
    else:
        sys.stdout.buffer.write(result.to_feast_json() + b"\n")
    return EXIT_OK


def cmd_serve(args) -> int:
    from feature_push.app import APP
    from feature_reader.server import serve

    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    serve(args.env, args.host, args.port, args.workers, args.insecure_no_auth, app=APP)
    return EXIT_OK

"""The feature server (``materialize serve``): its port, TLS files and authentication."""

from __future__ import annotations

import json
import socket

from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine


def check_server(conf: RunConf) -> list[DoctorLine]:
    """``server:``: the port (free, or a feature server already answers there), the TLS files
    (readable, PEM, the key the certificate's, not expired or expiring soon) and the
    authentication (JWKS readable and parsed; unauthenticated only where serve allows it)."""
    from feature_reader.auth import AuthConfigError, KeySet, is_loopback
    from feature_reader.tls import check_tls_files

    server = conf.server
    checks = [_server_port(server.host, server.port, bool(server.tls.cert_file))]
    checks += [DoctorLine(status, name, detail, _TLS_FIX) for status, name, detail in check_tls_files(server.tls, conf.path)]
    auth, loopback = server.auth, is_loopback(server.host)
    if auth.mode == "jwt":
        where = f"jwks_file {conf.path(auth.jwks_file)}" if auth.jwks_file else f"jwks_url {auth.jwks_url}"
        try:
            keys = KeySet(auth, conf.path)
        except AuthConfigError as exc:
            return [*checks, DoctorLine("fail", "server auth", str(exc), "point server.auth.jwks_file at the identity provider's JWKS")]
        if keys.failure:
            checks.append(DoctorLine("fail", "server auth", keys.failure, "check server.auth.jwks_url and this host's network"))
        else:
            checks.append(DoctorLine("ok", "server auth", f"JWT: {where}: {len(keys.keys)} key(s); issuer {auth.issuer}"))
    elif auth.mode == "none" and not loopback:
        checks.append(
            DoctorLine(
                "warn", "server auth", f"none on {server.host} (server.auth.mode: none): anyone reaching the port reads every feature"
            )
        )
    elif auth.mode is None and not loopback:
        checks.append(
            DoctorLine("fail", "server auth", f"serve refuses to start unauthenticated on {server.host}",
                  "set server.auth (mode: jwt), or server.auth.mode: none to serve unauthenticated on purpose")
        )  # fmt: skip
    else:
        checks.append(DoctorLine("ok", "server auth", f"none: {server.host} is a loopback address"))
    if not loopback and not server.tls.cert_file:
        checks.append(DoctorLine("warn", "server tls", f"plain HTTP on {server.host}: requests and tokens travel in clear", _TLS_FIX))
    return checks


_TLS_FIX = "fix server.tls (cert_file, key_file, client_ca_file): feature_reader/README.md 'TLS'"


def _server_port(host: str, port: int, tls: bool) -> DoctorLine:
    import errno
    import ssl
    import urllib.error
    import urllib.request

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a connection in TIME_WAIT does not count
        try:
            sock.bind((host, port))
            return DoctorLine("ok", "server port", f"{host}:{port} is free")
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return DoctorLine("fail", "server port", f"{host}:{port}: {exc.strerror}", "set server.host to an address of this machine")
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    url = f"{'https' if tls else 'http'}://{f'[{probe}]' if ':' in probe else probe}:{port}/health"
    context = ssl._create_unverified_context() if tls else None  # noqa: S323 (only asks who holds the port)
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310
            body = json.loads(response.read(65536))
    except urllib.error.HTTPError as exc:  # 503: ours, a store down
        try:
            body = json.loads(exc.read(65536))
        except ValueError:
            body = None
    except (OSError, ValueError):
        body = None
    if isinstance(body, dict) and "stores" in body:
        return DoctorLine("ok", "server port", f"{host}:{port}: a feature server already answers there ({body.get('status')})")
    return DoctorLine("fail", "server port", f"{host}:{port} is taken by another program", "stop it, or set server.port")

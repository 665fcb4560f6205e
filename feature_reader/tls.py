"""The feature server's TLS files (``server.tls``) checked before they are used: each exists, is
readable, parses as PEM, the key is the certificate's, the certificate is valid now (and for
how long). ``materialize serve`` refuses to start on a failure, naming the file and the
setting; ``materialize doctor`` prints every finding."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Literal

Finding = tuple[Literal["ok", "warn", "fail"], str, str]
"""(status, what was checked, detail)."""

CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
        "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384", "DHE-RSA-CHACHA20-POLY1305",
    )
)  # fmt: skip
"""TLS 1.2's suites: Mozilla's intermediate profile, AEAD only (OpenSSL's default adds
ECDHE with AES-CBC). TLS 1.3's suites are all AEAD and set apart by OpenSSL."""


def _read(path: Path, setting: str) -> tuple[bytes | None, Finding | None]:
    try:
        return path.read_bytes(), None
    except OSError as exc:
        return None, ("fail", setting, f"{path}: {exc.strerror or exc}")


def check_tls_files(tls, root_path: Callable[[str], Path], now: dt.datetime | None = None) -> list[Finding]:
    """Findings about server.tls's files (none when TLS is off)."""
    if not tls.cert_file:
        return []
    try:
        from cryptography import x509  # noqa: F401 (is [auth] installed? the checks below import what they use)
        from cryptography.hazmat.primitives import serialization  # noqa: F401
    except ModuleNotFoundError:  # [server] without [auth]: what the ssl module can check
        return _check_with_ssl(tls, root_path)

    now = now or dt.datetime.now(dt.UTC)
    findings: list[Finding] = []
    cert_path, key_path = root_path(tls.cert_file), root_path(tls.key_file)
    certs = _load_certificates(cert_path, findings)
    key = _load_key(key_path, findings)
    if certs:
        _check_leaf(certs[0], key, cert_path, key_path, tls, now, findings)
    if tls.client_ca_file:
        _check_client_ca(root_path(tls.client_ca_file), tls, findings)
    return findings


def _load_certificates(cert_path: Path, findings: list[Finding]) -> list:
    """The certificates of server.tls.cert_file (none when it cannot be read or parsed: said in ``findings``)."""
    from cryptography import x509

    cert_data, problem = _read(cert_path, "server.tls.cert_file")
    if problem:
        findings.append(problem)
        return []
    try:
        return x509.load_pem_x509_certificates(cert_data)
    except ValueError:
        findings.append(("fail", "server.tls.cert_file", f"{cert_path}: not a PEM certificate"))
        return []


def _load_key(key_path: Path, findings: list[Finding]):
    """The private key of server.tls.key_file (None when it cannot be read or used: said in ``findings``)."""
    from cryptography.hazmat.primitives import serialization

    key_data, problem = _read(key_path, "server.tls.key_file")
    if problem:
        findings.append(problem)
        return None
    try:
        return serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        findings.append(("fail", "server.tls.key_file", f"{key_path}: the key is encrypted; give the server an unencrypted key file"))
    except ValueError:
        findings.append(("fail", "server.tls.key_file", f"{key_path}: not a PEM private key"))
    return None


def _check_leaf(leaf, key, cert_path: Path, key_path: Path, tls, now: dt.datetime, findings: list[Finding]) -> None:
    """The server's certificate: its key is ``key`` (when that loaded), valid now and for
    more than ``tls.expiry_warn_days``; an ok finding when nothing failed."""
    until = leaf.not_valid_after_utc
    if key is not None and key.public_key().public_bytes(*_spki()) != leaf.public_key().public_bytes(*_spki()):
        findings.append(("fail", "server.tls.key_file", f"{key_path} is not the key of the certificate in {cert_path}"))
    if leaf.not_valid_before_utc > now:
        findings.append(("fail", "server.tls.cert_file", f"{cert_path}: not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"))
    elif until <= now:
        findings.append(("fail", "server.tls.cert_file", f"{cert_path}: expired {until:%Y-%m-%d %H:%M} UTC"))
    elif until - now < dt.timedelta(days=tls.expiry_warn_days):
        days = (until - now).total_seconds() / 86400
        findings.append(("warn", "server.tls.cert_file", f"{cert_path}: expires in {days:.1f} days ({until:%Y-%m-%d %H:%M} UTC)"))
    elif not [f for f in findings if f[0] == "fail"]:
        names = _names(leaf)
        findings.append(("ok", "server.tls", f"{cert_path}: {', '.join(names) or 'no names'}, valid until {until:%Y-%m-%d}; key matches"))


def _check_client_ca(ca_path: Path, tls, findings: list[Finding]) -> None:
    """server.tls.client_ca_file: readable, PEM certificates."""
    from cryptography import x509

    data, problem = _read(ca_path, "server.tls.client_ca_file")
    if problem:
        findings.append(problem)
        return
    try:
        cas = x509.load_pem_x509_certificates(data)
        findings.append(
            ("ok", "server.tls.client_ca_file", f"{ca_path}: {len(cas)} CA certificate(s); client certificates {tls.client_cert}")
        )
    except ValueError:
        findings.append(("fail", "server.tls.client_ca_file", f"{ca_path}: not a PEM certificate"))


def _check_with_ssl(tls, root_path: Callable[[str], Path]) -> list[Finding]:
    """Files, PEM and the key's match, as Python's ssl loads them; expiry unchecked (needs cryptography)."""
    import ssl

    cert, key = root_path(tls.cert_file), root_path(tls.key_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    findings: list[Finding] = []
    for setting, path in (("server.tls.cert_file", cert), ("server.tls.key_file", key)):
        if (problem := _read(path, setting)[1]) is not None:
            findings.append(problem)
    if not findings:
        try:
            context.load_cert_chain(str(cert), str(key))
            findings.append(("ok", "server.tls", f"{cert}: loads with its key {key}"))
        except ssl.SSLError as exc:
            findings.append(("fail", "server.tls.cert_file", f"{cert} with {key}: {exc.reason or exc}"))
    if tls.client_ca_file:
        ca = root_path(tls.client_ca_file)
        try:
            context.load_verify_locations(str(ca))
        except (OSError, ssl.SSLError) as exc:
            findings.append(("fail", "server.tls.client_ca_file", f"{ca}: {getattr(exc, 'strerror', None) or exc}"))
    findings.append(("warn", "server.tls expiry", "not checked: pip install 'feature-materializer[auth]' (cryptography) to check it"))
    return findings


def _names(cert) -> list[str]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(n.value) for n in san]


def _spki():
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo


def start_error(tls, root_path: Callable[[str], Path]) -> str | None:
    """Why ``serve`` must not start on server.tls (None: it may), each failure naming its
    file and its setting."""
    failed = [f"{detail} ({setting})" for status, setting, detail in check_tls_files(tls, root_path) if status == "fail"]
    return "server.tls: " + "; ".join(failed) if failed else None


def uvicorn_options(tls, root_path: Callable[[str], Path]) -> dict:
    """uvicorn's ssl_* options for server.tls (empty: plain HTTP)."""
    import ssl

    if not tls.cert_file:
        return {}
    options = {"ssl_certfile": str(root_path(tls.cert_file)), "ssl_keyfile": str(root_path(tls.key_file)), "ssl_ciphers": CIPHERS}
    if tls.client_ca_file:
        options["ssl_ca_certs"] = str(root_path(tls.client_ca_file))
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED if tls.client_cert == "required" else ssl.CERT_OPTIONAL
    return options

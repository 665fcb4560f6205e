"""Throwaway TLS for tests: a CA, server certificates, and a redis-server that speaks only TLS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from throwaway.servers import again_if_port_taken, free_port, wait_for_redis

# --- certificates ---------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def builder(subject: str, issuer: x509.Name, key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def make_ca(common_name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
    )  # fmt: skip
    cert = (
        builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_server_cert(ca_key, ca_cert, names: list[x509.GeneralName]):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        builder("tls-test-server", ca_cert.subject, key)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@dataclass
class Certs:
    ca: Path
    """The CA that signed the servers' certificates."""
    other_ca: Path
    """An unrelated CA: verifying with it must fail."""
    server_cert: Path
    server_key: Path
    """For 127.0.0.1 (IP SAN) and localhost."""
    elsewhere_cert: Path
    elsewhere_key: Path
    """Signed by the right CA, for another name only."""


def make_certs(folder: Path) -> Certs:
    """A throwaway CA, an unrelated one, and server certificates in ``folder``."""
    ca_key, ca_cert = make_ca("fm test CA")
    _, other_cert = make_ca("fm unrelated CA")
    ours = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server_key, server_cert = make_server_cert(ca_key, ca_cert, ours)
    elsewhere_key, elsewhere_cert = make_server_cert(ca_key, ca_cert, [x509.DNSName("elsewhere.invalid")])
    files = {
        "ca.pem": pem(ca_cert), "other_ca.pem": pem(other_cert),
        "server.pem": pem(server_cert), "server.key": pem_key(server_key),
        "elsewhere.pem": pem(elsewhere_cert), "elsewhere.key": pem_key(elsewhere_key),
    }  # fmt: skip
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "server.key").chmod(0o600)
    (folder / "elsewhere.key").chmod(0o600)
    return Certs(*(folder / n for n in ("ca.pem", "other_ca.pem", "server.pem", "server.key", "elsewhere.pem", "elsewhere.key")))


# --- servers ----------------------------------------------------------------------------


@dataclass
class TlsRedis:
    port: int
    process: subprocess.Popen
    ca: Path
    check_hostname: bool = True
    """False for a server whose certificate names another host on purpose."""

    def url(self, host: str = "127.0.0.1") -> str:
        return f"rediss://{host}:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain redis-py client over verified TLS, independent of the code under test."""
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(self.ca), ssl_cert_reqs="required",
                           ssl_check_hostname=self.check_hostname, socket_timeout=5)  # fmt: skip


def start_tls_redis(folder: Path, cert: Path, key: Path, ca: Path, *extra: str, check_hostname: bool = True) -> TlsRedis:
    """A redis-server with no plain port (--port 0): every client that gets an answer spoke TLS."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "redis.out"

    def start(port: int) -> TlsRedis:
        args = ["--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder),
                "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                "--tls-auth-clients", "no", *extra]  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen([shutil.which("redis-server"), *args], stdout=out, stderr=subprocess.STDOUT)
        server = TlsRedis(port, process, ca, check_hostname)
        wait_for_redis(process, server.client, f"TLS redis-server on port {port}", log)
        return server

    return again_if_port_taken(lambda: start(free_port()))


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(timeout=10)

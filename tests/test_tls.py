"""TLS with certificate verification, against a real redis-server and a real PostgreSQL
that take TLS only, with a throwaway CA made here (and a second, unrelated CA)."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pytest
import redis

from feature_defs import DEFAULT_DIR, load_definitions
from fm_config import PROJECT_ROOT, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings, RedisTls, tls_files
from fm_config.sql import SqlSettings
from jobs.operations.cleanup.redis import CleanupWriter, cleanup_partition
from jobs.pipeline.verify import verify_redis, verify_sql
from jobs.transforms import feature_specs
from serializers.batch import FeatureSpec, encode_batch
from serializers.scalar import encode, field_id
from sinks.errors import SinkError
from sinks.partition import write_partition
from sinks.redis.capacity import read_memory_info
from sinks.redis.config import RedisSinkConfig, redis_sink_config
from sinks.redis.node import RedisSink
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import SqlSinkConfig, sql_sink_config
from sinks.sql.preflight import ensure_schema
from sinks.sql.upserts import SqlSink
from sinks.sql.writer import SqlWritePlan
from stores.errors import TerminalError
from stores.redis import TlsVerificationError
from stores.redis import connect_url as redis_connect
from stores.sql import connect
from throwaway.servers import free_port, start_postgres

from .expected import expected_hash, row_of
from .support import tls as tls_support
from .support.confs import env_conf
from .support.consumer_job import AS_OF_DAY2, DAY2, table_rows
from .support.ports import first_then_real
from .support.samples import TINY_SOURCE
from .support.serving import MATERIALIZE, start_serving
from .support.tls import TlsRedis, start_tls_redis, stop

SECRET = "never-in-a-message-7f3a"
SPECS = [FeatureSpec("score", "float"), FeatureSpec("history", "int_list")]
FRESH = field_id("_ts:tls")


@pytest.fixture(scope="module")
def tls_redis(certs, tmp_path_factory) -> Iterator[TlsRedis]:
    server = start_tls_redis(tmp_path_factory.mktemp("tls-redis"), certs.server_cert, certs.server_key, certs.ca, "--maxmemory", "64mb")
    yield server
    stop(server.process)


@pytest.fixture
def tls_redis_db(tls_redis) -> redis.Redis:
    client = tls_redis.client()
    client.flushall()
    return client


@dataclass
class TlsPostgres:
    port: int
    root: Path
    bin_dir: Path
    ca: Path

    def dsn(self, ca: Path | None = None, database: str = "features", sslmode: str = "verify-full") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}?sslmode={sslmode}&sslrootcert={ca or self.ca}"

    def connect(self) -> psycopg.Connection:
        """A plain psycopg session over verified TLS, independent of the code under test."""
        return psycopg.connect(self.dsn(), autocommit=True)


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


@pytest.fixture(scope="module")
def tls_pg(certs) -> Iterator[TlsPostgres]:
    """A PostgreSQL cluster of its own whose pg_hba.conf takes TLS connections only."""

    def with_tls(root: Path) -> str:
        for name, source in (("server.pem", certs.server_cert), ("server.key", certs.server_key)):
            shutil.copyfile(source, root / name)
            _give_to_postgres(root / name)
        (root / "server.key").chmod(0o600)  # the server refuses a key others can read
        (root / "data" / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 reject\n"
        )
        return f"-c ssl=on -c ssl_cert_file={root / 'server.pem'} -c ssl_key_file={root / 'server.key'}"

    server = start_postgres(with_tls)
    yield TlsPostgres(server.port, server.data_dir.parent, server.bin_dir, certs.ca)
    server.stop()


@pytest.fixture
def tls_pg_db(tls_pg) -> Iterator[psycopg.Connection]:
    with tls_pg.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        yield conn


# --- Redis ------------------------------------------------------------------------------


def history_batch(n: int) -> pa.RecordBatch:
    """Long random int lists: a chunk's RESP spans many TLS records, and several recv() calls."""
    rng = np.random.default_rng(5)
    lists = [rng.integers(-(2**40), 2**40, 400).tolist() for _ in range(n)]
    scores = [None if i % 7 == 3 else i / 3 for i in range(n)]
    return pa.RecordBatch.from_pydict(
        {"_id": [f"e{i}" for i in range(n)], "score": pa.array(scores, pa.float64()), "history": pa.array(lists, pa.list_(pa.int64()))}
    )


def write_one_batch(sink: RedisSink) -> None:
    """Open the sink and write a batch: its first command is what connects."""
    with sink:
        sink.write_batch(encode_batch(history_batch(5), SPECS))


def redis_config(url: str, tls: RedisTls | None, **overrides) -> RedisSinkConfig:
    base = dict(url=url, key_prefix="tls:", fields=tuple(s.field for s in SPECS), freshness_field=FRESH, as_of=1700000000,
                chunk_entities=40, retries=0, socket_timeout=5, password=None, tls=tls)  # fmt: skip
    return RedisSinkConfig(**{**base, **overrides})


def test_tls_redis_starts_on_another_port_when_its_port_was_taken(certs, tmp_path, monkeypatch, taken_port):
    pick, calls = first_then_real(taken_port, free_port)
    monkeypatch.setattr(tls_support, "free_port", pick)
    server = start_tls_redis(tmp_path / "t", certs.server_cert, certs.server_key, certs.ca)
    try:
        assert len(calls) == 2 and server.port != taken_port
        assert server.client().ping() is True
    finally:
        stop(server.process)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # the certificate's IP and DNS names
def test_redis_sink_writes_over_verified_tls(tls_redis, tls_redis_db, certs, host):
    batch = history_batch(150)
    with RedisSink(redis_config(tls_redis.url(host), RedisTls(ca_file=str(certs.ca)))) as sink:
        sink.write_batch(encode_batch(batch, SPECS))
    assert tls_redis_db.dbsize() == 150
    for i in range(150):
        assert tls_redis_db.hgetall(f"tls:e{i}") == expected_hash(SPECS, row_of(batch, i), FRESH, 1700000000)


@pytest.mark.parametrize("ca", ["other", "none"], ids=["unrelated CA", "system trust store"])
def test_redis_server_signed_by_another_ca_is_refused(tls_redis, tls_redis_db, certs, ca):
    tls = RedisTls(ca_file=str(certs.other_ca)) if ca == "other" else None
    sink = RedisSink(redis_config(tls_redis.url(), tls, password=SECRET, retries=3))
    with pytest.raises(TlsVerificationError, match=rf"Redis at 127\.0\.0\.1:{tls_redis.port}: TLS certificate verification failed") as info:
        write_one_batch(sink)
    assert sink.stats.retries == 0  # terminal: retrying cannot help
    assert SECRET not in str(info.value)
    assert tls_redis_db.dbsize() == 0


def test_redis_certificate_for_another_name_is_refused(certs, tmp_path):
    # right CA, wrong name: only the hostname check can refuse it
    server = start_tls_redis(tmp_path / "elsewhere", certs.elsewhere_cert, certs.elsewhere_key, certs.ca, check_hostname=False)
    try:
        with pytest.raises(TlsVerificationError, match=r"verification failed \(IP address mismatch"):
            write_one_batch(RedisSink(redis_config(server.url(), RedisTls(ca_file=str(certs.ca)))))
    finally:
        stop(server.process)


def test_plain_redis_url_to_the_tls_port_is_refused(tls_redis, tls_redis_db):
    with pytest.raises((SinkError, redis.ConnectionError), match=r"if the server takes TLS only, use a rediss:// URL") as info:
        write_one_batch(RedisSink(redis_config(f"redis://127.0.0.1:{tls_redis.port}/0", None, password=SECRET)))
    assert SECRET not in str(info.value)
    assert tls_redis_db.dbsize() == 0


@pytest.mark.parametrize(
    "url, tls, wording",
    [
        ("rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none", "other", "the Redis URL sets ssl_cert_reqs"),
        ("rediss://127.0.0.1:{port}/0?ssl_check_hostname=false", "other", "the Redis URL sets ssl_check_hostname"),
        ("redis://127.0.0.1:{port}/0", "ours", r"tls_ca_file set, but the Redis URL redis://127\.0\.0\.1:\d+/0 is not rediss://"),
        ("rediss://127.0.0.1:{port}/0", "missing", "Redis TLS file.s. not found on this host: tls_ca_file"),
    ],
)
def test_redis_tls_cannot_be_weakened_or_misconfigured(tls_redis, tls_redis_db, certs, url, tls, wording):
    ca = {"other": certs.other_ca, "ours": certs.ca, "missing": certs.ca.with_name("absent.pem")}[tls]
    with pytest.raises(TerminalError, match=wording):
        write_one_batch(RedisSink(redis_config(url.format(port=tls_redis.port), RedisTls(ca_file=str(ca)))))
    assert tls_redis_db.dbsize() == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # the server runs on uvloop, whose TLS transport is its own
def test_async_reader_reads_over_verified_tls(tls_redis, tls_redis_db, certs, loop):
    """The asyncio reader's shared connection: redis-py opens it (TLS verified), then the
    reads go over it; long replies span several TLS records."""
    import asyncio

    import uvloop

    from feature_reader import AsyncFeatureReader
    from serializers import freshness_field

    history = [list(range(i, i + 300)) for i in range(40)]
    for i, values in enumerate(history):
        tls_redis_db.hset(
            f"c:{i}", mapping={freshness_field("consumer_daily"): b"1700000000", field_id("recent_store_ids"): encode("int_list", values)}
        )
    settings = RedisSettings(url=tls_redis.url(), password_env=None, mode="standalone", tls_ca_file=str(certs.ca))
    # TLS is the subject, not speed: a deadline a busy machine keeps (the connect has its own: test_store_outages.py)
    conf = RunConf(env="test", sinks=["redis"], redis=settings, reader=ReaderSettings(timeout_ms=5000))

    async def read():
        async with AsyncFeatureReader(conf, load_definitions(DEFAULT_DIR), cache=False) as reader:
            ask = lambda ids: reader.get_online_features(["consumer_daily:recent_store_ids"], {"consumer_id": ids})  # noqa: E731
            results = await asyncio.gather(ask(list(range(40))), *[ask([i]) for i in range(40)])
            return [r.column("recent_store_ids").values for r in results]

    got = asyncio.run(read()) if loop == "asyncio" else uvloop.run(read())
    assert got == [history] + [[h] for h in history]


def test_cleanup_writer_deletes_over_verified_tls(tls_redis, tls_redis_db, certs):
    for i in range(30):
        tls_redis_db.hset(f"tls:e{i}", mapping={b"gone": b"1", b"kept": b"2"})
    redis = RedisSinkConfig(
        url=tls_redis.url(),
        key_prefix="tls:",
        fields=(),
        freshness_field=b"",
        as_of=0,
        chunk_entities=7,
        tls=RedisTls(ca_file=str(certs.ca)),
    )
    writer = CleanupWriter(redis, fields=(b"gone",), keys_per_second=None)
    batch = pa.RecordBatch.from_pydict({"_id": [f"e{i}" for i in range(30)]})
    list(cleanup_partition(writer, iter([batch])))
    assert {tls_redis_db.hgetall(f"tls:e{i}") == {b"kept": b"2"} for i in range(30)} == {True}


def test_relative_tls_files_are_under_the_project_root():
    conf = RunConf(redis=RedisSettings(url="rediss://cache:6380/0", tls_ca_file="conf/prod/ca.pem", tls_cert_file="/etc/fm/client.pem"))
    assert tls_files(conf.redis, conf.path) == RedisTls(
        ca_file=str(PROJECT_ROOT / "conf/prod/ca.pem"), cert_file="/etc/fm/client.pem", key_file=None
    )


# --- SQL --------------------------------------------------------------------------------


def sql_config(dsn: str, **overrides) -> SqlSinkConfig:
    base = dict(dsn=dsn, table="consumer_features", source="tls", as_of=1700000000, dialect="postgres", batch_rows=2, password=SECRET,
                retries=3, retry_base_delay=0.5, connect_timeout=5)  # fmt: skip
    return SqlSinkConfig(**{**base, **overrides})


def test_sql_sink_writes_over_verify_full(tls_pg, tls_pg_db):
    conf = sql_config(tls_pg.dsn())
    with connect(conf) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
        ensure_schema(conn, conf)
    rows = {"a": {"n": 1}, "b": {"s": "x"}, "c": {}, "d": {"l": [1, 2]}, "e": {"f": 0.5}}
    with SqlSink(conf) as sink:
        for key, doc in rows.items():
            sink.add(key, json.dumps(doc))
        sink.flush()
        # the server's own view of the sink's session
        ssl_row = tls_pg_db.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = %s", (sink._conn.info.backend_pid,)).fetchone()
    assert ssl_row[0] is True and ssl_row[1].startswith("TLS")
    as_of = dt.datetime.fromtimestamp(1700000000, dt.UTC)
    assert table_rows(tls_pg_db, "consumer_features") == {k: ("tls", v, as_of) for k, v in rows.items()}


def test_sql_server_refuses_plain_connections(tls_pg):
    # what makes the test above meaningful: without TLS this server takes nobody
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection .* no encryption"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{tls_pg.port}/features?sslmode=disable")


def test_sql_wrong_ca_is_a_clear_terminal_error(tls_pg, tls_pg_db, certs):
    sink = SqlSink(sql_config(tls_pg.dsn(ca=certs.other_ca)))
    with pytest.raises(TerminalError, match=rf"SQL store at 127\.0\.0\.1:{tls_pg.port}: TLS certificate verification failed") as info:
        sink.open()
    assert sink.stats.retries == 0  # terminal: retrying cannot help
    assert SECRET not in str(info.value)


# --- the job's pieces (without Spark: a Spark run would take most of this file's time) ---


@pytest.fixture
def tiny(tmp_path):
    """A source of two features (a float, a long int list), definitions only."""
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny.yaml").write_text(TINY_SOURCE + "    - {name: score, type: float}\n    - {name: history, type: int_list}\n")
    defs = load_definitions(folder)
    return defs.sources["tiny"], defs.entity_of(defs.sources["tiny"])


def test_job_writers_and_verification_use_the_configured_tls(tls_redis, tls_redis_db, tls_pg, tls_pg_db, certs, tiny):
    """From RunConf (redis.tls_ca_file, sql.dsn verify-full) to the partition writers and the read-back."""
    source, entity = tiny
    conf = RunConf(redis=RedisSettings(url=tls_redis.url(), tls_ca_file=str(certs.ca)), sql=SqlSettings(dsn=tls_pg.dsn()))
    batch = history_batch(40)
    rows = batch.to_pylist()
    stamp = int(AS_OF_DAY2.timestamp())
    redis_conf = redis_sink_config(conf, source, entity, DAY2)
    # the driver's capacity check reads the server's limits over the same verified connection
    with redis_connect(redis_conf.url, password=redis_conf.auth_password(), tls=redis_conf.tls) as client:
        assert read_memory_info(client).capacity(None) == 64 << 20  # the server's --maxmemory
    list(write_partition(RedisWritePlan(sink=redis_conf, features=feature_specs(source)), iter([batch])))
    for row in rows:
        assert tls_redis_db.hgetall(f"c:{row['_id']}") == expected_hash(SPECS, row, field_id("_ts:tiny"), stamp)

    sql_conf = sql_sink_config(conf, source, entity, DAY2)
    with connect(sql_conf) as conn:
        ensure_schema(conn, sql_conf)
    docs = [json.dumps({k: v for k, v in r.items() if k != "_id" and v is not None}) for r in rows]
    sql_batch = pa.RecordBatch.from_pydict({"_id": [r["_id"] for r in rows], "_features_json": docs, "_non_finite": [0] * len(rows)})
    list(write_partition(SqlWritePlan(sink=sql_conf), iter([sql_batch])))
    assert table_rows(tls_pg_db, "consumer_features") == {r["_id"]: ("tiny", json.loads(d), AS_OF_DAY2) for r, d in zip(rows, docs)}

    # the read-back connects over TLS too, and sees a value changed behind the job's back
    tls_redis_db.hset("c:e4", field_id("score"), encode("float", 99.5))
    tls_pg_db.execute("""UPDATE consumer_features SET features = features || '{"score": 99.5}' WHERE entity_key = 'e4'""")
    assert [m.count for m in (verify_redis(redis_conf, source, rows), verify_sql(sql_conf, source, rows))] == [1, 1]


# --- the feature server's HTTPS (server.tls) -------------------------------------------------


class _Https:
    """A `materialize serve` process on HTTPS (start_serving asks it /health)."""

    def __init__(self, port: int, process: subprocess.Popen, log: Path, ca: Path):
        self.port, self.process, self.log, self.ca = port, process, log, ca

    def handshake(self, ciphers: str | None = None) -> tuple[str, str]:
        """(TLS version, suite) agreed with a client offering only ``ciphers`` over TLS 1.2
        (None: a default TLS client); ssl.SSLError when the server takes none of them."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if ciphers is not None:
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            context.set_ciphers(ciphers)
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                return tls.version(), tls.cipher()[0]

    def request(self, method: str, path: str, timeout: float = 30) -> tuple[int, bytes]:
        context = ssl.create_default_context(cafile=str(self.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=context)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def _serve_https(tmp_path: Path, redis_url: str, tls: dict, ca: Path) -> _Https:
    settings = {"sinks": ["redis"], "redis": {"url": redis_url, "password_env": None, "mode": "standalone"}, "server": {"tls": tls}}
    folder = env_conf(tmp_path / "conf", "t", json.dumps(settings))
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    command = [MATERIALIZE, "serve", "--env", "t"]
    return start_serving(command, environ, tmp_path / "serve.log", served_as=lambda port, process, log: _Https(port, process, log, ca))


# Mozilla's intermediate profile names these TLS 1.2 suites for an ECDSA certificate (ours)
INTERMEDIATE_ECDSA = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305"}


def test_the_servers_tls_1_2_takes_aead_suites_only(certs, redis_server, tmp_path):
    served = _serve_https(tmp_path, redis_server.url, {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}, certs.ca)
    try:
        with pytest.raises(ssl.SSLError):  # a TLS 1.2 client offering only CBC suites gets no handshake
            served.handshake("ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA")
        assert served.handshake("ECDHE-ECDSA-AES128-GCM-SHA256") == ("TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256")
        assert served.handshake()[0] == "TLSv1.3"
        # every TLS 1.2 suite this client's OpenSSL knows, offered one at a time
        offered = {c["name"] for c in ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).get_ciphers() if c["protocol"] == "TLSv1.2"}
        taken = set()
        for name in sorted(offered):
            try:
                taken.add(served.handshake(name)[1])
            except ssl.SSLError:
                pass
        assert taken == INTERMEDIATE_ECDSA & offered and taken
    finally:
        assert served.stop() == -signal.SIGTERM


def test_a_bad_tls_file_stops_the_server_naming_the_file_and_its_setting(certs, redis_server, tmp_path):
    missing, not_pem = tmp_path / "missing.pem", tmp_path / "ca.txt"
    not_pem.write_text("not a certificate\n")
    tls = {"cert_file": str(missing), "key_file": str(certs.server_key), "client_ca_file": str(not_pem)}
    settings = {"sinks": ["redis"], "redis": {"url": redis_server.url, "password_env": None, "mode": "standalone"}, "server": {"tls": tls}}
    folder = env_conf(tmp_path / "conf", "t", json.dumps(settings))
    done = subprocess.run([MATERIALIZE, "serve", "--env", "t", "--port", str(free_port())], env={**os.environ, "FM_CONF_DIR": str(folder)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{missing}: No such file or directory (server.tls.cert_file)" in done.stderr
    assert f"{not_pem}: not a PEM certificate (server.tls.client_ca_file)" in done.stderr

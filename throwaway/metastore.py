"""A throwaway Hive metastore service on a free loopback port, for the tests: Spark's catalog
shared by the suite's session and the CLI processes it starts, as a deployment's metastore
is shared by its jobs. Development tooling: the product never imports it.

Built from the jars pyspark ships (Hive 2.3's metastore, Derby, Thrift): no download. Its
own ``main`` would listen on every interface, so the service is put together here through
py4j instead, on a socket bound to 127.0.0.1: the metastore's handler over an embedded Derby
database in a folder, served by Thrift's thread-pool server.
"""

from __future__ import annotations

import glob
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from throwaway.servers import PortTaken, again_if_port_taken, free_port

JVM_OPTIONS = ["-Xmx384m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Dhive.async.log.enabled=false"]
"""A small JVM that starts fast (quick JIT, serial collector); Hive's asynchronous logging
needs a jar pyspark does not ship."""


@dataclass
class HiveMetastore:
    port: int
    folder: Path
    gateway: object
    process: object
    _started: threading.Event
    _failed: list
    server: object = None
    log: object = None
    _serving: threading.Thread | None = None

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    def wait(self, timeout: float = 120) -> HiveMetastore:
        """Return once the service answers (a client that connects before only waits longer)."""
        if not self._started.wait(timeout):
            raise RuntimeError(
                f"the Hive metastore did not start serving on port {self.port} in {timeout:.0f} s: see {self.folder / 'metastore.log'}"
            )
        if self._failed:
            raise RuntimeError(f"the Hive metastore did not start: {self._failed[0]}; see {self.folder / 'metastore.log'}")
        return self

    def stop(self) -> None:
        """Stop serving (connected clients are not waited for past a second: a Spark session
        keeps its connection to the end), then end the JVM."""
        try:
            if self.server is not None:
                self.server.stop()
                self._serving.join(timeout=10)  # serve() has returned: no py4j call is left open
            self.gateway.shutdown()
        except Exception:  # noqa: BLE001 (the JVM is going anyway)
            pass
        self.process.kill()
        self.process.wait(timeout=30)
        if self.log is not None:
            self.log.close()


def _jars() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "jars")


def start_metastore(folder: Path) -> HiveMetastore:
    """A metastore service whose Derby database and warehouse are in ``folder``. Returns once
    its port is bound (under a second); the service itself comes up in the background (about
    4 s, most of it creating the metastore's schema): ``wait()`` for it, or let the first
    client's call wait in the socket's backlog."""
    gateway, process, log = _launch_jvm(folder)
    jvm = gateway.jvm
    try:
        port, socket = again_if_port_taken(lambda: _bind_loopback(jvm, free_port()))
    except Exception:
        gateway.shutdown()
        process.terminate()
        log.close()
        raise
    metastore = HiveMetastore(port, folder, gateway, process, threading.Event(), [], log=log)
    # serve() holds its py4j call (and connection) for the service's life: a daemon thread of its own
    metastore._serving = threading.Thread(target=_serve, args=(metastore, jvm, socket), name="hive-metastore", daemon=True)
    metastore._serving.start()
    return metastore


def _launch_jvm(folder: Path):
    """(py4j gateway, JVM process, its log file) of a JVM with pyspark's jars, its output and
    Derby's in ``folder`` (made if need be)."""
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

    folder.mkdir(parents=True, exist_ok=True)
    jars = _jars()
    log = open(folder / "metastore.log", "a")  # noqa: SIM115 (py4j's threads write the JVM's output to it until stop())
    gateway_port, process = launch_gateway(
        jarpath=glob.glob(os.path.join(jars, "py4j-*.jar"))[0],
        classpath=os.path.join(jars, "*"),
        javaopts=[*JVM_OPTIONS, f"-Dderby.stream.error.file={folder / 'derby.log'}"],
        die_on_exit=True,
        redirect_stdout=log,
        redirect_stderr=log,
        return_proc=True,
    )
    gateway = JavaGateway(gateway_parameters=GatewayParameters(port=gateway_port, auto_convert=True))
    return gateway, process, log


def _bind_loopback(jvm, port: int):
    """(port, Thrift server socket bound to 127.0.0.1:port); PortTaken when another took it."""
    try:
        return port, jvm.org.apache.thrift.transport.TServerSocket(jvm.java.net.InetSocketAddress("127.0.0.1", port))
    except Exception as exc:  # noqa: BLE001 (py4j's error: the port was taken in between)
        raise PortTaken(str(exc).splitlines()[0]) from None


def _thrift_server(jvm, folder: Path, socket):
    """The metastore's handler over an embedded Derby database in ``folder``, served on
    ``socket`` by Thrift's thread-pool server."""
    conf = jvm.org.apache.hadoop.hive.conf.HiveConf()
    for key, value in {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true",
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        "hive.metastore.warehouse.dir": str(folder / "warehouse"),
    }.items():
        conf.set(key, value)
    handler = jvm.org.apache.hadoop.hive.metastore.HiveMetaStore.newRetryingHMSHandler("fm-test-metastore", conf, False)
    processor = jvm.org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore.Processor(handler)
    args = jvm.org.apache.thrift.server.TThreadPoolServer.Args(socket).processor(processor).minWorkerThreads(2).maxWorkerThreads(64)
    args = args.stopTimeoutVal(1)  # stop() waits a second for connected clients, not a minute
    return jvm.org.apache.thrift.server.TThreadPoolServer(args)


def _serve(metastore: HiveMetastore, jvm, socket) -> None:
    """The serving thread: make the server (a failure is told by ``wait()``), then serve until stop()."""
    try:
        metastore.server = _thrift_server(jvm, metastore.folder, socket)
    except Exception as exc:  # noqa: BLE001 (told by wait())
        metastore._failed.append(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        socket.close()  # clients waiting in the backlog are refused, not left hanging
        metastore._started.set()
        return
    metastore._started.set()
    try:
        metastore.server.serve()  # blocks for the service's life
    except Exception:  # noqa: BLE001 (the JVM ended under this call)
        pass

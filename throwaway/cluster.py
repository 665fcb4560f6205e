"""A throwaway Redis Cluster on loopback, for the tests and the sizing benchmark.

``primaries`` redis-servers with ``cluster-enabled yes`` (plus ``replicas`` per primary),
joined as ``redis-cli --cluster create`` would (which refuses fewer than 3 primaries). No persistence: it lives as long as the test.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from throwaway.servers import again_if_port_taken, free_ports, start_failed


@dataclass
class LocalCluster:
    workdir: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """A seed node's URL (any node would do: the client asks it for the topology)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def primaries(self) -> list[int]:
        """Ports of the nodes that own slots now, ordered by their first slot."""
        slots = self._any_client().cluster("slots")
        return [int(entry[2][1]) for entry in sorted(slots, key=lambda e: e[0])]

    def replica_of(self, primary: int) -> int:
        for port in self.ports:
            if port == primary or self.processes[port].poll() is not None:
                continue
            info = self.client(port).info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
                return port
        raise LookupError(f"no replica of 127.0.0.1:{primary}")

    def owner_of(self, key: bytes) -> int:
        """The primary that owns a key's slot, asked of the servers (CLUSTER KEYSLOT + SLOTS)."""
        c = self._any_client()
        slot = c.cluster("keyslot", key)
        for start, end, primary, *_ in c.cluster("slots"):
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(f"slot {slot} is not served")

    def _any_client(self) -> redis.Redis:
        for port in self.ports:
            if self.processes[port].poll() is None:
                return self.client(port)
        raise RuntimeError("no cluster node is running")

    def wait_ok(self, timeout: float = 30.0, without: tuple[int, ...] = ()) -> None:
        """Until every running node reports cluster_state:ok and agrees on the slot owners."""
        deadline = time.monotonic() + timeout
        while True:
            states, owners = set(), set()
            for port in self.ports:
                if port in without or self.processes[port].poll() is not None:
                    continue
                try:
                    c = self.client(port)
                    states.add(c.cluster("info")["cluster_state"])
                    owners.add(tuple(sorted((e[0], int(e[2][1])) for e in c.cluster("slots"))))
                except redis.RedisError:
                    states.add("down")
            if states == {"ok"} and len(owners) == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster in {self.workdir} not ready: states {states}, {len(owners)} different slot maps")
            time.sleep(0.1)

    def kill(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGKILL)
        self.processes[port].wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait(timeout=10)


def start_cluster(workdir: Path, primaries: int = 3, replicas: int = 0, *extra: str, node_timeout_ms: int = 1000) -> LocalCluster:
    """Start and join a cluster; the caller stops it (``LocalCluster.stop``).

    Ports found free can be taken before a node binds them (an outgoing connection's source
    port, a cluster started at the same time): then the whole cluster starts again on others."""
    binary = shutil.which("redis-server")
    if not binary:
        raise RuntimeError("redis-server is not installed: run `make setup` (scripts/setup.sh installs it)")
    return again_if_port_taken(lambda: _start_cluster(binary, workdir, primaries, replicas, extra, node_timeout_ms))


def _start_cluster(binary: str, workdir: Path, primaries: int, replicas: int, extra: tuple[str, ...], node_timeout_ms: int) -> LocalCluster:
    workdir.mkdir(parents=True, exist_ok=True)  # a try's nodes may still be writing in it as they stop
    # No nodes.conf of an earlier cluster: the folder emptied, not removed. Removed, its name was
    # free again, and a second cluster starting at once in another thread (the tests' prefetch)
    # was given the same folder by pytest's mktemp and removed it under the first.
    for child in workdir.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    cluster = LocalCluster(workdir, free_ports(primaries * (1 + replicas)))
    try:
        for port in cluster.ports:
            node_dir = workdir / str(port)
            node_dir.mkdir(exist_ok=True)
            cluster.processes[port] = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(node_dir),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                    "--repl-diskless-sync-delay",
                    "0",
                    "--logfile",
                    "redis.log",
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        for port in cluster.ports:
            _wait_ping(cluster, port)
        _join(cluster, primaries, replicas)
        cluster.wait_ok()
        if replicas:
            _wait_replicas_synced(cluster)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def _join(cluster: LocalCluster, primaries: int, replicas: int) -> None:
    """What `redis-cli --cluster create` does, for any number of primaries (it wants 3 or more):
    meet, split the slots evenly, then attach the replicas."""
    ports = cluster.ports
    first = cluster.client(ports[0])
    for port in ports[1:]:
        first.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
    deadline = time.monotonic() + 30
    while any(len(cluster.client(p).cluster("nodes")) < len(ports) for p in ports):
        if time.monotonic() > deadline:
            raise RuntimeError("cluster nodes did not meet")
        time.sleep(0.05)
    bounds = [round(i * 16384 / primaries) for i in range(primaries + 1)]
    for i in range(primaries):
        cluster.client(ports[i]).execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
    for i in range(primaries):
        primary_id = cluster.client(ports[i]).cluster("myid")
        for k in range(replicas):
            cluster.client(ports[primaries + i * replicas + k]).execute_command("CLUSTER", "REPLICATE", primary_id)


def _wait_ping(cluster: LocalCluster, port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        probe = cluster.client(port)
        probe.set_retry(Retry(NoBackoff(), 0))  # this loop retries; redis-py's backoff would wait seconds on a node that exited
        try:
            probe.ping()
            return
        except redis.ConnectionError:
            if cluster.processes[port].poll() is not None or time.monotonic() > deadline:
                # a port taken: this one, or its cluster bus port (port + 10000)
                raise start_failed(f"redis-server on port {port} did not start", cluster.workdir / str(port) / "redis.log") from None
            time.sleep(0.05)


def _wait_replicas_synced(cluster: LocalCluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        replicas = [cluster.client(p).info("replication") for p in cluster.ports]
        linked = [r for r in replicas if r.get("role") == "slave"]
        if linked and all(r.get("master_link_status") == "up" for r in linked):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("cluster replicas did not finish their first sync")
        time.sleep(0.1)

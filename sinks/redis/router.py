"""Which Redis server holds a key: the cluster's slot map (``CLUSTER SLOTS``), or the one
server of a standalone deployment.

A key's slot is CRC16 of the key (or of its ``{hash tag}``) modulo 16384; the slot map
names the primary that owns it. The cluster writer, verification, cleanup and the reader
route keys through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import redis
from redis.crc import key_slot

from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.redis.config import RedisSinkConfig
from stores.redis import TRANSIENT, connect

SLOTS = 16384


def is_cluster(client: redis.Redis) -> bool:
    """Whether the server runs in cluster mode (INFO cluster)."""
    return bool(int(client.info("cluster").get("cluster_enabled", 0)))


def cluster_mode(config: RedisSinkConfig, cluster: bool | None) -> bool:
    """``cluster`` when known, else whether the configured server says it runs in cluster mode."""
    if cluster is not None:
        return cluster
    client = connect(config)
    try:
        return is_cluster(client)
    finally:
        client.close()


@dataclass
class ClusterTopology:
    """Which primary owns each slot, read with CLUSTER SLOTS from any node that answers."""

    config: RedisSinkConfig
    """The seed node's URL and how to connect to every node."""
    primaries: list[str]
    """"host:port" of the nodes that own slots."""
    owner: np.ndarray
    """Per slot: index into ``primaries`` (-1: not served)."""

    @classmethod
    def discover(cls, config: RedisSinkConfig) -> ClusterTopology:
        topology = cls(config, [], np.full(SLOTS, -1, np.int32))
        topology.refresh()
        return topology

    def refresh(self) -> None:
        """Read the slot map again, from the seed or any node known before (transient error if none answers)."""
        seed = urlsplit(self.config.url)
        # the primaries the driver saw before the write: the seed may be the node that is down
        candidates = [f"{seed.hostname}:{seed.port or 6379}", *self.primaries, *(a for a, _ in self.config.run_ids)]
        errors = []
        for address in dict.fromkeys(candidates):
            client = connect(self.config, address)
            try:
                slots = client.cluster("slots")
            except redis.AuthenticationError as exc:
                raise TerminalSinkError(f"Redis at {address} refused the credentials: {exc}") from exc
            except redis.ResponseError as exc:
                if "cluster support disabled" in str(exc).lower():
                    raise TerminalSinkError(f"Redis at {address} is not a cluster node: set redis.mode to standalone (or auto)") from exc
                raise
            except TRANSIENT as exc:
                errors.append(f"{address}: {exc}")
                continue
            finally:
                client.close()
            self._load(slots, default_host=address.rsplit(":", 1)[0])
            return
        raise TransientSinkError(f"no Redis Cluster node answered CLUSTER SLOTS ({'; '.join(errors)})")

    def _load(self, slots: list, default_host: str) -> None:
        primaries: dict[str, int] = {}
        owner = np.full(SLOTS, -1, np.int32)
        for start, end, primary, *_replicas in slots:
            host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
            if not host or host == "?":  # the node does not know its own address: the one that answered
                host = default_host
            address = f"{host}:{int(primary[1])}"
            owner[int(start) : int(end) + 1] = primaries.setdefault(address, len(primaries))
        self.primaries, self.owner = list(primaries), owner

    def assign(self, slot: int, address: str) -> None:
        """A MOVED reply's news, until the next refresh confirms it."""
        if address not in self.primaries:
            self.primaries.append(address)
        self.owner[slot] = self.primaries.index(address)

    def unserved(self) -> int:
        return int((self.owner < 0).sum())

    def slots_of(self, address: str) -> int:
        if address not in self.primaries:
            return 0
        return int((self.owner == self.primaries.index(address)).sum())

    def group(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Positions of ``slots`` per owning primary."""
        owners = self.owner[slots]
        if (owners < 0).any():
            raise TransientSinkError(
                f"{int((owners < 0).sum())} key(s) fall in slots no primary serves (the cluster is down or resharding)"
            )
        order = np.argsort(owners, kind="stable")
        bounds = np.searchsorted(owners[order], np.arange(len(self.primaries) + 1))
        return {self.primaries[n]: order[bounds[n] : bounds[n + 1]] for n in range(len(self.primaries)) if bounds[n + 1] > bounds[n]}


def key_slots(keys: list[bytes]) -> np.ndarray:
    return np.fromiter((key_slot(k) for k in keys), np.int32, len(keys))


class KeyRouter:
    """Per-key control commands (verify, cleanup) in one pipeline per owning node: the
    cluster's primaries, or the one server. A MOVED reply (resharding meanwhile) fails the
    pipeline: rerun the step."""

    def __init__(self, config: RedisSinkConfig, cluster: bool):
        self.config = config
        self.topology = ClusterTopology.discover(config) if cluster else None
        self.clients: dict[str | None, redis.Redis] = {}

    def client(self, address: str | None) -> redis.Redis:
        """The client of one node (None: the one server), made once."""
        if address not in self.clients:
            self.clients[address] = connect(self.config, address)
        return self.clients[address]

    def run(self, keys: list[bytes], add) -> list:
        """``add(pipeline, key)`` queues a key's command; returns the replies in key order."""
        groups = self.topology.group(key_slots(keys)) if self.topology else {None: np.arange(len(keys))}
        out: list = [None] * len(keys)
        for address, positions in groups.items():
            pipe = self.client(address).pipeline(transaction=False)
            for i in positions:
                add(pipe, keys[i])
            for i, reply in zip(positions, pipe.execute()):
                out[i] = reply
        return out

    def used_memory(self) -> int:
        """used_memory summed over the primaries (or the one server)."""
        addresses = self.topology.primaries if self.topology else [None]
        return sum(int(self.client(a).info("memory")["used_memory"]) for a in addresses)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()

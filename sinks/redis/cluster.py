"""Redis Cluster: the same writes, grouped by slot owner and pipelined per primary.

Each key's slot (CRC16 of the key, or of its ``{hash tag}``) names the primary that owns it
(``CLUSTER SLOTS``). A batch is split by owner and each share is written by a
:class:`~sinks.redis.node.RedisSink` connected to that primary, with its own chunks, retries
and hard ceiling. What a node did not take is sent again after a topology refresh, and only
that: entities answered ``MOVED`` go to the new owner, entities answered ``ASK`` (a slot
being migrated) to the importing node after ``ASKING``, and the unacknowledged chunks of a
primary that stopped answering go to whichever node owns their slots once a replica has
taken over (up to ``failover_timeout``).

Every primary's share of a batch is written at once, one thread per primary, so a pipeline
is in flight to each of them (the sockets wait in parallel, not one primary after another).
A primary that is down when the writer starts, or stops answering, costs only its own slots:
the other shares are written; if no replica takes its slots over within ``failover_timeout``,
the entities of its slots are counted ``unreachable`` and the writer ends with an error
naming it, after writing everything else.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from serializers.batch import EncodedBatch
from serializers.resp import REPLACED_FUTURE, SKIPPED_NEWER, WRITE_SCRIPT
from sinks.base import RedisWriteStats
from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.redis.config import RedisSinkConfig, subsecond_of
from sinks.redis.node import CeilingReached, ChunkFailed, RedisRestarted, RedisSink, entity_commands, entity_ttls
from sinks.redis.router import ClusterTopology, key_slots
from sinks.retry import call_with_retries
from stores.errors import TransientError
from stores.redis import TRANSIENT, connect, node_url, server_address

log = logging.getLogger(__name__)


class FailedOverUnreplicated(RedisRestarted):
    """A primary was replaced mid-write while its writes were not WAITed for: rerun the date."""


_RECHECK_DOWN = 5.0
"""Seconds between looks at a down primary (is it back, or did a replica take over?)."""

_RESEND = (redis.exceptions.MovedError, redis.exceptions.AskError, redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError)


@dataclass
class _Round:
    """What one round of a batch left to do."""

    progress: int = 0
    """Entities written this round."""
    retry: list = field(default_factory=list)
    """Batch positions to send again after a refresh of the slot map."""
    asks: dict = field(default_factory=dict)
    """Importing node -> batch positions answered ASK."""
    moved: dict = field(default_factory=dict)
    """Slot -> the "host:port" a MOVED reply named."""
    lost: dict = field(default_factory=dict)
    """Primaries that stopped answering -> the replicas their writes were WAITed for (None: it wrote nothing)."""
    last_error: str = ""


def _take(batch: EncodedBatch, positions: np.ndarray) -> EncodedBatch:
    index = pa.array(positions, pa.int64())
    subsecond = None if batch.subsecond is None else batch.subsecond.take(index)
    return EncodedBatch(ids=batch.ids.take(index), columns=[c.take(index) for c in batch.columns], non_finite=0, subsecond=subsecond)


class RedisClusterSink:
    """The Redis sink for Redis Cluster: one :class:`RedisSink` per primary, fed by slot."""

    def __init__(self, config: RedisSinkConfig, *, parallel: bool = True):
        self.config = config
        self.parallel = parallel
        """False: the shares one primary after another (bench/cluster_scaling.py's baseline)."""
        self.topology: ClusterTopology | None = None
        self.nodes: dict[str, RedisSink] = {}
        self._closed_stats = RedisWriteStats()
        """What the writers of nodes dropped since (a failed primary) wrote."""
        self._own = RedisWriteStats()
        """Counted here: non-finite values, redirects and the cluster's own retries."""
        self._prefix = config.key_prefix.encode("utf-8")
        self._run_ids: dict[str, str] = dict(config.run_ids)
        """run_id per node (the driver's, before any write), kept across a dropped writer: a
        restart without persistence is caught."""
        self._waited: dict[str, int] = {}
        """Per node that was written to: the replicas its writes were WAITed for."""
        self._down: dict[str, float] = {}
        """Primaries that did not answer and whose slots no replica took over within
        failover_timeout -> when that was found; their entities are counted unreachable
        until the slot map or the node says otherwise."""
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def stats(self) -> RedisWriteStats:
        total = RedisWriteStats().add(self._closed_stats).add(self._own)
        for node in self.nodes.values():
            total.add(node.stats)
        return total

    def open(self) -> None:
        c = self.config
        if urlsplit(c.url).path not in ("", "/", "/0"):
            raise TerminalSinkError(f"Redis Cluster has database 0 only: {server_address(c.url)} names another")
        self.topology = call_with_retries(
            lambda: ClusterTopology.discover(c),
            is_transient=lambda e: isinstance(e, TransientError),
            retries=c.retries,
        )
        for address in self.topology.primaries:  # every primary's ceiling is checked before the first write
            try:
                self._node(address)
            except TransientError as exc:  # down: the others are written, its slots wait for a failover
                log.warning("Redis Cluster primary %s does not answer (%s); the other primaries are written", address, exc)

    def flush(self) -> None:
        """End of the partition: fail, naming them, when entities of a down primary's slots were not written."""
        if self._own.unreachable:
            down = ", ".join(f"{a} ({self.topology.slots_of(a)} slots)" for a in self._down) or "a primary"
            raise TransientSinkError(
                f"Redis Cluster primary {down} did not answer and no replica took its slots over within "
                f"{self.config.failover_timeout:.0f} s (redis.failover_timeout): {self._own.unreachable:,} entities in those slots "
                "were not written, everything else was; rerun the date once every slot is served"
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for address in list(self.nodes):
            self._drop(address)

    def __enter__(self) -> RedisClusterSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ceiling(self, address: str) -> int | None:
        ceilings = dict(self.config.node_ceilings)
        if address in ceilings:
            return ceilings[address]
        # a node the driver did not see (a promoted replica): the strictest known ceiling
        return min(ceilings.values(), default=self.config.ceiling_bytes)

    def _node(self, address: str) -> RedisSink:
        with self._lock:  # the shares' threads may open new primaries at once
            return self._open_node(address)

    def _open_node(self, address: str) -> RedisSink:
        if address not in self.nodes:
            # the baselines known so far, a run_id a writer of this node saw included
            node = replace(
                self.config,
                url=node_url(self.config.url, address),
                ceiling_bytes=self._ceiling(address),
                run_ids=tuple(self._run_ids.items()),
            )
            sink = RedisSink(node)
            try:
                sink.open()
            except CeilingReached as exc:
                sink.close()
                raise CeilingReached(exc.used, exc.ceiling, self.stats, exc.oom, node=address) from exc
            except BaseException:
                sink.close()
                raise
            self.nodes[address] = sink
        return self.nodes[address]

    def _drop(self, address: str) -> None:
        sink = self.nodes.pop(address, None)
        if sink is not None:
            if sink.run_id:
                self._run_ids[address] = sink.run_id
            if sink.stats.entities:  # it wrote: were its writes WAITed for?
                self._waited[address] = sink.replicas_waited
            self._closed_stats.add(sink.stats)
            sink.close()

    def write_batch(self, batch: EncodedBatch, as_of: pa.Array | None = None) -> RedisWriteStats:
        """Write one encoded batch to the slot owners; returns what this batch wrote.

        Rounds: every primary takes its share; what came back (MOVED, ASK, CLUSTERDOWN, a
        primary lost) goes again after the slot map is refreshed. Rounds without progress
        are spaced with backoff and allowed for ``failover_timeout`` seconds."""
        before = self.stats
        self._own.non_finite += batch.non_finite
        keys = pc.binary_join_element_wise(self._prefix, batch.ids.cast(pa.binary()), b"").to_pylist()
        slots = key_slots(keys)
        todo = np.arange(len(keys))
        stalled_since: float | None = None
        delay = 0.05
        while todo.size:
            outcome = _Round()
            todo = self._without_down(slots, todo)
            if not todo.size:
                break
            self._write_round(batch, as_of, slots, todo, outcome)
            self._write_asking(batch, as_of, outcome)
            if not outcome.retry:
                break
            todo = np.unique(np.concatenate(outcome.retry))
            self._own.retries += 1
            if outcome.progress:
                stalled_since, delay = None, 0.05
            else:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > self.config.failover_timeout:
                    hint = (
                        " (cluster-require-full-coverage no lets the other primaries serve while one is down)"
                        if "CLUSTERDOWN" in outcome.last_error
                        else ""
                    )
                    raise TransientSinkError(
                        f"Redis Cluster: {todo.size} entities could not be written for {self.config.failover_timeout:.0f} s "
                        f"(redis.failover_timeout; first key {keys[todo[0]]!r}): {outcome.last_error}{hint}"
                    )
                time.sleep(delay)  # the cluster is electing, or a map is stale: give it time
                delay = min(1.0, delay * 2)
            self._await_topology(outcome.lost)
            for slot, target in outcome.moved.items():  # the node that answered knows best
                self.topology.assign(slot, target)
        return RedisWriteStats(**{k: v - getattr(before, k) for k, v in self.stats.as_dict().items()})

    def _without_down(self, slots: np.ndarray, todo: np.ndarray) -> np.ndarray:
        """``todo`` less the entities whose slots a down primary still owns (counted
        unreachable). A down primary is looked at again every few seconds: a replica that
        took over later, or the node back, ends its time out."""
        if not self._down:
            return todo
        if time.monotonic() - min(self._down.values()) > _RECHECK_DOWN:
            self.topology.refresh()
            for address in list(self._down):
                if not self.topology.slots_of(address) or self._answers(address):
                    del self._down[address]
                else:
                    self._down[address] = time.monotonic()
        down = [self.topology.primaries.index(a) for a in self._down if a in self.topology.primaries]
        lost = np.isin(self.topology.owner[slots[todo]], down)
        self._own.unreachable += int(lost.sum())
        return todo[~lost]

    def _write_round(self, batch, as_of, slots, todo, outcome: _Round) -> None:
        """Each primary's share through its writer, all at once (a thread per primary: each
        socket waits for its server while the others send); what did not land goes to ``outcome``."""
        shares = [(address, todo[positions]) for address, positions in self.topology.group(slots[todo]).items()]

        def write(address: str, share: np.ndarray):
            sink = before = None
            try:
                sink = self._node(address)
                before = sink.stats.entities
                sink.write_batch(_take(batch, share), as_of.take(pa.array(share)) if as_of is not None else None)
                return sink, before, None
            except Exception as exc:  # noqa: BLE001 (sorted out below, in the caller's thread)
                return sink, before, exc

        if len(shares) > 1 and self.parallel:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=min(64, max(len(self.topology.primaries), len(shares))), thread_name_prefix="redis-primary"
                )
            results = list(self._pool.map(lambda item: write(*item), shares))
        else:
            results = [write(*item) for item in shares]
        fatal: BaseException | None = None
        for (address, share), (sink, before, exc) in zip(shares, results):
            if isinstance(exc, ChunkFailed):
                log.warning("Redis Cluster primary %s: %s; its unacknowledged writes go to the slots' owner after a refresh", address, exc)
                outcome.progress += sink.stats.entities - before
                self._collect(sink, share, slots, outcome)  # redirects of the chunks it acknowledged
                outcome.retry.append(share[exc.pending_from :])
                outcome.last_error = str(exc)
                self._drop(address)
                outcome.lost[address] = self._waited.get(address)
            elif isinstance(exc, RedisRestarted):
                fatal = fatal or exc  # what it had acknowledged is gone: no resend brings it back
            elif isinstance(exc, TransientError):  # could not even connect (open) to it
                log.warning("Redis Cluster primary %s: %s", address, exc)
                outcome.retry.append(share)
                outcome.last_error = str(exc)
                self._drop(address)
                outcome.lost[address] = self._waited.get(address)
            elif isinstance(exc, CeilingReached) and fatal is None:
                fatal = CeilingReached(exc.used, exc.ceiling, self.stats, exc.oom, node=address)
                fatal.__cause__ = exc
            elif exc is not None:
                fatal = fatal or exc
            else:
                outcome.progress += sink.stats.entities - before
                self._collect(sink, share, slots, outcome)
        if fatal is not None:
            raise fatal

    def _collect(self, sink: RedisSink, share: np.ndarray, slots: np.ndarray, outcome: _Round) -> None:
        """The entities a node answered MOVED/ASK (or CLUSTERDOWN/TRYAGAIN) for."""
        for position, reply in sink.redirected:
            entity = int(share[position])
            kind, _, rest = reply.partition(" ")
            if kind == "ASK":
                self._own.redirects += 1
                outcome.asks.setdefault(rest.split(" ")[1], []).append(entity)
                continue
            if kind == "MOVED":
                self._own.redirects += 1
                slot, target = rest.split(" ")[:2]
                outcome.moved[int(slot)] = target
            outcome.retry.append(np.array([entity]))
            outcome.last_error = reply

    def _write_asking(self, batch, as_of, outcome: _Round) -> None:
        """Entities of a slot being migrated, to the importing node, each command after ASKING.

        Rare (only while a slot moves), so this goes through redis-py command by command."""
        c = self.config
        for target, positions in outcome.asks.items():
            share = np.array(positions)
            sub = _take(batch, share)
            keys = pc.binary_join_element_wise(self._prefix, sub.ids.cast(pa.binary()), b"")
            freshness = str(c.as_of).encode() if as_of is None else as_of.take(pa.array(share))
            commands = entity_commands(
                keys, sub.columns, c.fields, c.freshness_field, freshness, entity_ttls(c, keys), horizon=c.horizon,
                subsecond=subsecond_of(c, sub),
            )  # fmt: skip
            client = connect(c, target)
            try:
                client.script_load(WRITE_SCRIPT)  # the importing node may never have run it
                pipe = client.pipeline(transaction=False)
                for i in range(len(share)):
                    reader = hiredis.Reader()
                    reader.feed(bytes(commands.wire_bytes(i, i + 1)))
                    while (args := reader.gets()) is not False:
                        pipe.execute_command("ASKING")
                        pipe.execute_command(*args)
                replies = pipe.execute(raise_on_error=False)
            except TRANSIENT as exc:
                outcome.retry.append(share)  # the importing node did not answer: the next round asks the map again
                outcome.last_error = str(exc)
                continue
            finally:
                client.close()
            replies = replies[1::2]  # the commands' own replies (ASKING answers OK)
            for i, reply in enumerate(replies):
                refused = reply if isinstance(reply, Exception) else None
                if refused is None and reply == SKIPPED_NEWER:
                    self._own.skipped_newer += 1
                    outcome.progress += 1
                elif refused is None:
                    values = int(commands.values_set[i])
                    replaced = int(reply == REPLACED_FUTURE)
                    self._own.add(
                        RedisWriteStats(entities=1, values_set=values, values_deleted=len(c.fields) - values, replaced_future=replaced)
                    )
                    outcome.progress += 1
                elif isinstance(refused, _RESEND):  # the migration ended or was rolled back
                    outcome.retry.append(share[i : i + 1])
                    outcome.last_error = str(refused)
                else:
                    raise TerminalSinkError(f"Redis at {target} refused a command for key {keys[i].as_py()!r}: {refused}")
            self._own.round_trips += 1

    def _await_topology(self, lost: dict[str, int | None]) -> None:
        """Refresh the slot map; while a lost primary still owns slots and does not answer,
        wait for a replica to take over (up to failover_timeout). A primary that failed over
        while its writes were not WAITed for may have taken acknowledged writes with it."""
        deadline = time.monotonic() + self.config.failover_timeout
        delay = 0.1
        while True:
            try:
                self.topology.refresh()
                still = [a for a in lost if self.topology.slots_of(a) and not self._answers(a)]
                if not still and not self.topology.unserved():
                    break
            except TransientError as exc:
                still = [str(exc)]
            if time.monotonic() > deadline:
                if any(a not in self.topology.primaries for a in still):  # no node answered at all
                    raise TransientSinkError(
                        f"Redis Cluster: no node answered within {self.config.failover_timeout:.0f} s "
                        f"(redis.failover_timeout): {', '.join(still)}"
                    )
                # its slots alone fail: the next rounds count their entities unreachable
                log.warning(
                    "Redis Cluster primary %s: down, and no replica took over within %.0f s", ", ".join(still), self.config.failover_timeout
                )
                self._down.update(dict.fromkeys(still, time.monotonic()))
                break
            time.sleep(delay)
            delay = min(1.0, delay * 2)
        unguarded = [a for a, waited in lost.items() if waited == 0 and not self.topology.slots_of(a) and a not in self._down]
        if unguarded:
            raise FailedOverUnreplicated(
                f"Redis Cluster primary {', '.join(unguarded)} failed over during the write, and its writes were not "
                "WAITed for (redis.wait_replicas 0, or no replica attached): what it acknowledged last may not have "
                "reached the replica that took over; rerun the date (redis.wait_replicas: 1 avoids this)"
            )

    def _answers(self, address: str) -> bool:
        client = connect(self.config, address, socket_timeout=2.0)
        try:
            return bool(client.ping())
        except TRANSIENT:
            return False
        finally:
            client.close()

"""The Redis sink against a real Redis Cluster (3 primaries + 1 replica each) on loopback:
grouping by slot owner, MOVED after a slot moved, ASK while a slot migrates, a graceful
failover and a killed primary mid-write, and the hard ceiling per primary."""

from __future__ import annotations

import math
import re
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import pytest

from serializers.batch import encode_batch
from sinks.errors import TransientSinkError
from sinks.redis.cluster import FailedOverUnreplicated, RedisClusterSink
from sinks.redis.node import CeilingReached, ChunkFailed, RedisSink
from sinks.redis.router import ClusterTopology
from throwaway.cluster import LocalCluster, start_cluster
from throwaway.servers import start_redis

from .expected import entity_count, expected_hash, row_of
from .support.redis_sink import FRESH, SPECS, sink_config, things

STAMP = 1700000000


class _Prefetched:
    """A fresh cluster per test, the next one started while a test runs: a new cluster takes
    about 2 s to start, nearly all of it Redis holding a new primary unwritable (its writable
    delay), which would otherwise be waited out once per test."""

    def __init__(self, folders, *args):
        self.folders, self.args = folders, args
        folders.getbasetemp()  # made here: two threads making it at once could make two
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="next-cluster")
        self.spare: Future | None = None

    def _start(self) -> LocalCluster:
        return start_cluster(self.folders.mktemp("cluster"), *self.args)

    def take(self) -> LocalCluster:
        spare, self.spare = self.spare, self.pool.submit(self._start)
        if spare is None:
            return self._start()
        made = spare.result()
        try:
            made.wait_ok()  # still every node up and one slot map after waiting its turn
        except BaseException:
            made.stop()
            raise
        return made

    def close(self) -> None:
        try:
            if self.spare is not None and self.spare.exception() is None:  # a spare that failed to start is no test's error
                self.spare.result().stop()
        finally:
            self.pool.shutdown()


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    made = _Prefetched(tmp_path_factory, 3, 1)
    yield made
    made.close()


@pytest.fixture
def cluster(clusters):
    c = clusters.take()
    yield c
    c.stop()


def cluster_config(c: LocalCluster, **overrides):
    return sink_config(c.url, cluster=True, **{"chunk_entities": 100, **overrides})


def slots_of(c: LocalCluster, n: int) -> list[int]:
    """The slot of each key t:0..t:n-1, asked of a server (CLUSTER KEYSLOT)."""
    pipe = c.client(c.primaries()[0]).pipeline(transaction=False)
    for i in range(n):
        pipe.cluster("keyslot", f"t:{i}")
    return pipe.execute()


def keys_by_owner(c: LocalCluster, n: int) -> dict[int, list[int]]:
    """Entity numbers per primary port, asked of the servers (CLUSTER KEYSLOT and SLOTS)."""
    ranges = [(start, end, int(primary[1])) for start, end, primary, *_ in c.client(c.primaries()[0]).cluster("slots")]
    out: dict[int, list[int]] = {}
    for i, slot in enumerate(slots_of(c, n)):
        out.setdefault(next(port for start, end, port in ranges if start <= slot <= end), []).append(i)
    return out


def assert_all_exact(c: LocalCluster, batch, n: int) -> None:
    """Every key on the primary that owns it now, holding exactly the scalar encoder's bytes."""
    for port, entities in keys_by_owner(c, n).items():
        node = c.client(port)
        assert node.dbsize() == len(entities), f"primary {port}"
        pipe = node.pipeline(transaction=False)
        for i in entities:
            pipe.hgetall(f"t:{i}")
        for i, stored in zip(entities, pipe.execute()):
            assert stored == expected_hash(SPECS, row_of(batch, i), FRESH, STAMP), f"t:{i} on {port}"


def test_an_older_snapshot_is_left_on_every_primary(cluster):
    n = 600
    batch = things(n)
    with RedisClusterSink(cluster_config(cluster)) as sink:
        sink.write_batch(encode_batch(batch, SPECS))
    with RedisClusterSink(cluster_config(cluster, as_of=STAMP - 86400)) as sink:
        stats = sink.write_batch(encode_batch(things(n, offset=0), SPECS))
    assert (stats.entities, stats.skipped_newer) == (0, n)
    assert_all_exact(cluster, batch, n)  # every key still holds the newer snapshot


def test_writes_go_to_each_slot_owner_pipelined_per_primary(cluster):
    n = 3000
    batch = things(n)
    with RedisClusterSink(cluster_config(cluster)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS))
    owners = keys_by_owner(cluster, n)
    assert sorted(owners) == sorted(cluster.primaries())
    assert_all_exact(cluster, batch, n)
    nulls = sum(batch.column(s.name).null_count for s in SPECS)
    assert (stats.entities, stats.values_set, stats.values_deleted, stats.redirects) == (n, 3 * n - nulls, nulls, 0)
    # one pipeline per primary, in chunks of 100 of that primary's own keys
    assert sink.stats.round_trips == sum(math.ceil(len(e) / 100) for e in owners.values())
    # replicas hold copies of their primary's keys only
    for primary, entities in owners.items():
        replica = cluster.replica_of(primary)
        deadline = time.monotonic() + 10
        while cluster.client(replica).dbsize() != len(entities) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.client(replica).dbsize() == len(entities)


def _move_slots(c: LocalCluster, slots: range, source: int, target: int) -> None:
    """Give empty slots to another primary, as a resharding tool ends a migration."""
    target_id = c.client(target).cluster("myid")
    for port in c.primaries():  # replicas learn it from their primary
        for slot in slots:
            c.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    c.wait_ok()


def test_moved_entities_alone_are_sent_again_to_the_new_owner(cluster):
    n = 2000
    batch = things(n)
    first, second = cluster.primaries()[:2]
    moved = range(0, 800)  # slots of the first primary, given to the second after the writer read the map
    with RedisClusterSink(cluster_config(cluster)) as sink:
        _move_slots(cluster, moved, first, second)
        stats = sink.write_batch(encode_batch(batch, SPECS))
    in_moved = [i for i, slot in enumerate(slots_of(cluster, n)) if slot in moved]
    assert in_moved
    assert stats.redirects == len(in_moved)  # only these were sent again
    assert stats.entities == n  # and counted once
    assert_all_exact(cluster, batch, n)


def test_entities_of_a_migrating_slot_follow_ask_to_the_importing_node(cluster):
    n = 2000
    batch = things(n)
    first, second = cluster.primaries()[:2]
    source, target = cluster.client(first), cluster.client(second)
    migrating = range(100, 400)
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    for slot in migrating:
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    in_migrating = [i for i, slot in enumerate(slots_of(cluster, n)) if slot in migrating]
    with RedisClusterSink(cluster_config(cluster)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS))
    # new keys of a migrating slot are created on the importing node, after ASKING
    assert stats.redirects == len(in_migrating) and stats.entities == n
    assert sum(source.cluster("countkeysinslot", s) for s in migrating) == 0
    assert sum(target.cluster("countkeysinslot", s) for s in migrating) == len(in_migrating)
    for port in cluster.primaries():  # end the migration as redis-cli would
        for slot in migrating:
            cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    cluster.wait_ok()
    assert_all_exact(cluster, batch, n)


@pytest.fixture
def after_chunks(monkeypatch):
    """``after_chunks(port, n, action)``: run ``action`` once, in the writer's own thread,
    right after the primary on ``port`` acknowledged its n-th chunk (no race with the write)."""

    def arm(port: int, n: int, action) -> list:
        done: list = []
        original = RedisSink._acknowledge

        def acknowledge(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if not done and self.config.url.endswith(f":{port}/0"):
                self._acked_here = getattr(self, "_acked_here", 0) + 1
                if self._acked_here == n:
                    done.append(action())

        monkeypatch.setattr(RedisSink, "_acknowledge", acknowledge)
        return done

    return arm


def _promoted(c: LocalCluster, replica: int) -> None:
    deadline = time.monotonic() + 20
    while c.client(replica).info("replication")["role"] != "master":
        assert time.monotonic() < deadline, "the replica was not promoted"
        time.sleep(0.02)


def test_graceful_failover_mid_write_moves_the_rest_to_the_promoted_replica(cluster, after_chunks):
    n = 6000
    batch = things(n)
    primary = cluster.primaries()[0]
    replica = cluster.replica_of(primary)
    # after the primary's 10th chunk its replica takes over (CLUSTER FAILOVER: in sync first)
    done = after_chunks(primary, 10, lambda: (cluster.client(replica).execute_command("CLUSTER", "FAILOVER"), _promoted(cluster, replica)))
    with RedisClusterSink(cluster_config(cluster, chunk_entities=20)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS))
    assert done
    cluster.wait_ok()
    assert primary not in cluster.primaries() and replica in cluster.primaries()
    assert stats.entities == n
    assert stats.redirects > 0  # the old primary answered MOVED once demoted
    assert_all_exact(cluster, batch, n)


def test_killed_primary_fails_over_and_nothing_acknowledged_is_lost(cluster, after_chunks):
    n = 6000
    batch = things(n)
    primary = cluster.primaries()[0]
    replica = cluster.replica_of(primary)
    done = after_chunks(primary, 10, lambda: cluster.kill(primary))
    # WAIT for the replica after each chunk: what the primary acknowledged survives it
    with RedisClusterSink(cluster_config(cluster, chunk_entities=20, wait_replicas=1, retries=1, failover_timeout=30)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS))
    assert done
    cluster.wait_ok(without=(primary,))
    assert replica in cluster.primaries()
    assert stats.entities == n and stats.retries >= 1  # each entity counted once, resent or not
    assert_all_exact(cluster, batch, n)


def test_killed_primary_without_wait_asks_for_a_rerun(cluster, after_chunks):
    primary = cluster.primaries()[1]
    done = after_chunks(primary, 10, lambda: cluster.kill(primary))
    # no WAIT: the replica that takes over may lack the last acknowledged chunks
    with pytest.raises(FailedOverUnreplicated, match=rf"primary 127\.0\.0\.1:{primary} failed over .* rerun the date"):
        with RedisClusterSink(cluster_config(cluster, chunk_entities=20, retries=1, failover_timeout=30)) as sink:
            sink.write_batch(encode_batch(things(6000), SPECS))
    assert done


def test_unconfirmed_replication_is_not_counted_and_is_sent_again(tmp_path):
    primary = start_redis(tmp_path / "p")
    replica = start_redis(tmp_path / "r", "--replicaof", "127.0.0.1", str(primary.port))
    try:
        deadline = time.monotonic() + 10
        while replica.client().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        replica.process.send_signal(signal.SIGSTOP)  # linked, but confirms nothing
        config = sink_config(primary.url, chunk_entities=10, wait_replicas=1, wait_timeout_ms=100, retries=1)
        with pytest.raises(ChunkFailed, match=r"0 of 1 replica\(s\) confirmed a chunk within 100 ms") as info:
            with RedisSink(config) as sink:
                sink.write_batch(encode_batch(things(30), SPECS))
        assert sink.stats.entities == 0 and sink.stats.retries == 1 and info.value.pending_from == 0
        replica.process.send_signal(signal.SIGCONT)
        with RedisSink(config) as sink:
            stats = sink.write_batch(encode_batch(things(30), SPECS))
        assert stats.entities == 30 and replica.client().dbsize() == 30
    finally:
        replica.process.send_signal(signal.SIGCONT)
        replica.stop()
        primary.stop()


def test_the_fullest_primary_stops_the_writer(cluster):
    first = cluster.primaries()[2]  # not the first one opened
    used = int(cluster.client(first).info("memory")["used_memory"])
    # this primary's ceiling is below what it uses already; the others have room
    ceilings = tuple((f"127.0.0.1:{p}", used // 2 if p == first else 10 * used) for p in cluster.primaries())
    with pytest.raises(CeilingReached, match=rf"Redis Cluster primary 127\.0\.0\.1:{first} used_memory .* passed the hard ceiling"):
        with RedisClusterSink(cluster_config(cluster, node_ceilings=ceilings)) as sink:
            sink.write_batch(encode_batch(things(100), SPECS))
    assert all(cluster.client(p).dbsize() == 0 for p in cluster.primaries())  # checked before the first write


def test_every_primary_has_a_pipeline_in_flight_at_once(cluster):
    """A primary that does not answer (stopped) holds up its own share only: the others are
    written meanwhile, which a writer visiting the primaries one after another cannot do."""
    n = 3000
    batch = things(n)
    owners = keys_by_owner(cluster, n)
    config = cluster_config(cluster)
    first = ClusterTopology.discover(config).primaries[0]  # the share a sequential writer would send first
    stopped = int(first.rsplit(":", 1)[1])
    with RedisClusterSink(config) as sink:
        cluster.processes[stopped].send_signal(signal.SIGSTOP)
        try:
            writing = threading.Thread(target=sink.write_batch, args=(encode_batch(batch, SPECS),))
            writing.start()
            others = [p for p in owners if p != stopped]
            deadline = time.monotonic() + 20
            while any(cluster.client(p).dbsize() < len(owners[p]) for p in others):
                assert time.monotonic() < deadline, "the other primaries waited for the stopped one"
                time.sleep(0.05)
        finally:
            cluster.processes[stopped].send_signal(signal.SIGCONT)
        writing.join(timeout=60)
    assert sink.stats.entities == n and sink.stats.unreachable == 0
    assert_all_exact(cluster, batch, n)


@pytest.fixture(scope="module")
def partial_clusters(tmp_path_factory):
    made = _Prefetched(tmp_path_factory, 3, 0, "--cluster-require-full-coverage", "no", "--maxmemory", "64mb")
    yield made
    made.close()


@pytest.fixture
def partial_cluster(partial_clusters):
    """3 primaries, no replicas; the others keep serving while one is down (full coverage off)."""
    c = partial_clusters.take()
    yield c
    c.stop()


def test_a_primary_down_at_start_costs_only_its_own_slots(partial_cluster):
    c = partial_cluster
    n = 3000
    batch = things(n)
    owners = keys_by_owner(c, n)
    config = cluster_config(c, failover_timeout=2, retries=1)
    down = c.primaries()[1]
    # the driver saw every primary before the write (its baselines); then one died
    config = replace(config, run_ids=tuple((f"127.0.0.1:{p}", c.client(p).info("server")["run_id"]) for p in c.primaries()))
    c.kill(down)
    sink = RedisClusterSink(config)
    sink.open()  # starts although a primary does not answer
    try:
        stats = sink.write_batch(encode_batch(batch, SPECS))
        again = sink.write_batch(encode_batch(batch, SPECS))  # the next batch does not wait again
        with pytest.raises(
            TransientSinkError,
            match=rf"primary 127\.0\.0\.1:{down} \(\d+ slots\) did not answer .* "
            rf"{2 * len(owners[down]):,} entities in those slots were not written, everything else was",
        ):
            sink.flush()
    finally:
        sink.close()
    assert stats.unreachable == again.unreachable == len(owners[down])
    assert stats.entities == n - len(owners[down])
    for port, entities in owners.items():
        if port == down:
            continue
        node = c.client(port)
        assert node.dbsize() == len(entities)
        for i in entities[:50]:
            assert node.hgetall(f"t:{i}") == expected_hash(SPECS, row_of(batch, i), FRESH, STAMP)


def test_a_primary_down_at_start_is_written_through_the_replica_that_takes_over(cluster):
    n = 3000
    batch = things(n)
    primary = cluster.primaries()[2]
    replica = cluster.replica_of(primary)
    cluster.kill(primary)
    with RedisClusterSink(cluster_config(cluster, failover_timeout=30, retries=1)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS))
        sink.flush()
    cluster.wait_ok(without=(primary,))
    assert replica in cluster.primaries() and stats.entities == n and stats.unreachable == 0
    assert_all_exact(cluster, batch, n)


# --- the whole job against a cluster ---------------------------------------------------------


def test_capacity_check_refuses_when_the_fullest_primary_would_overflow(spark, run_conf, tmp_path):
    from jobs.pipeline.run import run_source
    from sinks.errors import CapacityError

    from .support.consumer_job import DAY2, DEFS

    cluster = start_cluster(tmp_path / "full", 3, 0, "--maxmemory", "8mb")
    try:
        full = cluster.primaries()[1]
        node = cluster.client(full)
        # fill one primary (keys in its own slots) to just under max_fill: the others stay empty
        limit = int(8 * 2**20 * 0.85)
        tag = next(f"{{f{i}}}" for i in range(10_000) if cluster.owner_of(f"{{f{i}}}".encode()) == full)
        pieces = 0
        while int(node.info("memory")["used_memory"]) < limit - 60_000:  # small pieces: a big argument counts twice
            node.set(f"{tag}filler{pieces}", b"x" * 20_000)
            pieces += 1
        filled = int(node.info("memory")["used_memory"])
        conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": cluster.url, "mode": "cluster"})})
        with pytest.raises(
            CapacityError,
            match=rf"refusing to write consumer entities: Redis Cluster primary 127\.0\.0\.1:{full}, "
            r"which gets ~\d+ of them, uses .*Nothing was written",
        ) as info:
            run_source(spark, conf, DEFS, "consumer_daily", DAY2)
        # it was the write's share that would not fit, on that primary alone: it held the filler
        # (plus the job's connections, some tens of KB each, counted since) and nothing written
        used, growth = (
            int(x.replace(",", ""))
            for x in re.search(r"uses ([\d,]+) B, the write is projected to add ([\d,]+) B", str(info.value)).groups()
        )
        assert filled - 50_000 < used < filled + 300_000 and used + growth > limit
        assert [cluster.client(p).dbsize() for p in cluster.primaries()] == [pieces if p == full else 0 for p in cluster.primaries()]
    finally:
        cluster.stop()


def test_the_job_starts_with_a_primary_down_and_writes_every_other_slot(spark, sample_root, run_conf, partial_cluster):
    from jobs.pipeline.run import run_source

    from .support.consumer_job import DAY2, DEFS, expected_consumers

    c = partial_cluster
    down = c.primaries()[0]
    c.kill(down)
    redis = run_conf.redis.model_copy(
        update={"url": f"redis://127.0.0.1:{c.primaries()[1]}/0", "mode": "cluster", "failover_timeout": 2, "retries": 1}
    )
    expected = expected_consumers(spark, sample_root, DAY2)
    lost = [i for i in expected if c.owner_of(f"c:{i}".encode()) == down]
    assert 0 < len(lost) < len(expected)
    with pytest.raises(TransientSinkError) as info:
        run_source(spark, run_conf.model_copy(update={"redis": redis}), DEFS, "consumer_daily", DAY2)
    written = len(expected) - len(lost)
    assert f"after {written:,} of {len(expected):,} entities were written, {len(lost):,} not (their primary was down)" in str(info.value)
    assert f"primary 127.0.0.1:{down} (5461 slots) did not answer" in str(info.value)
    assert sum(entity_count(c.client(p)) for p in c.primaries() if p != down) == written


def test_doctor_checks_every_primary_and_names_the_one_down(run_conf, partial_cluster):
    from jobs.operations.doctor.run import run_checks

    from .support.consumer_job import DEFS

    c = partial_cluster
    primaries = c.primaries()
    down = min(primaries, key=lambda p: f"127.0.0.1:{p}")  # the first in address order: once a check probed it by mistake
    seed = next(p for p in primaries if p != down)
    c.kill(down)
    conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": f"redis://127.0.0.1:{seed}/0"})})
    checks = {x.name: x for x in run_checks(conf, DEFS, list(DEFS.sources), ["redis"])}
    assert checks["redis"].status == "ok" and checks["redis"].detail.endswith("cluster"), checks["redis"]
    assert checks["redis cluster"].detail == "3 primaries serve every slot"  # still assigned: no failover without replicas
    for port in primaries:
        memory = checks[f"redis memory 127.0.0.1:{port}"]
        assert (memory.status, memory.detail.startswith("does not answer")) == (("fail", True) if port == down else ("ok", False)), memory
    assert checks["redis acl consumer"].status == "ok"

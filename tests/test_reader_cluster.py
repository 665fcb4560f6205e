"""The read side against a real Redis Cluster (3 primaries on loopback): values the real job
wrote read back by FeatureReader and AsyncFeatureReader from every primary, across a slot
migration (ASK while the slot migrates, MOVED once it moved), and the asyncio reader's
read-through to PostgreSQL for the one entity Redis lost."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import redis

from feature_reader import AsyncFeatureReader, FeatureReader
from fm_config import RunConf
from fm_config.redis import RedisSettings
from serializers import field_id
from throwaway.cluster import LocalCluster, start_cluster

from .support.every_type import BIG, CONSUMERS
from .support.reader_sample import assert_expected, write_sample

WRITTEN = (1, 2, 3)  # the consumers of ROWS; 4 (in CONSUMERS) was never written
EVERY_TYPE_FEATURES = ["every_type"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # a maxmemory: the job's capacity check wants one
    c = start_cluster(tmp_path_factory.mktemp("reader-cluster"), 3, 0, "--maxmemory", "64mb")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory, cluster, pg_server):
    """every_type (and pair_daily) written by the real job into the cluster and into
    PostgreSQL (public schema recreated first); the conf reads Redis in cluster mode."""
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    root = tmp_path_factory.mktemp("reader-cluster-data")
    return write_sample(spark, root, RedisSettings(url=cluster.url, password_env=None, mode="cluster"), pg_server.dsn)


def with_mode(conf: RunConf, mode: str, **reader) -> RunConf:
    update = {"redis": conf.redis.model_copy(update={"mode": mode})}
    if reader:
        update["reader"] = conf.reader.model_copy(update=reader)
    return conf.model_copy(update=update)


def slot_owners(c: LocalCluster) -> dict[int, int]:
    """Slot -> port of the primary serving it, from CLUSTER NODES (migration markers ignored)."""
    out: dict[int, int] = {}
    for line in c.client(c.ports[0]).execute_command("CLUSTER", "NODES").decode().splitlines():
        _id, address, flags, *_rest = line.split()
        if "master" not in flags.split(","):
            continue
        port = int(address.split("@")[0].rsplit(":", 1)[1])
        for part in line.split()[8:]:
            if part.startswith("["):
                continue
            start, _, end = part.partition("-")
            for slot in range(int(start), int(end or start) + 1):
                out[slot] = port
    return out


def owners_of(c: LocalCluster, keys) -> dict[bytes, tuple[int, int]]:
    """Key -> (its slot, asked of a server with CLUSTER KEYSLOT; the primary serving that slot)."""
    owners = slot_owners(c)
    node = c.client(c.ports[0])
    return {key: (slot, owners[slot]) for key in keys for slot in [node.cluster("keyslot", key)]}


def errorstat(node: redis.Redis, kind: str) -> int:
    """How many ``kind`` (ASK, MOVED) error replies the server sent since CONFIG RESETSTAT."""
    return int(node.info("errorstats").get(f"errorstat_{kind}", {}).get("count", 0))


@pytest.mark.parametrize("mode", ["cluster", "auto"])
def test_values_written_to_a_cluster_read_back_from_each_primary(cluster, written, mode):
    conf, defs = written
    conf = with_mode(conf, mode)  # auto: the reader asks the server whether it is a cluster
    keys = [b"c:%d" % i for i in (*WRITTEN, 4)]
    owners = owners_of(cluster, keys)
    assert len({owners[k][1] for k in keys[:3]}) >= 2, owners  # the written keys sit on 2+ primaries
    for key in keys[:3]:
        assert cluster.client(owners[key][1]).exists(key) == 1, key  # each on the primary serving its slot
    assert cluster.client(owners[b"c:4"][1]).exists(b"c:4") == 0  # never written

    with FeatureReader(conf, defs, cache=False) as reader:
        assert_expected(reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis"), f"sync {mode}")
        assert reader.stats["store_reads"] == 1 and reader.stats["entities_read"] == 4

    async def read():
        async with AsyncFeatureReader(conf, defs, cache=False) as reader:
            return await reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis"), reader.stats

    result, stats = asyncio.run(read())
    assert_expected(result, f"async {mode}")
    assert stats["store_reads"] == 1 and stats["entities_read"] == 4


def test_reads_follow_ask_while_a_slot_migrates_and_moved_after_it_moved(cluster, written):
    conf, defs = written
    owners = owners_of(cluster, [b"c:%d" % i for i in WRITTEN])
    key = b"c:1"
    slot, source_port = owners[key]
    others = {port for k, (_, port) in owners.items() if k != key}
    # the target: another primary, preferably one holding none of the other written keys
    candidates = [p for p in cluster.primaries() if p != source_port]
    target_port = next((p for p in candidates if p not in others), candidates[0])
    source, target = cluster.client(source_port), cluster.client(target_port)
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    stored = source.hgetall(key)
    assert stored[field_id("n")] == str(BIG).encode()  # the job's bytes, before the migration
    assert source.cluster("countkeysinslot", slot) == 1  # c:1 alone in its slot

    async def scenario():
        sync_reader = FeatureReader(conf, defs, cache=False)
        try:
            async with AsyncFeatureReader(conf, defs, cache=False) as async_reader:

                async def both(phase: str) -> tuple[int, int]:
                    """Read with each reader; the redirects ``phase`` expects, counted on the source."""
                    counts = []
                    assert_expected(sync_reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis"), f"sync {phase}")
                    counts.append(errorstat(source, "ASK") + errorstat(source, "MOVED"))
                    assert_expected(await async_reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis"), f"async {phase}")
                    counts.append(errorstat(source, "ASK") + errorstat(source, "MOVED"))
                    return counts[0], counts[1] - counts[0]

                # both readers learn the slot map while the source still serves the slot
                source.config_resetstat()
                assert await both("before") == (0, 0)

                # migrating: the key moves to the target, the slot is still the source's
                target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
                source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
                source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", key)
                assert source.cluster("countkeysinslot", slot) == 0 and target.cluster("countkeysinslot", slot) == 1
                assert slot_owners(cluster)[slot] == source_port
                with pytest.raises(redis.exceptions.AskError):
                    source.hgetall(key)
                pipe = target.pipeline(transaction=False)  # one connection: ASKING, then the read
                pipe.execute_command("ASKING")
                pipe.hgetall(key)
                assert pipe.execute()[1] == stored
                source.config_resetstat()
                sync_asks, async_asks = await both("migrating")
                assert sync_asks >= 1 and async_asks >= 1  # each reader was sent ASK
                assert errorstat(source, "MOVED") == 0

                # migrated: every node gives the slot to the target; the readers' maps are stale
                for port in cluster.primaries():
                    cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
                cluster.wait_ok()
                assert slot_owners(cluster)[slot] == target_port
                source.config_resetstat()
                sync_moved, async_moved = await both("migrated")
                assert sync_moved >= 1 and async_moved >= 1  # each reader was sent MOVED
                assert errorstat(source, "ASK") == 0
        finally:
            sync_reader.close()

    asyncio.run(scenario())
    # a new reader learns the new map
    with FeatureReader(conf, defs, cache=False) as reader:
        assert_expected(reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis"), "sync, new map")


def test_async_reader_reads_a_redis_miss_from_sql_for_the_missed_entity_only(cluster, written):
    conf, defs = written
    key = b"c:1"
    node = cluster.client(owners_of(cluster, [key])[key][1])
    with psycopg.connect(conf.sql.dsn) as conn:  # the SQL store holds consumer 1, read raw
        raw = conn.execute(
            "SELECT (features->>'n')::numeric, features->>'s' FROM consumer_features WHERE entity_key = '1' AND source = 'every_type'"
        ).fetchall()
    assert raw == [(BIG, "café")]
    saved = node.dump(key)
    assert saved is not None
    node.delete(key)
    assert node.exists(key) == 0
    features = ["every_type:n", "every_type:s"]

    async def read(c: RunConf):
        async with AsyncFeatureReader(c, defs, cache=False) as reader:
            steps = []
            for entities in ({"consumer_id": [2, 3]}, {"consumer_id": [1, 2, 3]}, CONSUMERS):
                result = await reader.get_online_features(features, entities)
                stats = reader.stats
                steps.append((result, stats["store_reads"], stats["entities_read"]))
            return steps

    try:
        held, missed, absent = asyncio.run(read(conf))
        # Redis holds 2 and 3: SQL is not read at all
        assert held[0].column("n").values == [None, -5] and held[1:] == (1, 2)
        # 1 is read from SQL alone: one Redis read of 3, one SQL read of 1
        result, reads, entities = missed
        assert (result.column("n").values, result.column("n").statuses) == ([BIG, None, -5], ["PRESENT", "NULL_VALUE", "PRESENT"])
        assert (result.column("s").values, result.column("s").statuses) == (["café", None, ""], ["PRESENT", "NULL_VALUE", "PRESENT"])
        assert (reads, entities) == (1 + 2, 2 + 3 + 1)
        # and 4, in neither store, too: Redis for all four, then SQL for 1 and 4
        result, reads, entities = absent
        assert (result.column("n").values, result.column("n").statuses) == (
            [BIG, None, -5, None],
            ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"],
        )
        assert (reads, entities) == (3 + 2, 6 + 4 + 2)
        # without read-through, Redis alone answers: 1 is not found
        off, *_ = asyncio.run(read(with_mode(conf, "cluster", read_through=False)))[2]
        assert off.column("n").statuses == ["NOT_FOUND", "NULL_VALUE", "PRESENT", "NOT_FOUND"]
    finally:
        node.restore(key, 0, saved, replace=True)


def test_the_description_is_read_again_after_the_urls_node_is_gone(cluster, written, tmp_path):
    """The reader's description of what the cluster holds is read again through a new client,
    which was seeded only by redis.url's node: once that node died (a failover, a node
    replaced), every refresh failed and, the description too old, every read failed, though
    the cluster served. A node without slots joins, seeds the reader, and is killed."""
    import time

    from throwaway.servers import free_ports, start_redis

    conf, defs = written
    seed = start_redis(tmp_path / "seed", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", port=free_ports(1)[0])
    first = cluster.client(cluster.ports[0])
    first.execute_command("CLUSTER", "MEET", "127.0.0.1", str(seed.port))
    node = redis.Redis(host="127.0.0.1", port=seed.port)
    deadline = time.monotonic() + 30
    while not (node.cluster("info")["cluster_state"] == "ok" and int(node.cluster("info")["cluster_known_nodes"]) == 4):
        assert time.monotonic() < deadline, node.cluster("info")
        time.sleep(0.2)
    seed_id = node.execute_command("CLUSTER", "MYID").decode()
    refresh = 0.5
    conf = with_mode(conf, "cluster", description_refresh_seconds=refresh)
    conf = conf.model_copy(update={"redis": conf.redis.model_copy(update={"url": f"redis://127.0.0.1:{seed.port}/0"})})

    async def read(reader):
        return await reader.get_online_features(EVERY_TYPE_FEATURES, CONSUMERS, store="redis")

    async def run():
        async with AsyncFeatureReader(conf, defs, cache=False) as reader:
            assert_expected(await read(reader), "async, seeded by the node")
            seed.stop()
            await asyncio.sleep(2 * refresh + 0.3)  # the description past twice its interval: read again before a read
            assert_expected(await read(reader), "async, the node gone")
            await asyncio.sleep(2 * refresh + 0.3)
            assert_expected(await read(reader), "async, the node gone, again")

    try:
        asyncio.run(run())
    finally:
        seed.stop()
        for port in cluster.ports:  # the others forget it: the module's later tests see the cluster as it was
            cluster.client(port).execute_command("CLUSTER", "FORGET", seed_id)

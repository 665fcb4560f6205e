"""The stores describe what they hold (serializers/FORMAT.md "The stores' description"):
the bytes of the description pinned; writers record it before their values and refuse
names a store holds as something else; readers on any definitions, older, the same or
newer than the writer's, with no stored.lock, never serve a value under an encoding other
than the one it was written with, and Redis and SQL answer alike (a model-based test)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from random import Random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feature_defs import DEFAULT_DIR, DefinitionError, load_definitions
from feature_reader import FeatureReader
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.transforms import feature_specs
from serializers.description import DescriptionError, Held, parse_redis, parse_value, redis_key, redis_value, updated
from serializers.json_map import encode_json_maps
from sinks.described import described_writes
from sinks.partition import write_partition
from sinks.redis.config import redis_sink_config
from sinks.redis.description import record_description as record_redis
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import sql_sink_config
from sinks.sql.description import record_description as record_sql
from sinks.sql.preflight import ensure_schema
from stores.sql import connect

# --- the bytes (FORMAT.md's examples) --------------------------------------------------------


def test_the_description_bytes_are_pinned():
    assert redis_key("c") == b"c" and redis_key("c", "fm") == b"fm:c"
    assert redis_value(Held("int_list/snappy", "consumer_daily")) == b"int_list/snappy consumer_daily"
    assert redis_value(Held("int_list/snappy", "consumer_daily")).hex() == "696e745f6c6973742f736e6170707920636f6e73756d65725f6461696c79"
    assert redis_value(Held("string_list/snappy", "consumer_daily", True)) == b"string_list/snappy consumer_daily retired"
    assert redis_value(Held("float/float32", "s")) == bytes.fromhex("666c6f61742f666c6f6174333220 73".replace(" ", ""))
    assert parse_redis({b"tags": b"string_list/snappy evolving retired", b"tags@2": b"int_list/none evolving"}) == {
        "tags": Held("string_list/snappy", "evolving", True),
        "tags@2": Held("int_list/none", "evolving", False),
    }
    for bad in (b"int", b"int  s", b"int s old", b"int s retired x", b""):
        with pytest.raises(DescriptionError, match="stored name 'x'"):
            parse_value("x", bad)


def test_a_write_records_its_names_and_retires_the_ones_it_no_longer_writes():
    held = {"a": Held("int", "s"), "b": Held("string", "s"), "z": Held("bool", "other")}
    assert updated(held, "s", {"a": "float", "c": "json"}) == {
        "a": Held("float", "s"),
        "c": Held("json", "s"),
        "b": Held("string", "s", True),
    }
    assert updated({"a": Held("int", "s")}, "s", {"a": "int"}) == {}  # nothing new: nothing sent


# --- writers and readers against a model, without stored.lock ---------------------------------

HEAD = "source:\n  name: evolving\n  entity: consumer\n  location: evolving\n  layout: wide\n  features:\n"
KINDS = {  # kind -> YAML, encoding, Arrow type, a random value
    "int": ("type: int", "int", pa.int64(), lambda r: r.randint(-(2**62), 2**62)),
    "float": ("type: float", "float", pa.float64(), lambda r: round(r.uniform(-1e6, 1e6), 3)),
    "float32": ("type: float, precision: float32", "float/float32", pa.float64(), lambda r: r.randint(-4000, 4000) / 8),
    "string": ("type: string", "string", pa.string(), lambda r: "".join(r.choice("ab7é") for _ in range(r.randint(0, 4)))),
    "int_list": ("type: int_list", "int_list/snappy", pa.list_(pa.int64()), lambda r: [r.randint(0, 300) for _ in range(r.randint(0, 3))]),
    "int_list_raw": (
        "type: int_list, compression: none",
        "int_list/none",
        pa.list_(pa.int64()),
        lambda r: [r.randint(0, 300) for _ in range(r.randint(0, 3))],
    ),
    "string_list": (
        "type: string_list",
        "string_list/snappy",
        pa.list_(pa.string()),
        lambda r: ["".join(r.choice("ab") for _ in range(r.randint(0, 3))) for _ in range(r.randint(0, 3))],
    ),
}
READS_AS = {("int", "float"), ("float/float32", "float")}  # FORMAT.md: stored bytes the other encoding reads as the same values
NAMES = ("a", "b", "c")
ENTITIES = [1, 2, 3, 4]


def define(folder: Path, features: dict[str, tuple[str, str]]) -> Path:
    """name -> (kind, stored name): a definitions folder without stored.lock."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    lines = [f"    - {{name: {n}, {KINDS[k][0]}{f', stored_as: {s}' if s != n else ''}}}\n" for n, (k, s) in features.items()]
    (folder / "evolving.yaml").write_text(HEAD + "".join(lines))
    return folder


class Model:
    """What the stores hold and describe, from the spec alone: per store, the values per
    (entity, stored name) with the encoding they were written with, and the description."""

    def __init__(self):
        self.values = {"redis": {}, "sql": {}}  # store -> (entity, stored name) -> (value, encoding)
        self.described: dict[str, tuple[str, bool]] = {}  # stored name -> (encoding, retired)
        self.written: set[int] = set()

    def conflict(self, name: str, encoding: str) -> bool:
        if name not in self.described:
            return False
        held, retired = self.described[name]
        return retired or (held != encoding and (held, encoding) not in READS_AS)

    def write(self, features: dict[str, tuple[str, str]], rows: dict[int, dict[str, object]]) -> None:
        encodings = {s: KINDS[k][1] for k, s in features.values()}
        for name, (held, retired) in list(self.described.items()):
            if name not in encodings and not retired:
                self.described[name] = (held, True)
        self.described.update({s: (e, False) for s, e in encodings.items()})
        for entity, values in rows.items():
            self.written.add(entity)
            sql = self.values["sql"]
            for key in [k for k in sql if k[0] == entity]:  # a SQL row is replaced whole
                del sql[key]
            for store in ("redis", "sql"):
                for stored, value in values.items():
                    if value is None:
                        self.values[store].pop((entity, stored), None)  # Redis deletes a null feature's field
                    else:
                        self.values[store][(entity, stored)] = (value, encodings[stored])

    def expected(self, store: str, entity: int, stored: str, encoding: str):
        if entity not in self.written:
            return None, "NOT_FOUND"
        if self.conflict(stored, encoding):
            return None, "INVALID"
        got = self.values[store].get((entity, stored))
        if got is None:
            return None, "NULL_VALUE"
        value, written = got
        assert written == encoding or (written, encoding) in READS_AS, "the model let a value be read under another encoding"
        return (float(value) if encoding.startswith("float") else value), "PRESENT"


def run(conf: RunConf, folder: Path, model: Model, features: dict, entities: set[int], rnd: Random, day: dt.date) -> list[str]:
    """One run of the job's write path (descriptions checked and recorded, then the partition
    writers); the refusal's lines, or [] when it wrote."""
    defs = load_definitions(folder)
    source = defs.sources["evolving"]
    entity = defs.entity_of(source)
    redis_sink, sql_sink = redis_sink_config(conf, source, entity, day), sql_sink_config(conf, source, entity, day)
    try:
        described = described_writes(conf, source, redis_sink, sql_sink)
    except DefinitionError as exc:
        return exc.problems
    record_redis(redis_sink, described["redis"], cluster=False)
    with connect(sql_sink) as conn:
        record_sql(conn, sql_sink.schema, sql_sink.table, described["sql"])
    ids = sorted(entities)
    rows = {e: {} for e in ids}
    columns: dict[str, list] = {"_id": [str(e) for e in ids]}
    for name, (kind, stored) in features.items():
        columns[name] = [None if rnd.random() < 0.25 else KINDS[kind][3](rnd) for _ in ids]
        for e, value in zip(ids, columns[name]):
            rows[e][stored] = value
    schema = pa.schema([("_id", pa.string()), *[(n, KINDS[k][2]) for n, (k, _) in features.items()]])
    batch = pa.RecordBatch.from_pydict(columns, schema=schema)
    specs = feature_specs(source)
    list(write_partition(RedisWritePlan(sink=redis_sink, features=specs), iter([batch])))
    docs, non_finite = encode_json_maps(batch, specs)
    sql_batch = pa.RecordBatch.from_pydict({"_id": columns["_id"], "_features_json": docs, "_non_finite": pa.array(non_finite)})
    from sinks.sql.writer import SqlWritePlan

    list(write_partition(SqlWritePlan(sink=sql_sink), iter([sql_batch])))
    model.write(features, rows)
    return []


def check_reader(reader: FeatureReader, features: dict[str, tuple[str, str]], model: Model, who: str) -> None:
    refs = [f"evolving:{n}" for n in features]
    for store in ("redis", "sql"):
        got = reader.get_online_features(refs, {"consumer_id": ENTITIES}, store=store)
        for name, (kind, stored) in features.items():
            column = got.column(name)
            want = [model.expected(store, e, stored, KINDS[kind][1]) for e in ENTITIES]
            assert column.statuses == [s for _, s in want], (who, store, name, kind, stored, model.described.get(stored))
            assert column.values == [v for v, _ in want], (who, store, name)


versions_step = st.one_of(
    st.tuples(st.just("retype"), st.sampled_from(NAMES), st.sampled_from(sorted(KINDS))),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("add"), st.sampled_from(NAMES), st.sampled_from(sorted(KINDS))),
    *[st.tuples(st.just("run"), st.sets(st.sampled_from(ENTITIES), min_size=1), st.randoms(use_true_random=False))] * 3,
)


@settings(
    max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(steps=st.lists(versions_step, min_size=2, max_size=10), reader_at=st.integers(0, 20))
# the cases: a list's element type changed in place, a Snappy list made raw, a float made a string
@example(steps=[("run", {1, 2}, Random(1)), ("retype", "b", "int_list"), ("run", {2}, Random(2))], reader_at=0)
@example(steps=[("run", {1, 2}, Random(3)), ("retype", "a", "int_list_raw"), ("run", {3}, Random(4))], reader_at=1)
@example(steps=[("run", {1, 2}, Random(5)), ("retype", "c", "string"), ("remove", "a"), ("run", {1}, Random(6))], reader_at=9)
def test_without_a_lock_no_reader_serves_a_value_under_another_encoding(tmp_path_factory, redis_server, pg_server, steps, reader_at):
    """Definitions changed in place with no stored.lock (the writer's refusals followed by
    giving the feature fresh storage, as they say); after every step, readers on each
    version of the definitions so far (older, the writer's, and one not yet run), new ones
    and one kept from the start that reads the descriptions again, against the model."""
    root = tmp_path_factory.mktemp("described")
    conf = RunConf(
        redis=RedisSettings(url=redis_server.url, password_env=None),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        sinks=["redis", "sql"],
        reader=ReaderSettings(timeout_ms=10_000, description_refresh_seconds=0.001),  # the suite shares 2 busy cores
        quality=QualityConf(expectations=False),
    )
    redis_server.client().flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS consumer_features, stored_names")
    features = {"a": ("int", "a"), "b": ("string_list", "b"), "c": ("float32", "c")}
    versions = [dict(features)]
    folder = define(root / "v0", features)
    defs = load_definitions(folder)
    table = sql_sink_config(conf, defs.sources["evolving"], defs.entities["consumer"])
    with connect(table) as conn:
        ensure_schema(conn, table)
    model = Model()
    kept = FeatureReader(conf, defs, cache=False)  # deployed at the start, never redeployed
    day = dt.date(2026, 1, 1)
    try:
        for op, *args in steps:
            if op == "run":
                day += dt.timedelta(days=1)
                folder = define(root / f"v{len(versions) - 1}", features)
                refused = run(conf, folder, model, features, args[0], args[1], day)
                assert bool(refused) == any(model.conflict(s, KINDS[k][1]) for k, s in features.values()), refused
                if refused:  # do what the refusal says: fresh storage, then run again
                    for line in refused:
                        name, fresh = re.search(r"feature '(\w+)'.*`stored_as: ([\w@]+)`", line).groups()
                        features[name] = (features[name][0], fresh)
                    versions.append(dict(features))
                    folder = define(root / f"v{len(versions) - 1}", features)
                    assert run(conf, folder, model, features, args[0], args[1], day) == []
            elif op == "retype" and args[0] in features:
                features[args[0]] = (args[1], features[args[0]][1])
            elif op == "remove" and args[0] in features and len(features) > 1:
                del features[args[0]]
            elif op == "add" and args[0] not in features:
                features[args[0]] = (args[1], args[0])  # a name used before: the next run says what to do
            else:
                continue
            if op != "run":
                versions.append(dict(features))
            for n, version in enumerate(versions):
                with FeatureReader(conf, load_definitions(define(root / f"r{n}", version)), cache=False) as reader:
                    check_reader(reader, version, model, f"reader of version {n} of {len(versions)}")
            check_reader(kept, versions[0], model, "the reader kept from the start")
        # one reader with the cache, on a version drawn: the same answers through the L1 cache
        version = versions[reader_at % len(versions)]
        with FeatureReader(conf, load_definitions(define(root / "cached", version))) as reader:
            check_reader(reader, version, model, "a caching reader")
    finally:
        kept.close()


# --- the cases through the real job, the reader, `materialize get` and the server ------

DAYS = [dt.date(2026, 11, 18), dt.date(2026, 11, 19)]
TABLE = "consumer_id long, tags_text array<string>, tags_ids array<long>, ids array<long>, score double, score_text string, ds date"
ROWS = [
    (1, ["ab", "acca"], [5], [300, 7], 7.5, "x", DAYS[0]),
    (2, ["ab"], [6], [1], 2.0, "y", DAYS[0]),
    (1, ["ab"], [5], [300], 7.5, "x", DAYS[1]),
]
V1 = {"tags": "type: string_list, column: tags_text", "ids": "type: int_list", "score": "type: float"}
V2 = {"tags": "type: int_list, column: tags_ids", "ids": "type: int_list, compression: none", "score": "type: string, column: score_text"}


def define_yaml(folder: Path, features: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "evolving.yaml").write_text(HEAD + "".join(f"    - {{name: {n}, {y}}}\n" for n, y in features.items()))
    return folder


@pytest.fixture(scope="module")
def retyped(spark, tmp_path_factory, redis_server, pg_server):
    """A night under V1, then V2 changes three types in place, with no stored.lock: the run
    refused, the stores as they were, and readers deployed with V2."""
    from jobs.pipeline.run import run_source

    root = tmp_path_factory.mktemp("retyped")
    spark.createDataFrame(ROWS, TABLE).write.format("delta").save(str(root / "evolving"))
    redis_server.client().flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS consumer_features, stored_names")
    conf = RunConf(
        data_root=str(root),
        quarantine_root=str(root / "quarantine"),
        reports_dir=str(root / "reports"),
        redis=RedisSettings(url=redis_server.url, password_env=None),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        sinks=["redis", "sql"],
        reader=ReaderSettings(timeout_ms=10_000),
        quality=QualityConf(expectations=False),
    )
    v1, v2 = define_yaml(root / "v1", V1), define_yaml(root / "v2", V2)
    run_source(spark, conf, load_definitions(v1), "evolving", DAYS[0], report=False)
    client = redis_server.client()
    before = {k: client.hgetall(k) for k in client.scan_iter()}
    with pytest.raises(DefinitionError) as refused:
        run_source(spark, conf, load_definitions(v2), "evolving", DAYS[1], report=False)
    after = {k: client.hgetall(k) for k in client.scan_iter()}
    assert after == before  # nothing written to Redis
    return conf, v2, refused.value.problems, before


@pytest.mark.spark
def test_a_change_in_place_without_a_lock_is_refused_by_the_stores_descriptions(retyped, pg_server):
    conf, _, problems, before = retyped
    # what each store recorded before its values (raw bytes; FORMAT.md's form)
    assert before[b"c"] == {b"tags": b"string_list/snappy evolving", b"ids": b"int_list/snappy evolving", b"score": b"float evolving"}
    with pg_server.connect() as conn:
        rows = conn.execute("SELECT entity_table, stored_name, encoding, source, retired FROM stored_names ORDER BY 2").fetchall()
    assert rows == [
        ("consumer_features", "ids", "int_list/snappy", "evolving", False),
        ("consumer_features", "score", "float", "evolving", False),
        ("consumer_features", "tags", "string_list/snappy", "evolving", False),
    ]
    lines = [
        f"source 'evolving': feature '{f}': {store} says its stored name '{f}' is stored as {was}, defined as {now}: "
        f"give it fresh storage with `stored_as: {f}@2`, or change it back"
        for store in ("Redis", "the SQL store")
        for f, was, now in [
            ("ids", "int_list/snappy", "int_list/none"),
            ("score", "float", "string"),
            ("tags", "string_list/snappy", "int_list/snappy"),
        ]
    ]
    assert problems == lines


@pytest.mark.spark
def test_readers_on_the_changed_definitions_answer_invalid_in_both_stores(retyped):
    conf, v2, _, _ = retyped
    with FeatureReader(conf, load_definitions(v2), cache=False) as reader:
        got = {s: reader.get_online_features(["evolving"], {"consumer_id": [1, 2, 3]}, store=s) for s in ("redis", "sql")}
        stats = reader.stats
        described = reader.descriptions
    for store, result in got.items():
        for name in ("tags", "ids", "score"):
            # never ["ab","acca"] as [97, 98, ...], a Snappy length byte as an element, 7.5 as "7.5"
            assert result.column(name).values == [None, None, None], (store, name)
            assert result.column(name).statuses == ["INVALID", "INVALID", "NOT_FOUND"], (store, name)
    assert stats["refused_cells"] == 2 * 3 * 2 and stats["decode_errors"] == 0
    assert described["redis"]["refused"] == [
        "evolving:ids: Redis says its stored name 'ids' is stored as int_list/snappy, defined as int_list/none",
        "evolving:score: Redis says its stored name 'score' is stored as float, defined as string",
        "evolving:tags: Redis says its stored name 'tags' is stored as string_list/snappy, defined as int_list/snappy",
    ]
    assert [line.replace("SQL", "Redis") for line in described["sql"]["refused"]] == described["redis"]["refused"]


@pytest.mark.spark
def test_get_and_the_server_on_the_changed_definitions_say_why(retyped, tmp_path):
    import json
    import os
    import subprocess

    from .support.confs import env_conf
    from .support.serving import MATERIALIZE, serve

    conf, v2, _, _ = retyped
    settings = {
        "definitions_dir": str(v2), "sinks": ["redis", "sql"],
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
        "reader": {"timeout_ms": 10000},
    }  # fmt: skip
    request = {"features": ["evolving:tags", "evolving:score"], "entities": {"consumer_id": [1, 3]}}
    folder = env_conf(tmp_path / "conf", "t", json.dumps(settings))
    printed = subprocess.run(
        [MATERIALIZE, "get", "--env", "t"], input=json.dumps(request).encode(), capture_output=True, check=True,
        env={**os.environ, "FM_CONF_DIR": str(folder)},
    )  # fmt: skip
    body = json.loads(printed.stdout)
    assert (
        "note: INVALID: evolving:tags: Redis says its stored name 'tags' is stored as string_list/snappy, defined as int_list/snappy"
        in printed.stderr.decode().splitlines()
    )
    assert [r["statuses"] for r in body["results"][1:]] == [["INVALID", "NOT_FOUND"], ["INVALID", "NOT_FOUND"]]
    assert [r["values"] for r in body["results"][1:]] == [[None, None], [None, None]]
    server = serve(tmp_path, "s", settings)
    try:
        status, answer = server.post(request)
        assert status == 200 and [r["statuses"] for r in json.loads(answer)["results"][1:]] == [["INVALID", "NOT_FOUND"]] * 2
        status, health = server.request("GET", "/health")
        assert status == 200
        assert (
            "evolving:tags: Redis says its stored name 'tags' is stored as string_list/snappy, defined as int_list/snappy"
            in (json.loads(health)["descriptions"]["redis"]["refused"])
        )
        _, metrics = server.request("GET", "/metrics")
        assert "feature_reader_refused_cells_total 2.0" in metrics.decode() and "feature_reader_refused_features 6.0" in metrics.decode()
    finally:
        server.stop()


def test_doctor_names_a_store_whose_description_disagrees_with_the_lock(tmp_path, redis_server, pg_server):
    from feature_defs.stored_lock import locked, write_lock
    from jobs.operations.doctor.descriptions import check_descriptions

    conf = RunConf(
        redis=RedisSettings(url=redis_server.url, password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        sinks=["redis", "sql"],
    )
    redis_server.client().flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS stored_names")
    folder = define(tmp_path / "defs", {"a": ("int", "a"), "b": ("string", "b")})
    write_lock(folder, locked(load_definitions(folder, check_lock=False), None, dt.date(2026, 11, 27)))
    defs = load_definitions(folder)
    undescribed = check_descriptions(conf, defs, ["redis", "sql"])
    assert [(c.status, c.detail) for c in undescribed] == [("ok", "not described yet: consumer (the next run describes them)")] * 2
    # the stores as a writer of other definitions left them: 'b' as an int list, and a name the lock does not know
    source = defs.sources["evolving"]
    entries = {"a": Held("int", "evolving"), "b": Held("int_list/snappy", "evolving"), "z": Held("bool", "evolving", True)}
    record_redis(redis_sink_config(conf, source, defs.entities["consumer"]), entries, cluster=False)
    sql_sink = sql_sink_config(conf, source, defs.entities["consumer"])
    with connect(sql_sink) as conn:
        ensure_schema(conn, sql_sink)
        record_sql(conn, None, "consumer_features", entries)
    checks = check_descriptions(conf, defs, ["redis", "sql"])
    assert [(c.status, c.name) for c in checks] == [("fail", "redis description"), ("fail", "sql description")]
    assert (
        checks[0].detail
        == checks[1].detail
        == (
            "evolving:b: stored name 'b' is stored as int_list/snappy, defined as string (readers answer INVALID); "
            "consumer: 'b': the store holds 'int_list/snappy evolving', stored.lock says 'string evolving'; "
            "consumer: 'z': the store holds 'bool evolving retired', which stored.lock does not record"
        )
    )
    # after `defs --lock` retires 'a', before the next run: the store is behind the lock, not against it
    folder = define(tmp_path / "defs2", {"b": ("string", "b")})
    write_lock(folder, locked(load_definitions(folder, check_lock=False), defs.lock, dt.date(2026, 11, 28)))
    entries = {"a": Held("int", "evolving"), "b": Held("string", "evolving")}
    redis_server.client().delete("c")
    record_redis(redis_sink_config(conf, source, defs.entities["consumer"]), entries, cluster=False)
    with connect(sql_sink) as conn:
        conn.execute("DELETE FROM stored_names")
        record_sql(conn, None, "consumer_features", entries)
    checks = check_descriptions(conf, load_definitions(folder), ["redis", "sql"])
    agrees = "2 entity type(s) described; it agrees with the definitions and stored.lock; the next run records a as stored.lock says"
    assert [(c.status, c.detail) for c in checks] == [("ok", agrees)] * 2

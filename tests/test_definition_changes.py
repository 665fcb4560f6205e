"""Definitions that change over months (feature_defs/stored.lock): a change of type or
encoding options, a removal and re-add, a rename. No sequence may make either store serve
a value written under other definitions as PRESENT, and Redis and SQL answer alike.

The rules are checked on the loader alone; the issue's cases end to end through the real
job (Spark) on the real servers; random sequences of changes and snapshots through the
job's own partition writers against a model of what must be served."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from random import Random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from feature_defs import DEFAULT_DIR, DefinitionError, load_definitions
from feature_defs.stored_lock import LOCK_NAME, changes, locked, read_lock, write_lock
from feature_reader import FeatureReader
from feature_reader.errors import RequestError
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.transforms import feature_specs
from serializers.json_map import encode_json_maps
from serializers.keys import as_of_epoch
from sinks.partition import write_partition
from sinks.redis.config import redis_sink_config
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema
from sinks.sql.writer import SqlWritePlan
from stores.sql import connect

HEAD = "source:\n  name: evolving\n  entity: consumer\n  location: evolving\n  layout: wide\n  features:\n"


def define(folder: Path, *features: str) -> Path:
    """A definitions folder with the entity types and one source 'evolving' of these features (YAML flow maps)."""
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "evolving.yaml").write_text(HEAD + "".join(f"    - {{{f}}}\n" for f in features))
    return folder


def lock(folder: Path) -> None:
    """What `materialize defs --lock` does (tested through the CLI below)."""
    defs = load_definitions(folder, check_lock=False)
    refused = [c.line() for c in changes(defs, defs.lock) if not c.lockable] if defs.lock else []
    assert not refused, refused
    write_lock(folder, locked(defs, defs.lock, dt.date(2026, 11, 27)))


def refusal(folder: Path) -> list[str]:
    with pytest.raises(DefinitionError) as err:
        load_definitions(folder)
    return err.value.problems


# --- the rules, on the loader ------------------------------------------------------------

CHANGES = [  # (before, after, stored encodings in the message)
    ("type: string_list", "type: int_list", "string_list/snappy -> int_list/snappy"),
    ("type: int_list", "type: int_list, compression: none", "int_list/snappy -> int_list/none"),
    ("type: int_list", "type: string_list", "int_list/snappy -> string_list/snappy"),
    ("type: int_list", "type: string", "int_list/snappy -> string"),
    ("type: float", "type: string", "float -> string"),
    ("type: bool", "type: int", "bool -> int"),
    ("type: float", "type: float, precision: float32", "float -> float/float32"),
    ("type: embedding, dimension: 4", "type: embedding, dimension: 8", "embedding/4 -> embedding/8"),
]


@pytest.mark.parametrize("before, after, text", CHANGES, ids=[c[2] for c in CHANGES])
def test_a_change_that_reads_old_bytes_differently_is_refused_with_the_way_forward(tmp_path, before, after, text):
    folder = define(tmp_path / "defs", "name: x, " + before, "name: y, type: int")
    lock(folder)
    define(folder, "name: x, " + after, "name: y, type: int")
    (line,) = refusal(folder)
    assert line == (
        f"{folder / 'evolving.yaml'}:7: source 'evolving': feature 'x': {text}: the values stored as {text.split(' -> ')[0]} "
        f"would be read as {text.split(' -> ')[1]}; store it under a new name with `stored_as: x@2` (it reads NULL_VALUE "
        "for each entity until a run writes it), or change it back"
    )
    define(folder, "name: x, stored_as: x@2, " + after, "name: y, type: int")  # the way forward
    assert [c.text for c in changes(load_definitions(folder, check_lock=False), read_lock(folder))] == [
        f"new, stored as 'x@2' ({text.split(' -> ')[1]})",
        "no longer stored as 'x': its stored name 'x' is retired (never served again; `materialize cleanup` deletes the values)",
    ]
    lock(folder)
    assert load_definitions(folder).sources["evolving"].features[0].stored_name == "x@2"


@pytest.mark.parametrize("before, after", [("int", "float"), ("float, precision: float32", "float")])
def test_a_change_that_reads_old_bytes_as_the_same_values_only_needs_recording(tmp_path, before, after):
    folder = define(tmp_path / "defs", f"name: x, type: {before}")
    lock(folder)
    define(folder, f"name: x, type: {after}")
    (line,) = refusal(folder)
    assert line.endswith("feature 'x': " + f"{'int' if before == 'int' else 'float/float32'} -> float (the stored values read unchanged); "
                         "record it with `materialize defs --lock`")  # fmt: skip
    lock(folder)
    assert read_lock(folder).entities["consumer"]["x"].encoding == "float"


def test_a_removed_feature_comes_back_only_under_a_new_stored_name(tmp_path):
    folder = define(tmp_path / "defs", "name: a, type: float", "name: b, type: int")
    lock(folder)
    define(folder, "name: a, type: float")
    assert refusal(folder) == [
        f"{folder / LOCK_NAME}: source 'evolving': feature 'b': removed: its stored name 'b' is retired (never served again; "
        "`materialize cleanup` deletes the values); record it with `materialize defs --lock`"
    ]
    lock(folder)
    assert read_lock(folder).entities["consumer"]["b"].retired == "2026-11-27"
    define(folder, "name: a, type: float", "name: b, type: int")  # the same definition as before
    (line,) = refusal(folder)
    assert "feature 'b': stored name 'b' was retired on 2026-11-27 (feature 'b' of source 'evolving' removed)" in line
    assert line.endswith("give it fresh storage with `stored_as: b@2`")
    define(folder, "name: a, type: float", "name: b, type: int, stored_as: b@2")
    lock(folder)
    define(folder, "name: a, type: float")
    lock(folder)
    define(folder, "name: a, type: float", "name: b, type: int, stored_as: b@2")
    assert refusal(folder)[0].endswith("`stored_as: b@3`")  # past every version taken


def test_a_feature_removed_from_one_source_is_removed_though_another_source_has_its_name(tmp_path):
    folder = define(tmp_path / "defs", "name: a, type: float")
    (folder / "other.yaml").write_text(HEAD.replace("evolving", "other") + "    - {name: a, type: int, stored_as: a@2}\n")
    lock(folder)
    define(folder, "name: b, type: string")
    assert (
        f"{folder / LOCK_NAME}: source 'evolving': feature 'a': removed: its stored name 'a' is retired (never served again; "
        "`materialize cleanup` deletes the values); record it with `materialize defs --lock`"
    ) in refusal(folder)


def test_a_rename_keeps_its_values_with_stored_as_and_a_plain_rename_says_how(tmp_path):
    folder = define(tmp_path / "defs", "name: orders, type: int")
    lock(folder)
    define(folder, "name: orders_7d, type: int")
    assert [line.split(": ", 2)[2] for line in refusal(folder)] == [
        "feature 'orders_7d': new, stored as 'orders_7d' (int); if it is 'orders' renamed, keep its values with "
        "`stored_as: orders`; record it with `materialize defs --lock`",
        "feature 'orders': removed: its stored name 'orders' is retired (never served again; `materialize cleanup` deletes the "
        "values); record it with `materialize defs --lock`",
    ]
    define(folder, "name: orders_7d, type: int, stored_as: orders")
    (line,) = refusal(folder)
    assert line.endswith("feature 'orders_7d': renamed from 'orders', keeping its stored values; record it with `materialize defs --lock`")
    lock(folder)
    assert read_lock(folder).entities["consumer"]["orders"].feature == "orders_7d"
    assert (
        load_definitions(folder).sources["evolving"].features[0].field_id
        == load_definitions(folder).sources["evolving"].features[0].field_id
    )


def test_a_feature_moved_to_another_source_gets_fresh_storage(tmp_path):
    folder = define(tmp_path / "defs", "name: a, type: float")
    lock(folder)
    (folder / "evolving.yaml").unlink()
    (folder / "other.yaml").write_text(HEAD.replace("evolving", "other") + "    - {name: a, type: float}\n")
    assert any("stored name 'a' holds values of source 'evolving'" in p and p.endswith("set `stored_as: a@2`") for p in refusal(folder))


def test_the_lock_is_part_of_the_definitions_and_a_broken_one_is_named(tmp_path):
    folder = define(tmp_path / "defs", "name: a, type: float")
    before = load_definitions(folder).digest  # no lock: nothing checked
    lock(folder)
    assert load_definitions(folder).digest != before
    (folder / LOCK_NAME).write_text("entities: [1, 2]\n")
    (line,) = refusal(folder)
    assert line.startswith(f"{folder / LOCK_NAME}: not a stored.lock (") and line.endswith("regenerate it with `materialize defs --lock`")


def test_the_project_definitions_match_their_lock():
    assert read_lock(DEFAULT_DIR) is not None
    defs = load_definitions()
    assert changes(defs, defs.lock) == []


def test_defs_lock_records_safe_changes_and_refuses_the_others_writing_nothing(tmp_path, monkeypatch):
    from jobs.cli import main

    folder = define(tmp_path / "defs", "name: a, type: int", "name: b, type: string_list")
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "local").mkdir()
    (conf / "base" / "m.yaml").write_text(f"definitions_dir: {folder}\n")
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    assert main(["defs", "--lock"]) == 0
    first = (folder / LOCK_NAME).read_text()
    assert "    a: {source: evolving, feature: a, encoding: int}\n" in first
    define(folder, "name: a, type: float", "name: b, type: int_list")
    assert main(["defs"]) == 2  # the loader refuses both until they are dealt with
    assert main(["defs", "--lock"]) == 2
    assert (folder / LOCK_NAME).read_text() == first  # nothing written: b is refused
    define(folder, "name: a, type: float", "name: b, type: int_list, stored_as: b@2")
    assert main(["defs", "--lock"]) == 0
    assert main(["defs"]) == 0
    held = read_lock(folder).entities["consumer"]
    assert (held["a"].encoding, held["b"].retired, held["b@2"].encoding) == ("float", dt.date.today().isoformat(), "int_list/snappy")


# --- random sequences of changes and snapshots, against a model --------------------------

# kind -> (YAML of type and options, stored encoding, Arrow type of the column, a value from a random.Random)
KINDS = {
    "int": ("type: int", "int", pa.int64(), lambda r: r.randint(-(2**62), 2**62)),
    "float": ("type: float", "float", pa.float64(), lambda r: round(r.uniform(-1e6, 1e6), 3)),
    "float32": ("type: float, precision: float32", "float/float32", pa.float64(), lambda r: r.randint(-4000, 4000) / 8),
    "bool": ("type: bool", "bool", pa.bool_(), lambda r: r.random() < 0.5),
    "string": ("type: string", "string", pa.string(), lambda r: "".join(r.choice("abé日") for _ in range(r.randint(0, 4)))),
    "int_list": (
        "type: int_list",
        "int_list/snappy",
        pa.list_(pa.int64()),
        lambda r: [r.randint(-(2**40), 2**40) for _ in range(r.randint(0, 4))],
    ),
    "int_list_raw": (
        "type: int_list, compression: none",
        "int_list/none",
        pa.list_(pa.int64()),
        lambda r: [r.randint(0, 300) for _ in range(r.randint(0, 4))],
    ),
    "string_list": (
        "type: string_list",
        "string_list/snappy",
        pa.list_(pa.string()),
        lambda r: ["".join(r.choice("ab") for _ in range(r.randint(0, 3))) for _ in range(r.randint(0, 3))],
    ),
}
NAMES = ("a", "b", "c", "d", "e")
ENTITIES = [1, 2, 3, 4, 5]
SAFE = {("int", "float"), ("float/float32", "float")}

step = st.one_of(
    st.tuples(st.just("retype"), st.sampled_from(NAMES), st.sampled_from(sorted(KINDS))),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.just("add"), st.sampled_from(NAMES), st.sampled_from(sorted(KINDS))),
    st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES), st.booleans()),
    *[st.tuples(st.just("run"), st.sets(st.sampled_from(ENTITIES)), st.randoms(use_true_random=False))] * 3,
)


class Model:
    """What must be served, from the definitions' history alone (no store is asked). A
    feature's incarnation starts when it is added, or changed so that old bytes would read
    differently, and goes on through safe changes and renames that keep their values; per
    entity, the latest snapshot holding it: as-of and values by incarnation."""

    def __init__(self):
        self.features: dict[str, dict] = {}  # name -> {"kind", "stored", "inc"}
        self.incarnations = 0
        self.latest: dict[int, tuple[int, dict[int, tuple[object, str]]]] = {}

    def new(self, kind: str, stored: str) -> dict:
        self.incarnations += 1
        return {"kind": kind, "stored": stored, "inc": self.incarnations}

    def expected(self, name: str, entity: int):
        if entity not in self.latest:
            return None, "NOT_FOUND"
        _, values = self.latest[entity]
        feature = self.features[name]
        if feature["inc"] not in values:
            return None, "NULL_VALUE"
        value, written = values[feature["inc"]]
        return (float(value) if KINDS[feature["kind"]][1] == "float" else value), "PRESENT"


def yaml_of(model: Model) -> list[str]:
    out = []
    for name, f in model.features.items():
        stored = f", stored_as: {f['stored']}" if f["stored"] != name else ""
        out.append(f"name: {name}, {KINDS[f['kind']][0]}{stored}")
    return out


def apply_change(folder: Path, model: Model, proposed: dict[str, dict]) -> None:
    """Write the definitions; when refused, do what the refusal says (a new stored name), then lock."""
    model.features = proposed
    define(folder, *yaml_of(model))
    try:
        defs = load_definitions(folder, check_lock=False)
        refused = [c.line() for c in changes(defs, defs.lock) if not c.lockable]
    except DefinitionError as exc:  # a stored name two features share (a rename's, taken by a new one)
        refused = exc.problems
    for line in refused:
        name = re.search(r"feature '(\w+)'", line).group(1)
        model.features[name]["stored"] = re.search(r"`stored_as: ([\w@]+)`", line).group(1)
    define(folder, *yaml_of(model))
    lock(folder)


def write_snapshot(conf: RunConf, folder: Path, model: Model, entities: set[int], rnd, day: dt.date) -> None:
    """One run's write through the job's own partition writers (Redis and SQL)."""
    defs = load_definitions(folder)
    source = defs.sources["evolving"]
    entity = defs.entity_of(source)
    ids = sorted(entities)
    columns: dict[str, list] = {"_id": [str(e) for e in ids]}
    values: dict[int, dict] = {e: {} for e in ids}
    for name, f in model.features.items():
        _, encoding, _, draw = KINDS[f["kind"]]
        column = []
        for e in ids:
            value = None if rnd.random() < 0.25 else draw(rnd)
            column.append(value)
            if value is not None:
                values[e][f["inc"]] = (value, encoding)
        columns[name] = column
    arrow = {"_id": pa.string(), **{n: KINDS[f["kind"]][2] for n, f in model.features.items()}}
    batch = pa.RecordBatch.from_pydict(columns, schema=pa.schema(list(arrow.items())))
    list(write_partition(RedisWritePlan(sink=redis_sink_config(conf, source, entity, day), features=feature_specs(source)), iter([batch])))
    sql_conf = sql_sink_config(conf, source, entity, day)
    docs, non_finite = encode_json_maps(batch, feature_specs(source))
    sql_batch = pa.RecordBatch.from_pydict({"_id": columns["_id"], "_features_json": docs, "_non_finite": pa.array(non_finite)})
    list(write_partition(SqlWritePlan(sink=sql_conf), iter([sql_batch])))
    for e in ids:
        model.latest[e] = (as_of_epoch(day), values[e])


def check_stores(conf: RunConf, folder: Path, model: Model) -> None:
    defs = load_definitions(folder)
    names = list(model.features)
    with FeatureReader(conf, defs, cache=False) as reader:
        refs = [f"evolving:{n}" for n in names]
        got = {store: reader.get_online_features(refs, {"consumer_id": ENTITIES}, store=store) for store in ("redis", "sql")}
    for name in names:
        want = [model.expected(name, e) for e in ENTITIES]
        for store, result in got.items():
            column = result.column(name)
            assert column.statuses == [s for _, s in want], (store, name, model.features[name])
            for value, (expected, _) in zip(column.values, want):
                if model.features[name]["kind"] == "float32" and expected is not None:
                    assert np.float32(value) == np.float32(expected), (store, name)
                else:
                    assert value == expected and type(value) is type(expected), (store, name, value, expected)


@pytest.mark.slow  # 21 s on its own: 80 examples of changes, each written and read back
@settings(
    max_examples=80, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(steps=st.lists(step, min_size=2, max_size=12))
# the cases, always among the examples: a type change, a removal and re-add, a rename
@example(steps=[("run", {1, 2}, Random(1)), ("retype", "b", "int_list"), ("run", {2}, Random(2))])
@example(steps=[("run", {1, 2}, Random(3)), ("remove", "b"), ("run", {1}, Random(4)), ("add", "b", "string_list")])
@example(steps=[("run", {1, 2}, Random(5)), ("rename", "a", "d", False), ("run", {2}, Random(6)), ("rename", "d", "e", True)])
def test_random_definition_changes_and_snapshots_never_serve_old_bytes(tmp_path_factory, redis_server, pg_server, steps):
    folder = tmp_path_factory.mktemp("defs")
    conf = RunConf(
        redis=RedisSettings(url=redis_server.url, password_env=None),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        sinks=["redis", "sql"],
        reader=ReaderSettings(timeout_ms=10_000),  # not the default 50 ms: the suite shares 2 busy cores
        quality=QualityConf(expectations=False),
    )
    redis_server.client().flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS consumer_features, stored_names")
    model = Model()
    apply_change(folder, model, {"a": model.new("int", "a"), "b": model.new("string_list", "b"), "c": model.new("float32", "c")})
    defs = load_definitions(folder)
    table = sql_sink_config(conf, defs.sources["evolving"], defs.entities["consumer"])
    with connect(table) as conn:
        ensure_schema(conn, table)
    day = dt.date(2026, 1, 1)
    for op, *args in steps:
        proposed = {n: dict(f) for n, f in model.features.items()}
        if op == "retype" and args[0] in proposed:
            before, after = KINDS[proposed[args[0]]["kind"]][1], KINDS[args[1]][1]
            if before == after or (before, after) in SAFE:
                proposed[args[0]]["kind"] = args[1]
            else:
                proposed[args[0]] = model.new(args[1], proposed[args[0]]["stored"])
        elif op == "remove" and args[0] in proposed and len(proposed) > 1:
            del proposed[args[0]]
        elif op == "add" and args[0] not in proposed:
            proposed[args[0]] = model.new(args[1], args[0])
        elif op == "rename" and args[0] in proposed and args[1] not in proposed:
            old = proposed.pop(args[0])
            # stored_as: the old stored name, keeping the values; or none, starting afresh, unless
            # the new name is the old stored name (renamed back): the same storage, values kept
            keep = args[2] or old["stored"] == args[1]
            proposed[args[1]] = old if keep else model.new(old["kind"], args[1])
        elif op == "run":
            day += dt.timedelta(days=1)
            write_snapshot(conf, folder, model, args[0], args[1], day)
            check_stores(conf, folder, model)
            continue
        else:
            continue
        apply_change(folder, model, proposed)
        check_stores(conf, folder, model)


def test_two_sources_with_a_feature_of_one_name_share_each_entitys_hash(tmp_path, redis_server, pg_server):
    """One hash per entity holds every source of its entity type (as Feast keeps one key per
    entity): ``a`` of two sources lives under two stored names, each read as its own type."""
    import xxhash

    folder = define(tmp_path / "defs", "name: a, type: int")
    (folder / "other.yaml").write_text(HEAD.replace("evolving", "other") + "    - {name: a, type: string, stored_as: a@2}\n")
    defs = load_definitions(folder, check_lock=False)
    conf = RunConf(
        redis=RedisSettings(url=redis_server.url, password_env=None),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        sinks=["redis", "sql"],
        reader=ReaderSettings(timeout_ms=10_000),
        quality=QualityConf(expectations=False),
    )
    redis_server.client().flushall()
    with pg_server.connect() as conn:
        conn.execute("DROP TABLE IF EXISTS consumer_features, stored_names")
    day = dt.date(2026, 3, 1)
    for name, column in (("evolving", pa.array([7, None], pa.int64())), ("other", pa.array(["seven", "eight"]))):
        source = defs.sources[name]
        entity = defs.entity_of(source)
        batch = pa.RecordBatch.from_pydict({"_id": ["1", "2"], "a": column})
        redis_plan = RedisWritePlan(sink=redis_sink_config(conf, source, entity, day), features=feature_specs(source))
        list(write_partition(redis_plan, iter([batch])))
        table = sql_sink_config(conf, source, entity, day)
        with connect(table) as conn:
            ensure_schema(conn, table)
        docs, non_finite = encode_json_maps(batch, feature_specs(source))
        sql_batch = pa.RecordBatch.from_pydict({"_id": ["1", "2"], "_features_json": docs, "_non_finite": pa.array(non_finite)})
        list(write_partition(SqlWritePlan(sink=table), iter([sql_batch])))

    client = redis_server.client()
    assert sorted(client.keys("*")) == [b"c:1", b"c:2"]  # one key per consumer (the run's driver writes the description)
    field = {n: xxhash.xxh32_intdigest(n.encode()).to_bytes(4, "little") for n in ("a", "a@2", "_ts:evolving", "_ts:other")}
    epoch = str(as_of_epoch(day)).encode()
    assert client.hgetall("c:1") == {field["a"]: b"7", field["a@2"]: b"seven", field["_ts:evolving"]: epoch, field["_ts:other"]: epoch}
    assert client.hgetall("c:2") == {field["a@2"]: b"eight", field["_ts:evolving"]: epoch, field["_ts:other"]: epoch}

    with FeatureReader(conf, defs, cache=False) as reader:
        for store in ("redis", "sql"):
            got = reader.get_online_features(["evolving:a", "other:a"], {"consumer_id": [1, 2]}, store=store, full_feature_names=True)
            assert got.column("evolving__a").values == [7, None], store
            assert got.column("evolving__a").statuses == ["PRESENT", "NULL_VALUE"], store
            assert got.column("other__a").values == ["seven", "eight"], store
            with pytest.raises(RequestError, match="features a come from several sources: ask with full_feature_names"):
                reader.get_online_features(["evolving:a", "other:a"], {"consumer_id": [1]}, store=store)


# --- the cases through the real job (Spark) on the real servers --------------------

DAYS = [dt.date(2026, 11, 18), dt.date(2026, 11, 19), dt.date(2026, 11, 20)]
TABLE = "consumer_id long, tags_text array<string>, tags_ids array<long>, b long, orders long, ds date"
ROWS = [  # consumer 1 only on day 1, consumer 2 until day 2, consumer 3 every day
    (1, ["ab", "acca"], [], 7, 10, DAYS[0]),
    (2, ["ab"], [], 8, 20, DAYS[0]),
    (3, ["x"], [], 9, 30, DAYS[0]),
    (2, [], [5, 6], 0, 21, DAYS[1]),
    (3, [], [7], 0, 31, DAYS[1]),
    (3, [], [8], 99, 32, DAYS[2]),
]
V1 = ["name: tags, type: string_list, column: tags_text", "name: b, type: int", "name: orders, type: int"]
V2 = ["name: tags, type: int_list, column: tags_ids", "name: orders_7d, type: int, column: orders, stored_as: orders"]
V3 = [*V2, "name: b, type: int"]


@pytest.fixture(scope="module")
def changed(spark, tmp_path_factory, redis_server, pg_server):
    """Three nights, the definitions changed between them as the refusals say: what each
    change was refused with, and what both stores answer afterwards for consumers 1-4."""
    from jobs.pipeline.run import run_source

    root = tmp_path_factory.mktemp("changes")
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
        reader=ReaderSettings(timeout_ms=10_000),  # not the default 50 ms: the suite shares 2 busy cores
        quality=QualityConf(expectations=False),
    )
    folder = define(root / "defs", *V1)
    lock(folder)
    refused, stored_as = {}, {}
    for day, features in zip(DAYS, [V1, V2, V3]):
        # what the refusals said so far stays in the definitions
        features = [f + f", stored_as: {stored_as[n]}" if (n := f.split(",")[0][6:]) in stored_as else f for f in features]
        define(folder, *features)
        try:
            load_definitions(folder)
        except DefinitionError as exc:
            refused[day] = exc.problems
            for line in exc.problems:  # do what each refusal says
                if (way := re.search(r"feature '(\w+)'.*`stored_as: ([\w@]+)`", line)) is not None:
                    stored_as[way[1]] = way[2]
                    features = [f + f", stored_as: {way[2]}" if f.startswith(f"name: {way[1]},") else f for f in features]
            define(folder, *features)
            lock(folder)
        run_source(spark, conf, load_definitions(folder), "evolving", day, report=False)
    refs = ["evolving:tags", "evolving:b", "evolving:orders_7d"]
    with FeatureReader(conf, load_definitions(folder), cache=False) as reader:
        answers = {s: reader.get_online_features(refs, {"consumer_id": [1, 2, 3, 4]}, store=s) for s in ("redis", "sql")}
    return folder, refused, answers


def answers(changed, feature: str) -> list:
    """(values, statuses) of one feature, the same from both stores."""
    _, _, got = changed
    both = [(got[s].column(feature).values, got[s].column(feature).statuses) for s in ("redis", "sql")]
    assert both[0] == both[1], both
    return both[0]


@pytest.mark.spark
def test_case1_a_type_change_is_refused_and_old_bytes_are_never_read_as_the_new_type(changed):
    folder, refused, _ = changed
    assert f"{folder / 'evolving.yaml'}:7: source 'evolving': feature 'tags': string_list/snappy -> int_list/snappy" in "\n".join(
        refused[DAYS[1]]
    )
    # consumer 1's ["ab", "acca"] is not [97, 98, 97, 99, 99, 97]: nothing under the new type yet
    assert answers(changed, "tags") == ([None, [5, 6], [8], None], ["NULL_VALUE", "PRESENT", "PRESENT", "NOT_FOUND"])


@pytest.mark.spark
def test_case2_a_removed_feature_added_back_does_not_resurrect_its_old_values(changed):
    _, refused, _ = changed
    assert any("feature 'b': removed" in line for line in refused[DAYS[1]])
    assert any("feature 'b': stored name 'b' was retired" in line for line in refused[DAYS[2]])
    # consumer 2's 8 (written before the removal) stays unserved; consumer 3 was written again
    assert answers(changed, "b") == ([None, None, 99, None], ["NULL_VALUE", "NULL_VALUE", "PRESENT", "NOT_FOUND"])


@pytest.mark.spark
def test_case3_a_rename_with_stored_as_keeps_every_entitys_value(changed):
    _, refused, _ = changed
    assert any("feature 'orders_7d': renamed from 'orders', keeping its stored values" in line for line in refused[DAYS[1]])
    assert answers(changed, "orders_7d") == ([10, 21, 32, None], ["PRESENT", "PRESENT", "PRESENT", "NOT_FOUND"])


def test_the_field_id_and_json_key_are_the_stored_names(tmp_path):
    """FORMAT.md "Field" (version 1.2): xxh32 of the stored name, fixed bytes; the SQL JSON key is it too."""
    folder = define(tmp_path / "defs", "name: recent_store_ids, type: int_list, stored_as: recent_store_ids@2", "name: n, type: int")
    source = load_definitions(folder).sources["evolving"]
    specs = feature_specs(source)
    assert specs[0].field == bytes.fromhex("e4114493") and source.features[0].field_id == int.from_bytes(
        bytes.fromhex("e4114493"), "little"
    )
    batch = pa.RecordBatch.from_pydict({"recent_store_ids": pa.array([[1, 2]], pa.list_(pa.int64())), "n": [3]})
    assert encode_json_maps(batch, specs)[0].to_pylist() == ['{"recent_store_ids@2":[1,2],"n":3}']


@pytest.mark.spark
def test_without_the_lock_the_ledger_refuses_what_the_stores_cannot_take(spark, tmp_path, redis_server):
    """stored.lock deleted (or regenerated from scratch): the run checks the ledger, which
    records each stored name's encoding; it refuses before recording or writing anything."""
    from jobs.operations.backfill import plan_backfill, recorded_run
    from jobs.operations.ledger.events import Ledger

    spark.createDataFrame(ROWS, TABLE).write.format("delta").save(str(tmp_path / "evolving"))
    redis_server.client().flushall()  # no store description left by other tests: the ledger is what is checked here
    conf = RunConf(
        data_root=str(tmp_path),
        ledger_root=str(tmp_path / "ledger"),
        quarantine_root=str(tmp_path / "quarantine"),
        reports_dir=str(tmp_path / "reports"),
        redis=RedisSettings(url=redis_server.url, password_env=None),
        sinks=["redis"],
        quality=QualityConf(expectations=False),
    )
    ledger = Ledger.of(spark, conf)
    folder = define(tmp_path / "defs", "name: tags, type: string_list, column: tags_text", "name: b, type: int")
    recorded_run(spark, conf, load_definitions(folder), ledger, "run", "evolving", DAYS[0], report=False)
    define(folder, "name: tags, type: string_list, column: tags_text")
    recorded_run(spark, conf, load_definitions(folder), ledger, "run", "evolving", DAYS[1], report=False)
    define(folder, "name: tags, type: int_list, column: tags_ids", "name: b, type: int")
    assert read_lock(folder) is None
    with pytest.raises(DefinitionError) as err:
        recorded_run(spark, conf, load_definitions(folder), ledger, "run", "evolving", DAYS[2], report=False)
    first, second = (re.sub(r"\(run \w+\)", "(run R)", line) for line in err.value.problems[:2])
    assert first == (
        "source 'evolving': feature 'tags': the stores hold 'tags' as string_list/snappy (the run of 2026-11-19 (run R)), "
        "defined now as int_list/snappy: its values would be read as int_list/snappy; set `stored_as: tags@2`, or change it back"
    )
    assert second == (
        "source 'evolving': feature 'b': 'b' was left out by the run of 2026-11-19 (run R) and is back: the values written "
        "before are still stored (with that newer as-of); set `stored_as: b@2`"
    )
    assert [s["start_date"] for s in ledger.write_steps("consumer")] == DAYS[:2]  # the refused run recorded nothing
    plan = plan_backfill(spark, conf, load_definitions(folder), ledger, "evolving", DAYS[0], DAYS[2], "replay", force=True)
    assert [re.sub(r"\(run \w+\)", "(run R)", line) for line in plan.refused[:2]] == [first, second]
    assert f"  refused: {err.value.problems[0]}" in plan.describe()

"""json features end to end: source columns of every kind (JSON text, struct, map, array)
through the real job into Redis and PostgreSQL, bad values quarantined per row, the stores
read back raw, then through the reader, `materialize get` and the feature server.

Expected stored texts are written here by hand from serializers/FORMAT.md's json rules;
the Python values a reader must return are those texts read by ``json.loads``.
"""

from __future__ import annotations

import json
import sys

import pytest
import snappy
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import DEFAULT_DIR, load_definitions
from feature_reader import AsyncFeatureReader, FeatureReader
from feature_reader.server import FeatureServer
from fm_config import QualityConf, RunConf
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.pipeline.gate.checks import derive_checks, validation_frame
from jobs.pipeline.gate.scan import scan
from jobs.transforms import schema_problems
from serializers import field_id, freshness_field
from serializers.keys import as_of_epoch

from .support.asgi import asgi_post
from .support.samples import SAMPLE_DATES, TINY_SOURCE

DAY = SAMPLE_DATES[1]
DB = 7  # a Redis database of this module's own
FEATURES = """\
    - {name: cfg, type: json, max_bytes: 80}
    - {name: meta, type: json}
    - {name: prof, type: json, compression: snappy}
    - {name: hist, type: json}
"""
SCHEMA = (
    "consumer_id long, cfg string, meta struct<vehicle_type: string, rating: string>, prof map<string, double>, hist array<double>, ds date"
)
NAN, INF = float("nan"), float("inf")

# consumer -> (cfg text, meta, prof, hist); then per good value its stored text, by hand
ROWS = {
    1: (
        ' { "preferred_zones" : [ "east" ] , "max_distance_km" : 1.0e2 , "n" : {"z": null, "é": -0.0} } ',
        {"vehicle_type": "sedan", "rating": "4.0"}, {"b": 1e19, "a": 0.1}, [1e16, -2.0],
    ),
    2: ('{"a": NaN}', {"vehicle_type": "suv", "rating": "3.9"}, None, None),  # bad: NaN in the text
    3: ('{"a": ', None, None, None),  # bad: not JSON
    4: ('{"a": 8}', None, {"y": NAN}, None),  # bad: NaN in a map
    5: ('{"a": "' + "x" * 80 + '"}', None, None, None),  # bad: 88 bytes > max_bytes 80
    6: ('{"a": "x\\u0000y"}', None, None, None),  # bad where the SQL store is written: U+0000
    7: (None, None, None, None),  # new, all null
    8: ('{"a": 1, "a": 2}', None, None, None),  # bad: duplicate key
    9: ("[9223372036854775808]", None, None, [INF]),  # bad twice: beyond int64, and inf
    10: ("null", {"vehicle_type": None, "rating": "5"}, {}, []),  # a text null is null; a null field kept; empty ones
    11: ('"just a string"', None, None, None),
    12: (
        '{"max_distance_km": 34, "preferred_zones": ["south", "west"]}', {"vehicle_type": "truck", "rating": "4.3"},
        {"b": 1.0, "a": 0.25}, [1.0, 2.5],
    ),
    14: (None, None, {f"k{i:03}": i / 4 for i in range(100)}, [i / 8 for i in range(200)]),  # larger: the cache counts them
}  # fmt: skip
BAD = {
    2: ["cfg: NaN or infinity in JSON"],
    3: ["cfg: not JSON text"],
    4: ["prof: NaN or infinity in JSON"],
    5: ["cfg: JSON larger than 80 bytes (max_bytes)"],
    6: ["cfg: NUL character (not storable in JSONB)"],
    8: ["cfg: duplicate key in a JSON object"],
    9: ["cfg: integer beyond int64 in JSON", "hist: NaN or infinity in JSON"],
}
STORED = {  # what each good value is stored as (Redis's bytes before Snappy; SQL's value), written by hand
    1: {"cfg": '{"max_distance_km":100,"n":{"z":null,"\u00e9":0},"preferred_zones":["east"]}',
        "meta": '{"rating":"4.0","vehicle_type":"sedan"}', "prof": '{"a":0.1,"b":1e+19}', "hist": "[10000000000000000,-2]"},
    7: {},
    10: {"meta": '{"rating":"5","vehicle_type":null}', "prof": "{}", "hist": "[]"},
    11: {"cfg": '"just a string"'},
    12: {"cfg": '{"max_distance_km":34,"preferred_zones":["south","west"]}', "meta": '{"rating":"4.3","vehicle_type":"truck"}',
         "prof": '{"a":0.25,"b":1}', "hist": "[1,2.5]"},
    14: {"prof": "{" + ",".join(f'"k{i:03}":{i // 4 if i % 4 == 0 else i / 4}' for i in range(100)) + "}",
         "hist": "[" + ",".join(str(i // 8 if i % 8 == 0 else i / 8) for i in range(200)) + "]"},
}  # fmt: skip
AS_OF = as_of_epoch(DAY)


@pytest.fixture(scope="module")
def written(spark, redis_server, pg_server, tmp_path_factory):
    """The json source's rows written by the real job into Redis (db 7) and PostgreSQL."""
    from jobs.pipeline.run import run_source

    root = tmp_path_factory.mktemp("json")
    (root / "defs").mkdir()
    (root / "defs" / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (root / "defs" / "tiny.yaml").write_text(TINY_SOURCE + FEATURES)
    defs = load_definitions(root / "defs")
    # consumer 12 twice: the de-duplication runs over a map column (Spark hashes no map: its JSON is hashed)
    df = spark.createDataFrame([(cid, *values, DAY) for cid, values in [*ROWS.items(), (12, ROWS[12])]], SCHEMA)
    df.write.format("delta").save(str(root / "tiny"))
    redis_server.client(DB).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    conf = RunConf(
        env="test", data_root=str(root), quarantine_root=str(root / "quarantine"), reports_dir=str(root / "reports"),
        definitions_dir=str(root / "defs"), sinks=["redis", "sql"],
        redis=RedisSettings(url=redis_server.url.rsplit("/", 1)[0] + f"/{DB}", password_env=None, mode="standalone", sample_entities=50),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        quality=QualityConf(expectations=False, max_bad_fraction=1.0, verify_sample=20),
    )  # fmt: skip
    return conf, defs, run_source(spark, conf, defs, "tiny", DAY)


def test_bad_values_are_quarantined_per_row_and_the_rest_written(spark, written):
    conf, defs, summary = written
    assert summary.status == "succeeded", summary.error
    assert summary.bad_rows == len(BAD) and summary.entities == len(ROWS) - len(BAD) == len(STORED)
    assert summary.superseded_rows == 1  # the copy of consumer 12
    assert summary.bad_reasons == {r: sum(r in rs for rs in BAD.values()) for rs in BAD.values() for r in rs}
    quarantined = spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{DAY}'").collect()
    assert {json.loads(r["row"])["consumer_id"]: sorted(r["reasons"]) for r in quarantined} == {c: sorted(rs) for c, rs in BAD.items()}
    shown = {json.loads(r["row"])["consumer_id"]: json.loads(r["row"]) for r in quarantined}
    assert shown[3]["cfg"] == '{"a": ' and shown[4]["prof"] == '{"y": NaN}'  # the bad value as read
    # read back after the write by the job itself, from both stores
    assert {s: (v["checked"], v["mismatches"]) for s, v in summary.verification.items()} == {
        "redis": (len(STORED), 0),
        "sql": (len(STORED), 0),
    }


def test_both_stores_hold_the_canonical_text_raw(written, redis_server, pg_server):
    conf, defs, _ = written
    source = defs.sources["tiny"]
    client = redis_server.client(DB)
    with pg_server.connect() as conn:
        rows = dict(conn.execute("SELECT entity_key, features::text FROM consumer_features WHERE source = 'tiny'").fetchall())
    # a bad row is written nowhere: no key, no row
    assert sorted(int(k.split(b":")[1]) for k in client.scan_iter(match=b"c:*")) == sorted(STORED) == sorted(int(k) for k in rows)
    for cid, stored in STORED.items():
        held = client.hgetall(f"c:{cid}")
        texts = {f.name: held[field_id(f.name)] for f in source.features if field_id(f.name) in held}
        assert held[freshness_field("tiny")] == str(AS_OF).encode(), cid
        # prof is declared Snappy: its bytes are a Snappy block of the text; the others the text itself
        if "prof" in texts:
            assert texts["prof"] == snappy.compress(stored["prof"].encode()) and texts["prof"] != stored["prof"].encode()
            texts["prof"] = snappy.decompress(texts["prof"])
        assert texts == {name: text.encode() for name, text in stored.items()}, cid
        # the SQL row: the values themselves (objects, arrays, strings), equal as JSON values
        assert json.loads(rows[str(cid)]) == {name: json.loads(text) for name, text in stored.items()}, cid
    # a value of a json feature is an object in the JSONB, not a string holding one
    with pg_server.connect() as conn:
        kinds = "SELECT jsonb_typeof(features->'cfg'), jsonb_typeof(features->'hist') FROM consumer_features WHERE entity_key = '1'"
        assert conn.execute(kinds).fetchone() == ("object", "array")


def _expected(cids: list[int], name: str) -> tuple[list, list[str]]:
    values, statuses = [], []
    for cid in cids:
        held = STORED.get(cid)
        if held is None:
            values.append(None), statuses.append("NOT_FOUND")
        elif name not in held:
            values.append(None), statuses.append("NULL_VALUE")
        else:
            values.append(json.loads(held[name])), statuses.append("PRESENT")
    return values, statuses


CIDS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def test_the_reader_returns_the_python_values_from_both_stores(written):
    conf, defs, _ = written
    clock = lambda: AS_OF + 60  # noqa: E731
    with FeatureReader(conf, defs, cache=False, clock=clock) as reader:
        for store in ("redis", "sql"):
            result = reader.get_online_features(["tiny"], {"consumer_id": CIDS}, store=store)
            for name in ("cfg", "meta", "prof", "hist"):
                values, statuses = _expected(CIDS, name)
                column = result.column(name)
                assert column.statuses == statuses, (store, name)
                assert repr(column.values) == repr(values), (store, name)  # ints as ints, floats as floats, at any depth
            assert result.column("cfg").values[0] == {"max_distance_km": 100, "n": {"z": None, "é": 0}, "preferred_zones": ["east"]}
            assert result.to_dict()["prof"][0] == {"a": 0.1, "b": 1e19}
    # the cache counts what the values hold as Python objects, not their stored bytes (a Snappy block is far shorter)
    for store in ("redis", "sql"):
        with FeatureReader(conf, defs, clock=clock) as reader:
            values = reader.get_online_features(["tiny:prof", "tiny:hist"], {"consumer_id": [14]}, store=store).to_dict()
            assert reader.cache.bytes >= _deep_size(values["prof"][0]) + _deep_size(values["hist"][0]), store
    # the cache hands out the values read (as it does lists): the same Python values
    with FeatureReader(conf, defs, clock=clock) as reader:
        for _ in range(2):
            assert reader.get_online_features(["tiny:hist"], {"consumer_id": [1]}).to_dict()["hist"] == [[10**16, -2]]


def _deep_size(value) -> int:
    """Bytes of a value's Python objects, each counted once."""
    seen, total, todo = set(), 0, [value]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        total += sys.getsizeof(v)
        todo += [*v.keys(), *v.values()] if isinstance(v, dict) else v if isinstance(v, list) else []
    return total


def test_feast_responses_of_get_and_the_server_carry_the_values_as_json(written, tmp_path, monkeypatch, capsys):
    """Feast's response body: a json feature's values are JSON values (objects, arrays...), as
    `feast serve` sends its Map and Struct features, so Feast's remote client reads the Python
    values Feast's own store gives (feature_reader/README.md)."""
    from jobs.cli import main

    from .support.confs import env_conf

    conf, defs, _ = written
    request = {"features": ["tiny:cfg", "tiny:meta", "tiny:prof", "tiny:hist"], "entities": {"consumer_id": [1, 10, 13]}}
    with FeatureReader(conf, defs, cache=False) as reader:
        expected = reader.get_online_features(request["features"], request["entities"], store="sql").to_feast_json()
    body = json.loads(expected)
    assert body["metadata"]["feature_names"] == ["consumer_id", "cfg", "meta", "prof", "hist"]
    cfg, meta, prof, hist = body["results"][1:]
    assert cfg["values"] == [{"max_distance_km": 100, "n": {"z": None, "é": 0}, "preferred_zones": ["east"]}, None, None]
    assert cfg["statuses"] == ["PRESENT", "NULL_VALUE", "NOT_FOUND"]
    assert meta["values"] == [{"rating": "4.0", "vehicle_type": "sedan"}, {"rating": "5", "vehicle_type": None}, None]
    assert prof["values"][:2] == [{"a": 0.1, "b": 1e19}, {}] and hist["values"][:2] == [[10**16, -2], []]
    assert b'"values":[{"max_distance_km":100,' in expected  # an object, not a string holding one
    assert cfg["event_timestamps"][0] == "2026-11-21T00:00:00Z"

    settings = json.dumps({
        "definitions_dir": conf.definitions_dir, "sinks": ["redis", "sql"],
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
    })  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(env_conf(tmp_path / "conf", "t", settings)))
    (tmp_path / "req.json").write_text(json.dumps(request))
    for store in ("sql", "redis"):
        assert main(["get", "--env", "t", "--request", str(tmp_path / "req.json"), "--store", store]) == 0
        assert capsys.readouterr().out.encode() == expected + b"\n", store
    status, served = asgi_post(FeatureServer(AsyncFeatureReader(conf, defs)), json.dumps(request).encode())
    assert (status, served) == (200, expected)


def test_the_schema_check_takes_json_columns_and_names_the_others():
    defs = load_definitions(DEFAULT_DIR)
    entity = defs.entities["consumer"]
    from feature_defs.models import SourceDef

    source = SourceDef.model_validate(
        {"name": "t", "entity": "consumer", "location": "t", "layout": "wide",
         "features": [{"name": n, "type": "json"} for n in ("a", "b", "c", "d", "e", "f", "g", "h", "i")]}
    )  # fmt: skip
    S, L = T.StringType(), T.LongType()
    schema = T.StructType([
        T.StructField("consumer_id", L), T.StructField("ds", T.DateType()),
        T.StructField("a", S),  # JSON text
        T.StructField("b", T.StructType([T.StructField("x", S), T.StructField("y", T.FloatType())])),
        T.StructField("c", T.MapType(S, T.ArrayType(T.MapType(S, T.DecimalType(10, 2))))),
        T.StructField("d", T.ArrayType(T.BooleanType())),
        T.StructField("e", T.MapType(L, S)),  # keys that are not strings
        T.StructField("f", T.BinaryType()),
        T.StructField("g", T.StructType([T.StructField("when", T.TimestampType())])),
        T.StructField("h", L),  # a bare number: not a structured value
    ])  # fmt: skip
    assert schema_problems(schema, source, entity) == [
        "column 'e' has type map<bigint,string>, expected json (a string of JSON text, or a map with string keys, a struct or an "
        "array): the map has bigint keys (JSON object keys are strings)",
        "column 'f' has type binary, expected json (a string of JSON text, or a map with string keys, a struct or an array)",
        "column 'g' has type struct<when:timestamp>, expected json (a string of JSON text, or a map with string keys, a struct or "
        "an array): when is timestamp, which JSON cannot hold",
        "column 'h' has type bigint, expected json (a string of JSON text, or a map with string keys, a struct or an array)",
        "column 'i' is missing (expected json (a string of JSON text, or a map with string keys, a struct or an array))",
    ]
    long = SourceDef.model_validate(
        {"name": "t", "entity": "consumer", "location": "t", "layout": "long", "name_column": "n", "value_column": "v",
         "features": [{"name": "a", "type": "json"}]}
    )  # fmt: skip
    base = [T.StructField("consumer_id", L), T.StructField("n", S), T.StructField("ds", T.DateType())]
    assert schema_problems(T.StructType([*base, T.StructField("v", S)]), long, entity) == []
    assert schema_problems(T.StructType([*base, T.StructField("v", T.DoubleType())]), long, entity) == [
        "column 'v' has type double: json features of a long layout need a string value column (JSON text)"
    ]


def test_the_gate_checks_json_nulls_and_nothing_else(spark):
    from feature_defs.models import SourceDef
    from fm_config import QualityConf

    defs = load_definitions(DEFAULT_DIR)
    source = SourceDef.model_validate(
        {"name": "t", "entity": "consumer", "location": "t", "layout": "wide",
         "features": [{"name": "cfg", "type": "json", "max_null_fraction": 0.5}, {"name": "meta", "type": "json"}]}
    )  # fmt: skip
    checks = derive_checks(source, defs.entities["consumer"], QualityConf(max_null_fraction=0.25))
    assert [(c.name, c.type) for c in checks if "cfg" in c.name or "meta" in c.name] == [
        ("cfg is json", "expect_column_values_to_be_of_type"),
        ("cfg null at most 50%", "expect_column_values_to_not_be_null"),
        ("meta is json", "expect_column_values_to_be_of_type"),
        ("meta null at most 25%", "expect_column_values_to_not_be_null"),
    ]
    snapshot = spark.createDataFrame(
        [(1, '{"a":1}', None, 0), (2, None, None, 0), (3, "[]", '"x"', 0), (4, None, None, 0)],
        "consumer_id long, cfg string, meta string, _conflicts int",
    )
    found, profile = scan(validation_frame(snapshot, source), checks, source)
    outcome = {checks[i].name: (ok, result.get("unexpected_count")) for i, (ok, result) in found.items()}
    assert outcome["cfg is json"][0] and outcome["meta is json"][0]
    assert outcome["cfg null at most 50%"] == (True, 2)
    assert outcome["meta null at most 25%"] == (False, 3)
    assert profile["cfg"] == {"null_fraction": 0.5} and profile["meta"] == {"null_fraction": 0.75}


def test_a_long_layouts_string_values_are_json_texts(spark):
    from feature_defs.models import SourceDef
    from jobs.transforms import REASONS, long_features, tag_value_problems

    entity = load_definitions(DEFAULT_DIR).entities["consumer"]
    NO_REASONS = F.array().cast("array<string>")  # noqa: N806
    long = SourceDef.model_validate(
        {"name": "t", "entity": "consumer", "location": "t", "layout": "long", "name_column": "name", "value_column": "value",
         "features": [{"name": "cfg", "type": "json"}, {"name": "n", "type": "int"}]}
    )  # fmt: skip
    rows = [(1, "cfg", ' {"b": 1, "a": 2.0} ', DAY), (1, "n", "5", DAY), (2, "cfg", "[NaN]", DAY), (3, "cfg", "null", DAY)]
    df = spark.createDataFrame(rows, "consumer_id long, name string, value string, ds date").withColumn(REASONS, NO_REASONS)
    tagged = tag_value_problems(long_features(df, long, entity), long)
    got = {r["consumer_id"]: (r["cfg"], r["n"], list(r[REASONS])) for r in tagged.collect()}
    assert got == {1: ('{"a":2,"b":1}', 5, []), 2: ("[NaN]", None, ["cfg: NaN or infinity in JSON"]), 3: (None, None, [])}

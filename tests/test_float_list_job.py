"""float_list features end to end: double, float and integer array columns through the real
job into Redis and PostgreSQL, bad elements quarantined per row, the stores read back raw,
then through the reader and the feature server's body, which keep floats floats.

Expected bytes are packed here by hand (tag 0x0a, the payload's length, little-endian
doubles or float32s: serializers/FORMAT.md), never by the encoder under test.
"""

from __future__ import annotations

import json
import struct

import pytest
import snappy
from pyspark.sql import types as T

from feature_defs import DEFAULT_DIR, load_definitions
from feature_reader import AsyncFeatureReader, FeatureReader
from feature_reader.decode import BAD, from_json
from feature_reader.server import FeatureServer
from fm_config import QualityConf, RunConf
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from serializers import field_id, freshness_field
from serializers.keys import as_of_epoch

from .support.asgi import asgi_post
from .support.samples import SAMPLE_DATES, TINY_SOURCE

DAY = SAMPLE_DATES[1]
AS_OF = as_of_epoch(DAY)
DB = 9  # a Redis database of this module's own
FEATURES = """\
    - {name: fares, type: float_list}
    - {name: ratios, type: float_list, precision: float32}
    - {name: hist, type: float_list, compression: snappy}
"""
# ratios: doubles declared float32; hist: integers
SCHEMA = "consumer_id long, fares array<double>, ratios array<double>, hist array<bigint>, ds date"
NAN, INF = float("nan"), float("inf")
ROWS = {
    1: ([1.0, 0.5], [1.0, 0.1], [3, -1]),
    2: ([-2.5, 1e-07, 3.0], [], []),
    3: ([1.0, None], None, None),  # bad: a null element
    4: ([NAN], None, None),  # bad: NaN
    5: (None, [1e39], None),  # bad: beyond float32 range
    6: ([-INF, 2.0], None, [1, None]),  # bad twice
    7: (None, None, None),  # all null: nothing stored but the freshness
    8: ([], [3.4e38, -0.25], [0, 7, 1000000]),
    9: ([0.1 * i for i in range(40)], None, None),  # 320 bytes of payload: a two-byte length
}
BAD_REASONS = {
    3: ["fares: null list element"],
    4: ["fares: float_list element is NaN or infinite"],
    5: ["ratios: float_list element is NaN or infinite (or beyond float32 range)"],
    6: ["fares: float_list element is NaN or infinite", "hist: null list element"],
}
GOOD = {cid: row for cid, row in ROWS.items() if cid not in BAD_REASONS}


def f32(x: float) -> float:
    """The float32 nearest x, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


# What a reader returns for each good value: floats, float32 ones as their float32 values
READ = {
    cid: {
        name: None if v is None else [f32(x) if name == "ratios" else float(x) for x in v]
        for name, v in zip(("fares", "ratios", "hist"), row)
    }
    for cid, row in GOOD.items()
}


def varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def packed(values: list[float], fmt: str) -> bytes:
    """A FloatList (d) or Float32List (f) message: nothing for no values."""
    body = struct.pack(f"<{len(values)}{fmt}", *values)
    return b"\x0a" + varint(len(body)) + body if values else b""


STORED = {
    cid: {
        name: data
        for name, data in (
            ("fares", None if fares is None else packed(fares, "d")),
            ("ratios", None if ratios is None else packed(ratios, "f")),
            ("hist", None if hist is None else snappy.compress(packed([float(x) for x in hist], "d"))),
        )
        if data is not None
    }
    for cid, (fares, ratios, hist) in GOOD.items()
}


@pytest.fixture(scope="module")
def written(spark, redis_server, pg_server, tmp_path_factory):
    """The rows written by the real job into Redis (db 9) and PostgreSQL."""
    from jobs.pipeline.run import run_source

    root = tmp_path_factory.mktemp("float_list")
    (root / "defs").mkdir()
    (root / "defs" / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (root / "defs" / "tiny.yaml").write_text(TINY_SOURCE + FEATURES)
    defs = load_definitions(root / "defs")
    spark.createDataFrame([(cid, *row, DAY) for cid, row in ROWS.items()], SCHEMA).write.format("delta").save(str(root / "tiny"))
    redis_server.client(DB).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    conf = RunConf(
        env="test", data_root=str(root), quarantine_root=str(root / "quarantine"), reports_dir=str(root / "reports"),
        definitions_dir=str(root / "defs"), sinks=["redis", "sql"],
        redis=RedisSettings(url=redis_server.url.rsplit("/", 1)[0] + f"/{DB}", password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        quality=QualityConf(max_bad_fraction=1.0, max_null_fraction=1.0, verify_sample=20, data_docs=False),
    )  # fmt: skip
    return conf, defs, run_source(spark, conf, defs, "tiny", DAY)


def test_bad_elements_are_quarantined_per_row_and_the_rest_written(spark, written):
    conf, defs, summary = written
    assert summary.status == "succeeded", summary.error
    assert summary.bad_rows == len(BAD_REASONS) and summary.entities == len(GOOD)
    quarantined = spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{DAY}'").collect()
    got = {json.loads(r["row"])["consumer_id"]: sorted(r["reasons"]) for r in quarantined}
    assert got == {cid: sorted(reasons) for cid, reasons in BAD_REASONS.items()}
    # the job's own read-back compares the stores' values with the source's, as numbers
    assert {s: (v["checked"], v["mismatches"]) for s, v in summary.verification.items()} == {
        "redis": (len(GOOD), 0),
        "sql": (len(GOOD), 0),
    }
    assert {c["name"]: c["success"] for c in summary.expectations if c["name"].endswith("is float_list")} == {
        "fares is float_list": True,
        "ratios is float_list": True,
        "hist is float_list": True,
    }
    assert {"len_min", "len_max", "len_mean"} <= set(summary.profile["fares"])


def test_both_stores_hold_the_format_raw(written, redis_server, pg_server):
    conf, defs, _ = written
    client = redis_server.client(DB)
    with pg_server.connect() as conn:
        rows = dict(conn.execute("SELECT entity_key, features::text FROM consumer_features WHERE source = 'tiny'").fetchall())
        described = conn.execute("SELECT stored_name, encoding FROM stored_names ORDER BY stored_name").fetchall()
    assert sorted(int(k.split(b":")[1]) for k in client.scan_iter(match=b"c:*")) == sorted(GOOD) == sorted(map(int, rows))
    for cid, stored in STORED.items():
        held = client.hgetall(f"c:{cid}")
        assert held == {**{field_id(n): v for n, v in stored.items()}, freshness_field("tiny"): str(AS_OF).encode()}, cid
        # the SQL row: arrays of numbers, the same values (float32 ones as float32: JSONB holds decimal digits)
        doc = json.loads(rows[str(cid)])
        assert {n: [f32(x) if n == "ratios" else float(x) for x in v] for n, v in doc.items()} == {
            n: v for n, v in READ[cid].items() if v is not None
        }, cid
    # by the float rule: a whole number as an integer ([1,0.5]), float32 in float32's shortest digits (0.1)
    assert json.loads(rows["1"]) == {"fares": [1, 0.5], "ratios": [1, 0.1], "hist": [3, -1]}
    assert [type(x) for x in json.loads(rows["1"])["fares"]] == [int, float]
    assert json.loads(rows["8"])["ratios"] == [340000000000000000000000000000000000000, -0.25]  # 3.4e+38, as JSONB prints it
    # what the stores say they hold (FORMAT.md, "The stores' description")
    assert {k: v for k, v in client.hgetall("c").items()} == {
        b"fares": b"float_list tiny",
        b"ratios": b"float_list/float32 tiny",
        b"hist": b"float_list/snappy tiny",
    }
    assert described == [("fares", "float_list"), ("hist", "float_list/snappy"), ("ratios", "float_list/float32")]


CIDS = [1, 2, 5, 7, 8, 9, 10]


def _expected(name: str) -> tuple[list, list[str]]:
    values, statuses = [], []
    for cid in CIDS:
        if cid not in READ:
            values.append(None), statuses.append("NOT_FOUND")
        elif READ[cid][name] is None:
            values.append(None), statuses.append("NULL_VALUE")
        else:
            values.append(READ[cid][name]), statuses.append("PRESENT")
    return values, statuses


def test_the_reader_returns_floats_from_both_stores(written):
    conf, defs, _ = written
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 60) as reader:
        for store in ("redis", "sql"):
            result = reader.get_online_features(["tiny"], {"consumer_id": CIDS}, store=store)
            for name in ("fares", "ratios", "hist"):
                values, statuses = _expected(name)
                assert result.column(name).statuses == statuses, (store, name)
                assert repr(result.column(name).values) == repr(values), (store, name)  # floats as floats: 1.0, not 1
            assert result.column("fares").values[0] == [1.0, 0.5]
            assert result.column("hist").values[0] == [3.0, -1.0]


def test_the_feature_servers_body_writes_floats(written):
    conf, defs, _ = written
    request = {"features": ["tiny:fares", "tiny:ratios", "tiny:hist"], "entities": {"consumer_id": [1, 2, 7]}}
    status, body = asgi_post(FeatureServer(AsyncFeatureReader(conf, defs)), json.dumps(request).encode())
    assert status == 200
    fares, ratios, hist = json.loads(body)["results"][1:]
    assert fares["values"] == [[1.0, 0.5], [-2.5, 1e-07, 3.0], None] and fares["statuses"] == ["PRESENT", "PRESENT", "NULL_VALUE"]
    assert b'"values":[[1.0,0.5],[-2.5,1e-7,3.0],null]' in body  # 1.0, as Feast's server writes a Float64 list
    assert b"[1.0,0.10000000149011612]" in body and ratios["values"][1] == []  # float32 widened, as Feast writes its Float32 lists
    assert b'"values":[[3.0,-1.0],[],null]' in body and hist["statuses"][2] == "NULL_VALUE"


def test_sql_values_read_as_floats_and_anything_else_as_bad():
    from feature_defs import FeatureDef

    plain, narrow = FeatureDef(name="v", type="float_list"), FeatureDef(name="v", type="float_list", precision="float32")
    assert repr(from_json(plain, [1, 0.5, -0, 10**20])) == repr([1.0, 0.5, 0.0, 1e20])
    assert from_json(narrow, [1, 0.1]) == [1.0, f32(0.1)] and from_json(plain, []) == []
    for value in ([1, None], [True], ["1"], [1, [2]], 1.5, "[1]", {"a": 1}, [10**400], [float("inf")], [float("nan")]):
        assert from_json(plain, value) is BAD, value
    assert from_json(narrow, [3.5e38]) is BAD and from_json(plain, [3.5e38]) == [3.5e38]


def test_the_schema_check_takes_number_arrays_only():
    from feature_defs.models import SourceDef
    from jobs.transforms import schema_problems

    entity = load_definitions(DEFAULT_DIR).entities["consumer"]
    names = ("a", "b", "c", "d", "e")
    source = SourceDef.model_validate(
        {
            "name": "t",
            "entity": "consumer",
            "location": "t",
            "layout": "wide",
            "features": [{"name": n, "type": "float_list"} for n in names],
        }
    )
    found = [T.DoubleType(), T.FloatType(), T.IntegerType(), T.StringType(), T.DecimalType(10, 2)]
    schema = T.StructType(
        [T.StructField("consumer_id", T.LongType()), T.StructField("ds", T.DateType())]
        + [T.StructField(n, T.ArrayType(t)) for n, t in zip(names, found)]
    )
    assert schema_problems(schema, source, entity) == [
        "column 'd' has type array<string>, expected float_list (array<double>)",
        "column 'e' has type array<decimal(10,2)>, expected float_list (array<double>)",
    ]
    long = SourceDef.model_validate(
        {"name": "t", "entity": "consumer", "location": "t", "layout": "long", "name_column": "n", "value_column": "v",
         "features": [{"name": "a", "type": "float_list"}]}
    )  # fmt: skip
    long_schema = T.StructType(
        [
            T.StructField(c, t)
            for c, t in (("consumer_id", T.LongType()), ("n", T.StringType()), ("v", T.DoubleType()), ("ds", T.DateType()))
        ]
    )
    assert schema_problems(long_schema, long, entity) == ["features ['a'] have list/embedding types, which a long layout cannot carry"]

"""Feast repositories as users write them, side by side with Feast beyond `feast init`: small
repositories built here (several entities, a composite key, string and int32 join keys,
`field_mapping`, a created-time tie, ttl 0 and None, every Feast scalar and array type the
import carries over, timestamp-typed features, a folder of Parquet files in two time units, a
hive-partitioned folder). Each is imported with `materialize import-feast`, written by this
project's `materialize run --incremental` (README's command) into Redis and by `feast
materialize 1990-01-01T00:00:00 NOW` (Feast 0.67, its own venv) into another
Redis database; Feast's SDK then reads Feast's store, and `materialize serve` through Feast's
remote online store: every value and every event time must be Feast's, and what the import
leaves out is listed, each object with its reason.

Where Feast itself does not give the row's value, the cell is named in FEAST_DIFFERS with
what Feast gives and why, and both sides are checked exactly. Feast 0.67 cannot read a folder
whose files mix nanosecond and microsecond times (dask: "Divisions calculation failed"), so
Feast's copy of the repository holds that folder in one unit: the same rows.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from throwaway import feast_venv

from .support.feast_reading import feast_reads, remote_client, run_as_readme_says, served_reads
from .support.serving import serve

pytestmark = pytest.mark.install  # Feast runs from a venv of its own

UTC = dt.UTC
DAY = dt.date(2026, 11, 20)  # every row's event time is on or before it; both sides load every row up to now


def at(hour: int, minute: int = 0, second: int = 0, micro: int = 0, day: int = 0) -> dt.datetime:
    return dt.datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC) + dt.timedelta(
        days=day, hours=hour, minutes=minute, seconds=second, microseconds=micro
    )


# --- the repositories ------------------------------------------------------------------------------

FLEET = """\
from datetime import timedelta

import pandas as pd
from feast import Entity, FeatureService, FeatureView, Field, FileSource, RequestSource, ValueType
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float32, Float64, Int32, Int64, String, UnixTimestamp

rider = Entity(name="rider", join_keys=["rider_id"], value_type=ValueType.STRING)
zone = Entity(name="zone", join_keys=["zone_id"], value_type=ValueType.INT32)
driver = Entity(name="driver", join_keys=["driver_id"])  # its type as Feast infers it: Int64

rider_stats = FeatureView(
    name="rider_stats",
    entities=[rider],
    ttl=None,
    schema=[Field(name="rides", dtype=Int64), Field(name="rating", dtype=Float64), Field(name="tier", dtype=String)],
    source=FileSource(name="rider_stats_files", path="data/rider_stats", timestamp_field="event_timestamp"),
)
zone_demand = FeatureView(
    name="zone_demand",
    entities=[zone],
    ttl=timedelta(0),
    schema=[Field(name="demand", dtype=Float32), Field(name="open_orders", dtype=Int32)],
    source=FileSource(name="zone_demand_days", path="data/zone_demand", timestamp_field="event_timestamp"),
)
rider_zone_trips = FeatureView(
    name="rider_zone_trips",
    entities=[rider, zone],
    ttl=timedelta(0),
    schema=[Field(name="trips", dtype=Int64), Field(name="last_fare", dtype=Float64)],
    source=FileSource(
        name="rider_zone_file",
        path="data/rider_zone_trips.parquet",
        timestamp_field="ts",
        created_timestamp_column="loaded_at",
        field_mapping={"trips_raw": "trips", "rid": "rider_id", "ts_raw": "ts"},
    ),
)
driver_shifts = FeatureView(
    name="driver_shifts",
    entities=[driver],
    schema=[Field(name="hours", dtype=Float64), Field(name="shift_start", dtype=UnixTimestamp)],
    source=FileSource(name="driver_shifts_file", path="data/driver_shifts.parquet", timestamp_field="event_timestamp"),
)
shift_history = FeatureView(
    name="shift_history", entities=[driver], online=False, schema=[Field(name="hours", dtype=Float64)], source=driver_shifts.batch_source
)

tip = RequestSource(name="tip", schema=[Field(name="tip", dtype=Float64)])


@on_demand_feature_view(sources=[rider_zone_trips, tip], schema=[Field(name="fare_with_tip", dtype=Float64)])
def fare_with_tip(inputs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"fare_with_tip": inputs["last_fare"] + inputs["tip"]})


pricing = FeatureService(name="pricing", features=[rider_zone_trips, zone_demand[["demand"]], fare_with_tip])
"""


def write_fleet(repo: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (repo / "data" / "rider_stats").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(
        "project: fleet\nregistry: data/registry.db\nprovider: local\nentity_key_serialization_version: 3\n"
    )
    (repo / "features.py").write_text(FLEET)
    # a folder of pandas's nanoseconds and Spark's microseconds: r1's newest row (with a null
    # rating and sub-seconds) is in the first, r2's in the second
    for name, unit, rows in [
        (
            "part-ns",
            "ns",
            [("r1", 3, 4.5, "gold", at(1)), ("r2", 7, 3.25, "silver", at(2)), ("r1", 4, None, "ünïcode ✓", at(9, 30, 15, 250000))],
        ),
        ("part-us", "us", [("r2", 8, 3.5, "bronze", at(5)), ("r3", 1, 5.0, None, at(3)), ("r1", 2, 1.0, "old", at(0))]),
    ]:
        rider, rides, rating, tier, event = zip(*rows)
        pq.write_table(
            pa.table({
                "rider_id": rider, "rides": pa.array(rides, pa.int64()), "rating": pa.array(rating, pa.float64()),
                "tier": pa.array(tier, pa.string()),
                "event_timestamp": pa.array(event, pa.timestamp(unit, tz="UTC")),
            }),
            repo / "data" / "rider_stats" / f"{name}.parquet",
        )  # fmt: skip
    # hive-partitioned by day; zone 1's newest row in the later folder
    for day, rows in {
        "2026-11-19": [(1, 0.1, 5, at(12, day=-1)), (2, 2.5, 0, at(13, day=-1))],
        "2026-11-20": [(1, 0.7, 9, at(6)), (3, -1.5, 2147483647, at(7))],
    }.items():
        folder = repo / "data" / "zone_demand" / f"day={day}"
        folder.mkdir(parents=True)
        zone, demand, orders, event = zip(*rows)
        pq.write_table(
            pa.table({
                "zone_id": pa.array(zone, pa.int32()), "demand": pa.array(demand, pa.float32()),
                "open_orders": pa.array(orders, pa.int32()),
                "event_timestamp": pa.array(event, pa.timestamp("us", tz="UTC")),
            }),
            folder / "part-0.parquet",
        )  # fmt: skip
    # field_mapping of a feature, a join key and the event time; (r1, 1) has two rows of one
    # event time: the later created wins
    rows = [
        ("r1", 1, 10, 12.5, at(4), at(4, 5)), ("r1", 1, 11, 13.0, at(4), at(4, 10)), ("r1", 2, 3, 7.25, at(2), at(2, 1)),
        ("r2", 1, 5, 20.0, at(8), at(8, 1)), ("r2", 1, 4, 19.0, at(1), at(1, 1)),
    ]  # fmt: skip
    rid, zone, trips, fare, ts, loaded = zip(*rows)
    pq.write_table(
        pa.table({
            "rid": rid, "zone_id": pa.array(zone, pa.int32()), "trips_raw": pa.array(trips, pa.int64()), "last_fare": fare,
            "ts_raw": pa.array(ts, pa.timestamp("us", tz="UTC")), "loaded_at": pa.array(loaded, pa.timestamp("us", tz="UTC")),
        }),
        repo / "data" / "rider_zone_trips.parquet",
    )  # fmt: skip
    pq.write_table(
        pa.table({
            "driver_id": pa.array([7, 8], pa.int64()), "hours": [7.5, 0.0],
            "shift_start": pa.array([at(6, 0, 0, 999999), None], pa.timestamp("us", tz="UTC")),
            "event_timestamp": pa.array([at(10), at(11)], pa.timestamp("us", tz="UTC")),
        }),
        repo / "data" / "driver_shifts.parquet",
    )  # fmt: skip


def fleet_for_feast(repo: Path) -> None:
    """Feast 0.67 fails on the folder of two units: its copy holds the same rows in one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = repo / "data" / "rider_stats" / "part-us.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("event_timestamp")
    pq.write_table(table.set_column(column, "event_timestamp", table.column(column).cast(pa.timestamp("ns", tz="UTC"))), path)


TYPES = """\
from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource
from feast.types import Array, Bool, Bytes, Decimal, Float32, Float64, Int32, Int64, Json, Map, Set, String, Struct, TimeUuid
from feast.types import UnixTimestamp, Uuid

item = Entity(name="item", join_keys=["item_id"])

item_scalars = FeatureView(
    name="item_scalars",
    entities=[item],
    ttl=timedelta(0),
    schema=[
        Field(name="i32", dtype=Int32),
        Field(name="i64", dtype=Int64),
        Field(name="f32", dtype=Float32),
        Field(name="f64", dtype=Float64),
        Field(name="s", dtype=String),
        Field(name="b", dtype=Bool),
        Field(name="seen_at", dtype=UnixTimestamp),
        Field(name="u", dtype=Uuid),
        Field(name="d", dtype=Decimal),
        Field(name="j", dtype=Json),
        Field(name="m", dtype=Map),
        Field(name="raw", dtype=Bytes),
    ],
    source=FileSource(name="item_scalars_file", path="data/item_scalars.parquet", timestamp_field="event_timestamp"),
)
item_arrays = FeatureView(
    name="item_arrays",
    entities=[item],
    schema=[
        Field(name="i32s", dtype=Array(Int32)),
        Field(name="i64s", dtype=Array(Int64)),
        Field(name="f32s", dtype=Array(Float32)),
        Field(name="f64s", dtype=Array(Float64)),
        Field(name="ss", dtype=Array(String)),
        Field(name="bs", dtype=Array(Bool)),
        Field(name="vec", dtype=Array(Float32), vector_length=3),
        Field(name="tags", dtype=Set(String)),
        Field(name="times", dtype=Array(UnixTimestamp)),
    ],
    source=FileSource(name="item_arrays_file", path="data/item_arrays.parquet", timestamp_field="event_timestamp"),
)
item_more = FeatureView(
    name="item_more",
    entities=[item],
    ttl=None,
    schema=[
        Field(name="tu", dtype=TimeUuid),
        Field(name="st", dtype=Struct({"a": Int64, "b": String})),
        Field(name="si", dtype=Set(Int64)),
        Field(name="sf", dtype=Set(Float64)),
        Field(name="au", dtype=Array(Uuid)),
        Field(name="ad", dtype=Array(Decimal)),
        Field(name="aj", dtype=Array(Json)),
        Field(name="nested", dtype=Array(Array(Int64))),
    ],
    source=FileSource(name="item_more_file", path="data/item_more.parquet", timestamp_field="event_timestamp"),
)
"""
BIG = 9007199254740993  # 2**53 + 1: no float64 holds it


def write_types(repo: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (repo / "data").mkdir(parents=True)
    (repo / "feature_store.yaml").write_text(
        "project: types\nregistry: data/registry.db\nprovider: local\nentity_key_serialization_version: 3\n"
    )
    (repo / "features.py").write_text(TYPES)
    items = pa.array([1, 2, 3], pa.int64())
    event = pa.array([at(1), at(2), at(3)], pa.timestamp("us", tz="UTC"))
    pq.write_table(
        pa.table({
            "item_id": items,
            "i32": pa.array([-2147483648, 0, None], pa.int32()),
            "i64": pa.array([BIG, -1, None], pa.int64()),
            "f32": pa.array([0.1, 1.0, None], pa.float32()),
            "f64": pa.array([0.1, -0.0, 1e300], pa.float64()),
            "s": pa.array(["", 'ünï ✓ "q"', None], pa.string()),
            "b": pa.array([True, False, None], pa.bool_()),
            "seen_at": pa.array(
                [at(0, 0, 0, 500000), dt.datetime(1969, 12, 31, 23, 59, 59, 500000, UTC), None], pa.timestamp("us", tz="UTC")
            ),
            "u": pa.array(["123e4567-e89b-12d3-a456-426614174000", None, "00000000-0000-0000-0000-000000000000"], pa.string()),
            "d": pa.array([Decimal("12.50"), None, Decimal("-0.001")], pa.decimal128(10, 3)),
            "j": pa.array(['{"a": [1, 2.5, null], "b": {"c": "d"}}', "[]", None], pa.string()),
            "m": pa.array(['{"k": 1}', None, "{}"], pa.string()),
            "raw": pa.array([b"\x00\x01", None, b""], pa.binary()),
            "event_timestamp": event,
        }),
        repo / "data" / "item_scalars.parquet",
    )  # fmt: skip
    pq.write_table(
        pa.table({
            "item_id": items,
            "i32s": pa.array([[1, -2], [], None], pa.list_(pa.int32())),
            "i64s": pa.array([[BIG], [0, 0], None], pa.list_(pa.int64())),
            "f32s": pa.array([[0.1, 1.0], [], None], pa.list_(pa.float32())),
            "f64s": pa.array([[1.0, 0.5], [-0.0], None], pa.list_(pa.float64())),
            "ss": pa.array([["a", "", "ü"], [], None], pa.list_(pa.string())),
            "bs": pa.array([[True, False], [], None], pa.list_(pa.bool_())),
            "vec": pa.array([[0.1, 0.2, 0.3], [1.0, 0.0, -1.0], None], pa.list_(pa.float32())),
            "tags": pa.array([["x", "y"], [], None], pa.list_(pa.string())),
            "times": pa.array([[at(1)], [], None], pa.list_(pa.timestamp("us", tz="UTC"))),
            "event_timestamp": event,
        }),
        repo / "data" / "item_arrays.parquet",
    )  # fmt: skip
    pq.write_table(
        pa.table({
            "item_id": items,
            "tu": pa.array(["d2177dd0-eaa2-11de-a572-001b779c76e3", None, "d2177dd0-eaa2-11de-a572-001b779c76e4"], pa.string()),
            "st": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "ü"}], pa.struct([("a", pa.int64()), ("b", pa.string())])),
            "si": pa.array([[3, 1], None, [BIG]], pa.list_(pa.int64())),
            "sf": pa.array([[0.5, 1.0], [], None], pa.list_(pa.float64())),
            "au": pa.array([["123e4567-e89b-12d3-a456-426614174000"], [], None], pa.list_(pa.string())),
            "ad": pa.array([[Decimal("1.50"), Decimal("-0.0000001")], None, [Decimal("0")]], pa.list_(pa.decimal128(12, 8))),
            "aj": pa.array([['{"x": 1}', "[2]"], None, ['"s"']], pa.list_(pa.string())),
            "nested": pa.array([[[1, 2], [3]], None, [[]]], pa.list_(pa.list_(pa.int64()))),
            "event_timestamp": event,
        }),
        repo / "data" / "item_more.parquet",
    )  # fmt: skip


@dataclass(frozen=True)
class Repository:
    write: object
    for_feast: object
    reads: list[dict]
    """Feast's get_online_features requests: one per set of join keys."""
    left_out: dict[str, str]
    """Each object the import leaves out -> what its reason says."""
    float32: frozenset[str] = frozenset()
    timestamps: frozenset[str] = frozenset()
    sets: frozenset[str] = frozenset()
    remote_reads: list[dict] | None = None
    """What Feast's remote client can type (default: ``reads``): Feast 0.67's cannot type an
    empty array, nor one holding null or values of mixed types, whatever server sends it."""
    feast_differs: tuple = ()
    """(feature, row, Feast's value, the row's value, why): a cell where Feast does not give the row's value."""


REPOSITORIES = {
    "fleet": Repository(
        write=write_fleet,
        for_feast=fleet_for_feast,
        reads=[
            {
                "features": ["rider_stats:rides", "rider_stats:rating", "rider_stats:tier"],
                "entity_rows": [{"rider_id": r} for r in ("r1", "r2", "r3", "r9")],
            },
            {"features": ["zone_demand:demand", "zone_demand:open_orders"], "entity_rows": [{"zone_id": z} for z in (1, 2, 3, 9)]},
            {
                "features": ["rider_zone_trips:trips", "rider_zone_trips:last_fare"],
                "entity_rows": [{"rider_id": r, "zone_id": z} for r, z in (("r1", 1), ("r1", 2), ("r2", 1), ("r2", 2))],
            },
            {"features": ["driver_shifts:hours", "driver_shifts:shift_start"], "entity_rows": [{"driver_id": d} for d in (7, 8, 9)]},
        ],
        left_out={
            "feature view shift_history": "online=False",
            "on-demand feature view fare_with_tip": "request time",
            "request source tip": "request",
            "feature service pricing: reference fare_with_tip:fare_with_tip": "on-demand feature view",
        },
        float32=frozenset({"zone_demand__demand"}),
        timestamps=frozenset({"driver_shifts__shift_start"}),
    ),
    "types": Repository(
        write=write_types,
        for_feast=lambda repo: None,
        reads=[
            {
                "features": [f"item_scalars:{f}" for f in ("i32", "i64", "f32", "f64", "s", "b", "seen_at", "u", "d", "j", "m")]
                + [f"item_arrays:{f}" for f in ("i32s", "i64s", "f32s", "f64s", "ss", "bs", "vec", "tags")],
                "entity_rows": [{"item_id": i} for i in (1, 2, 3, 4)],
            },
            {
                "features": [f"item_more:{f}" for f in ("tu", "st", "si", "sf", "au", "ad", "aj", "nested")],
                "entity_rows": [{"item_id": i} for i in (1, 2, 3, 4)],
            },
        ],
        left_out={
            "feature item_scalars:raw (Bytes)": "no type here holds raw bytes",
            "feature item_arrays:times (Array(UnixTimestamp))": "no list type here holds timestamps",
        },
        float32=frozenset({"item_scalars__f32", "item_arrays__f32s", "item_arrays__vec"}),
        timestamps=frozenset({"item_scalars__seen_at"}),
        sets=frozenset({"item_arrays__tags", "item_more__si", "item_more__sf"}),
        remote_reads=[
            {
                "features": [f"item_scalars:{f}" for f in ("i32", "i64", "f32", "f64", "s", "b", "seen_at", "u", "d")],
                "entity_rows": [{"item_id": i} for i in (1, 2, 3, 4)],
            }
        ],
        feast_differs=(
            # Feast's materialization goes through pandas, where a nullable int64 column is float64
            ("item_scalars__i64", 0, BIG - 1, BIG, "Feast reads a nullable Int64 column through a float64"),
            ("item_more__nested", 2, [None], [[]], "Feast reads an empty inner array as None"),
        ),
    ),
}


# --- both sides ------------------------------------------------------------------------------------


def feast(repo: Path, *args: str) -> str:
    done = subprocess.run([str(feast_venv.feast()), *args], cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"feast {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


@dataclass
class SideBySide:
    repository: Repository
    feast_repo: Path
    left_out: list[str]
    server: object


FEAST_DB, OUR_DB = 13, 14


@pytest.fixture(scope="module", params=sorted(REPOSITORIES))
def side_by_side(request, tmp_path_factory, spark, redis_server):
    from feature_defs.feast_import import import_feast

    repository = REPOSITORIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    repo = root / "repo"
    repository.write(repo)

    defs_dir = root / "defs"
    done = import_feast(repo, defs_dir, str(feast_venv.python()))
    redis_server.client(OUR_DB).flushdb()
    base = redis_server.url.rsplit("/", 1)[0]
    url = f"{base}/{OUR_DB}"
    run_as_readme_says(root, defs_dir, url, "quality:\n  expectations: false\n")

    # Feast: a copy of the repository, its online store a Redis database of its own
    feast_repo = root / "feast-repo"
    shutil.copytree(repo, feast_repo)
    repository.for_feast(feast_repo)
    redis_server.client(FEAST_DB).flushdb()
    port = base.rsplit(":", 1)[1]
    with (feast_repo / "feature_store.yaml").open("a") as settings:
        settings.write(f'online_store:\n    type: redis\n    connection_string: "127.0.0.1:{port},db={FEAST_DB}"\n')
    feast(feast_repo, "apply")
    feast(feast_repo, "materialize", "1990-01-01T00:00:00", dt.datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"))

    settings = {
        "definitions_dir": str(defs_dir),
        "sinks": ["redis"],
        "redis": {"url": url, "password_env": None, "mode": "standalone"},
    }
    server = serve(root / "serve", "t", settings)
    yield SideBySide(repository, feast_repo, done.plan.left_out, server)
    server.stop()


def as_compared(name: str, values: list, repository: Repository) -> list:
    """Float32 features as float32 (Feast's store hands back the float64 of the float32, the format
    stores the float32's shortest text); times as epoch seconds (Feast's SDK reads its own
    store's as times, its feature server answers epoch seconds, as ours); sets sorted."""
    if name in repository.timestamps:
        return [v if v is None or isinstance(v, int) else int(dt.datetime.fromisoformat(v).timestamp()) for v in values]
    if name in repository.sets:
        return [None if v is None else sorted(v) for v in values]
    if name not in repository.float32:
        return values

    def f32(v):
        return None if v is None else [f32(x) for x in v] if isinstance(v, list) else float(np.float32(v))

    return [f32(v) for v in values]


def feature_names(read: dict) -> list[str]:
    return [ref.replace(":", "__") for ref in read["features"]]


def compare(repository: Repository, reads: list[dict], from_feast: list[dict], from_ours: list[dict]) -> dict:
    """Each feature's values that differ (none: all the same), with Feast's known differences
    checked and set right first; the last entity of each read has no row on either side."""
    differs = {(name, row): (feasts_value, value, why) for name, row, feasts_value, value, why in repository.feast_differs}
    mismatched, compared = {}, 0
    for read, feasts, ours in zip(reads, from_feast, from_ours, strict=True):
        for name in feature_names(read):
            feast_values, our_values = list(feasts[name]), ours[name]
            for (feature, row), (feasts_value, value, why) in differs.items():
                if feature == name:  # Feast's own value; ours must be the row's
                    assert feast_values[row] == feasts_value, why
                    feast_values[row] = value
            assert feast_values[-1] is None and our_values[-1] is None, name
            if as_compared(name, our_values, repository) != as_compared(name, feast_values, repository):
                mismatched[name] = {"ours": our_values, "feast": feast_values}
            compared += len(our_values)
    assert compared == sum(len(feature_names(r)) * len(r["entity_rows"]) for r in reads)
    return mismatched


def test_values_event_times_and_statuses_are_feasts(side_by_side):
    repository = side_by_side.repository
    from_feast = feast_reads(side_by_side.feast_repo, repository.reads)
    from_ours = served_reads(side_by_side.server, repository.reads)
    assert compare(repository, repository.reads, from_feast, from_ours) == {}
    for read, feasts, ours in zip(repository.reads, from_feast, from_ours, strict=True):
        for name in feature_names(read):
            assert ours[f"{name}__ts"][:-1] == feasts[f"{name}__ts"][:-1], name
            present = ["NULL_VALUE" if v is None else "PRESENT" for v in feasts[name][:-1]]
            assert ours[f"{name}__status"] == [*present, "NOT_FOUND"], name  # Feast's Redis store says PRESENT with None


def test_feasts_remote_client_reads_from_materialize_serve_what_feast_reads_from_its_store(side_by_side, tmp_path):
    repository = side_by_side.repository
    reads = repository.remote_reads or repository.reads
    from_feast = feast_reads(side_by_side.feast_repo, reads)
    from_ours = feast_reads(remote_client(side_by_side.feast_repo, side_by_side.server.port, tmp_path / "client"), reads)
    for read, feasts, ours in zip(reads, from_feast, from_ours, strict=True):
        keys = read["entity_rows"][0].keys()
        assert {k: ours[k] for k in keys} == {k: feasts[k] for k in keys}
    assert compare(repository, reads, from_feast, from_ours) == {}


def test_what_the_import_leaves_out_is_listed_with_its_reason(side_by_side):
    expected = side_by_side.repository.left_out
    assert len(side_by_side.left_out) == len(expected), side_by_side.left_out
    for what, reason in expected.items():
        (line,) = [line for line in side_by_side.left_out if line.startswith(what + ": ")]
        assert reason in line[len(what) + 2 :], line

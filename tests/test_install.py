"""The installs each kind of user makes (pyproject's extras, README "Installing"): the wheel
holds the product and nothing else; its [server] extra resolves without Spark, Airflow or
Arrow; a fresh venv of that extra alone serves the values the full install reads, from the
suite's Redis and PostgreSQL, within 150 MiB; a command whose extra is missing says which
to install in one line. The venv tests (marker ``install``, out of `make test-fast`) build
the wheel and install it offline from `.run/wheelhouse`, which a first run downloads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pytest

from feature_defs import load_definitions
from fm_config import RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from serializers.batch import FeatureSpec
from serializers.json_map import encode_json_maps
from sinks.partition import write_partition
from sinks.redis.config import redis_sink_config
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema
from sinks.sql.writer import SqlWritePlan
from stores.sql import connect
from throwaway.venvs import (
    GOAL_MIB,
    MIB,
    PRODUCT_PACKAGES,
    ROOT,
    SPARK_ONLY,
    build_wheel,
    clean_env,
    disk_usage,
    fill_wheelhouse,
    make_venv,
    resolve,
)

from .support.confs import env_conf
from .support.every_type import BIG, DAY, ENTITIES, EVERY_TYPE, ROWS
from .support.serving import MATERIALIZE, Served, start_serving

SPARK_MODULES = ("pyspark", "py4j", "delta", "great_expectations", "pandas", "pyarrow", "tqdm")
SERVER_MODULES = ("uvicorn", "uvloop", "httptools", "prometheus_client")
REQUEST = {"features": ["every_type:f", "every_type:f32", "every_type:n", "every_type:b",
                        "every_type:s", "every_type:e", "every_type:il", "every_type:sl"],
           "entities": {"consumer_id": [1, 2, 3, 4, 5]}}  # fmt: skip


# ---- a command whose extra is not installed: one line, exit 2 (no venv needed) ----------


def _without(modules, *argv: str) -> subprocess.CompletedProcess:
    """``materialize ARGV`` in a Python where importing ``modules`` fails as when they are not installed."""
    code = f"import sys; sys.modules.update(dict.fromkeys({list(modules)!r})); from jobs.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=120
    )


@pytest.mark.parametrize(
    "argv, modules, extra",
    [
        (
            ["run", "--env", "local", "--date", "2026-11-20"],
            SPARK_MODULES,
            "Spark extra (pyspark is not installed): pip install 'feature-materializer[spark]'",
        ),
        (
            ["backfill", "--env", "local", "--source", "consumer_daily", "--start", "2026-11-19", "--end", "2026-11-20"],
            SPARK_MODULES,
            "[spark]",
        ),
        (["validate", "--env", "local", "--date", "2026-11-20"], SPARK_MODULES, "[spark]"),
        (["sample-data", "--env", "local"], ["pyspark"], "[spark]"),
        # the expectations' check imports great-expectations (no Spark started for defs)
        (["defs", "--env", "local"], ["great_expectations"], "Spark extra (great_expectations is not installed)"),
        (
            ["serve", "--env", "local"],
            SERVER_MODULES,
            "feature server extra (prometheus_client is not installed): pip install 'feature-materializer[server]'",
        ),
        (["serve", "--env", "local"], ["uvicorn"], "[server]"),
    ],
)
def test_a_command_without_its_extra_exits_2_with_one_line_naming_it(argv, modules, extra):
    done = _without(modules, *argv)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"materialize {argv[0]} needs the ") and extra in done.stderr


def test_doctor_without_the_spark_extra_says_which_checks_need_it(tmp_path):
    folder = env_conf(
        tmp_path / "conf",
        "t",
        json.dumps({"data_root": str(tmp_path), "sinks": ["redis"], "redis": {"url": "redis://127.0.0.1:1/0", "password_env": None}}),
    )
    code = (
        f"import os, sys; os.environ['FM_CONF_DIR'] = {str(folder)!r}; "
        f"sys.modules.update(dict.fromkeys({list(SPARK_MODULES)!r})); from jobs.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "doctor", "--env", "t", "--source", "consumer_daily"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FAIL  source consumer_daily"))
    assert lines[at].endswith("could not check: pyspark is not installed")
    assert lines[at + 1].strip() == "fix: pip install 'feature-materializer[spark]' (the Spark extra)"


def test_a_missing_module_of_no_extra_keeps_its_traceback():
    """Only the extras' modules are answered so: a broken install of a base package is not hidden."""
    done = _without(["hiredis"], "get", "--env", "local")
    assert done.returncode == 1 and "Traceback" in done.stderr and "ModuleNotFoundError" in done.stderr


# ---- the wheel and what its extras resolve to ------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheelhouse(wheel) -> Path:
    return fill_wheelhouse(wheel, "server")


@pytest.mark.install
def test_the_wheel_holds_the_product_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    # no bench/, tests/ or development package beside the product's
    assert {n.split("/")[0] for n in names} == {*PRODUCT_PACKAGES, dist_info}
    for yaml in (ROOT / "feature_defs").glob("*.yaml"):
        assert f"feature_defs/{yaml.name}" in names
    for module in (
        "feature_reader/reader.py",
        "feature_reader/server.py",
        "serializers/features.proto",
        "serializers/features_pb2.py",
        "jobs/cli/__init__.py",
        "sinks/redis/writer.py",
    ):
        assert module in names
    assert "materialize = jobs.cli:main" in entry_points
    base = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert base and not [
        line for line in base if any(heavy in line.lower() for heavy in ("pyspark", "delta", "great", "pandas", "pyarrow", "uvicorn"))
    ]


@pytest.mark.install
def test_the_server_extra_resolves_without_spark_airflow_or_arrow(wheel, wheelhouse):
    """``pip install --dry-run --report`` of the wheel into an empty venv, resolved offline
    against the wheelhouse (which `pip wheel` filled from the index, at constraints.txt's pins)."""
    server, base = resolve(wheel, "server", wheelhouse), resolve(wheel, "", wheelhouse)
    for installed in (server, base):
        assert not set(SPARK_ONLY) & set(installed) and not [n for n in installed if n.startswith(("apache-airflow", "pyspark"))], installed
        assert {"feature-materializer", "numpy", "redis", "hiredis", "psycopg", "psycopg-binary", "pydantic", "protobuf", "orjson"} <= set(
            installed
        )
    assert {"uvicorn", "uvloop", "httptools", "prometheus-client"} <= set(server)
    assert not {"uvicorn", "uvloop", "httptools", "prometheus-client"} & set(base)


# ---- a venv of the [server] extra alone, serving the suite's stores ----------------------


@pytest.fixture(scope="module")
def server_venv(wheel, wheelhouse, tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("server-venv") / "venv", wheel, "server", wheelhouse)


def _batch(rows) -> pa.RecordBatch:
    """test_reader's every_type rows as the job hands them to its writers (``_id``: the entity id)."""
    columns = list(zip(*rows))
    types = [
        pa.float64(),
        pa.float64(),
        pa.int64(),
        pa.bool_(),
        pa.string(),
        pa.list_(pa.float32()),
        pa.list_(pa.int64()),
        pa.list_(pa.string()),
    ]
    names = ["f", "f32", "n", "b", "s", "e", "il", "sl"]
    arrays = [pa.array([str(i) for i in columns[0]])] + [pa.array(list(values), t) for values, t in zip(columns[1:9], types)]
    return pa.RecordBatch.from_arrays(arrays, ["_id", *names])


@pytest.fixture(scope="module")
def seeded(redis_server, pg_server, tmp_path_factory):
    """every_type written by the full install's writers (the partition function Spark runs):
    consumers 1-3 to Redis (db 8) and PostgreSQL, consumer 5 (row 1's values) to PostgreSQL only."""
    root = tmp_path_factory.mktemp("installed")
    (root / "defs").mkdir()
    (root / "defs" / "entities.yaml").write_text(ENTITIES)
    (root / "defs" / "every_type.yaml").write_text(EVERY_TYPE)
    defs = load_definitions(root / "defs")
    redis_url = redis_server.url.rsplit("/", 1)[0] + "/8"
    redis_server.client(8).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    conf = RunConf(env="t", definitions_dir=str(root / "defs"), sinks=["redis", "sql"],
                   redis=RedisSettings(url=redis_url, password_env=None, mode="standalone"),
                   sql=SqlSettings(dsn=pg_server.dsn, password_env=None), reader=ReaderSettings(timeout_ms=5000))  # fmt: skip
    source = defs.sources["every_type"]
    entity = defs.entity_of(source)
    specs = tuple(FeatureSpec(f.name, f.type, f.options) for f in source.features)
    batch = _batch(ROWS)
    stats = list(write_partition(RedisWritePlan(sink=redis_sink_config(conf, source, entity, DAY), features=specs), iter([batch])))
    sql_rows = _batch([*ROWS, (5, *ROWS[0][1:])])
    docs, non_finite = encode_json_maps(sql_rows, specs)
    sql_sink = sql_sink_config(conf, source, entity, DAY)
    with connect(sql_sink) as conn:
        ensure_schema(conn, sql_sink)
    sql_batch = pa.RecordBatch.from_pydict(
        {"_id": sql_rows.column("_id"), "_features_json": docs, "_non_finite": pa.array(non_finite, pa.int64())}
    )
    stats += list(write_partition(SqlWritePlan(sink=sql_sink), iter([sql_batch])))
    assert [s.to_pylist()[0]["error"] for s in stats] == [None, None]
    settings = {"definitions_dir": str(root / "defs"), "sinks": ["redis", "sql"],
                "redis": {"url": redis_url, "password_env": None, "mode": "standalone"},
                "sql": {"dsn": pg_server.dsn, "password_env": None}, "reader": {"timeout_ms": 5000}}  # fmt: skip
    return env_conf(root / "conf", "t", json.dumps(settings))


def _serve(venv: Path, conf_dir: Path, log: Path) -> Served:
    """The venv's own ``materialize serve`` (no checkout on its path), once /health answers."""
    environ = {**clean_env(), "FM_CONF_DIR": str(conf_dir)}
    return start_serving([str(venv / "bin" / "materialize"), "serve", "--env", "t"], environ, log, cwd=log.parent)


@pytest.mark.install
def test_a_venv_of_the_server_extra_serves_what_the_full_install_reads(server_venv, seeded, tmp_path):
    served = _serve(server_venv, seeded, tmp_path / "serve.log")
    try:
        status, body = served.post(REQUEST)
        (tmp_path / "request.json").write_text(json.dumps(REQUEST))
        full = subprocess.run([MATERIALIZE, "get", "--env", "t", "--request", str(tmp_path / "request.json")],
                              capture_output=True, timeout=120,
                              env={**os.environ, "FM_CONF_DIR": str(seeded)})  # fmt: skip
        assert full.returncode == 0, full.stderr.decode()[-2000:]
        # the server of the small install answers byte for byte what the full install's reader reads
        assert status == 200 and body + b"\n" == full.stdout
        results = json.loads(body)["results"]
        names = json.loads(body)["metadata"]["feature_names"]
        col = dict(zip(names, results))
        assert col["consumer_id"]["values"] == [1, 2, 3, 4, 5]
        assert col["n"]["values"] == [BIG, None, -5, None, BIG] and col["n"]["statuses"] == [
            "PRESENT",
            "NULL_VALUE",
            "PRESENT",
            "NOT_FOUND",
            "PRESENT",
        ]
        assert col["s"]["values"] == ["café", None, "", None, "café"]
        assert col["e"]["values"][0] == col["e"]["values"][4] == [0.5, -1.25, 3.0, 0.10000000149011612]
        assert col["sl"]["values"] == [["a", "日本"], [], None, None, ["a", "日本"]]
        # the venv's own answer to a small request too (its reader read consumer 5 from PostgreSQL: Redis has no c:5)
        status, small = served.post({"features": ["every_type:il"], "entities": {"consumer_id": [5]}})
        assert status == 200 and json.loads(small)["results"][1]["values"] == [[1, 2**62]]
    finally:
        assert served.stop() == -signal.SIGTERM, (tmp_path / "serve.log").read_text()


@pytest.mark.install
def test_the_server_venv_has_no_spark_fits_the_goal_and_names_the_extra_for_the_job(server_venv, seeded, tmp_path):
    probe = (
        "import importlib.util as u; "
        "print(sorted(m for m in ('pyspark', 'delta', 'great_expectations', 'pandas', 'pyarrow', 'airflow', 'tqdm') if u.find_spec(m)))"
    )
    found = subprocess.run(
        [str(server_venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=60
    )
    assert found.returncode == 0 and found.stdout.strip() == "[]", found.stderr
    failed = subprocess.run(
        [str(server_venv / "bin" / "python"), "-c", "import pyspark"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert failed.returncode == 1 and "ModuleNotFoundError: No module named 'pyspark'" in failed.stderr
    # the job where it is not installed: one line naming the extra
    run = subprocess.run([str(server_venv / "bin" / "materialize"), "run", "--env", "t", "--date", DAY.isoformat()],
                         capture_output=True, text=True,
                         env={**clean_env(), "FM_CONF_DIR": str(seeded)}, cwd=tmp_path, timeout=60)  # fmt: skip
    assert run.returncode == 2 and run.stdout == "", run.stderr
    assert run.stderr == "materialize run needs the Spark extra (pyspark is not installed): pip install 'feature-materializer[spark]'\n"
    # its installed size (bench/install_size.py records it beside the development venv's)
    assert disk_usage(server_venv) <= GOAL_MIB * MIB, f"{disk_usage(server_venv) / MIB:.1f} MiB"

"""The benchmark's data shape and its verdicts (the measurements themselves run in `make bench`)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from bench.runner import FEAST_VALUES_PER_S, _targets
from bench.standard import DIMENSION, FLOATS, INTS, LIST_LEN, VALUES_PER_ENTITY, VOCABULARY, standard_frame


def significant_digits(value: float) -> int:
    return len(Decimal(repr(value)).normalize().as_tuple().digits)


def test_standard_shape(spark):
    rows = standard_frame(spark, 4000).toPandas()
    assert len(rows) == 4000 and rows["entity_id"].is_unique
    floats = rows[[f"f{j:02d}" for j in range(FLOATS)]].to_numpy().ravel()
    assert 0.57 <= (floats == 0).mean() <= 0.63
    digits = {significant_digits(float(v)) for v in floats[floats != 0]}
    assert digits <= {1, 2, 3, 4} and {2, 3, 4} <= digits  # 2-4, and 1 where rounding drops a trailing zero
    assert all(rows[f"n{j}"].between(0, 2_000_000).all() for j in range(INTS))
    assert rows["recent_ids"].map(len).eq(LIST_LEN).all()
    assert {v for ids in rows["recent_ids"] for v in ids} <= set(range(1, VOCABULARY + 1))
    assert rows["embedding"].map(len).eq(DIMENSION).all()
    assert VALUES_PER_ENTITY == FLOATS + INTS + 2 == 50


def test_targets_are_ratios_within_the_run():
    first = {
        "entities": 100_000,
        "values": 5_000_000,
        "redis_values_per_s": 1_200_000,
        "redis_bytes_per_value": 16.4,
        "redis_write_seconds": 4.0,
        "jvm_peak_rss": 1000,
        "worker_peak_rss": 300,
        "sql_rows_per_s": 30_000,
        "sql_baselines": {"sql_raw_2_rows_per_s": 40_000, "sql_raw_rows_per_s": 25_000},
        "baselines": {"ceiling_values_per_s": 2_000_000, "encode_values_per_s": 9e6},
    }
    large = {**first, "entities": 1_000_000, "values": 50_000_000, "redis_write_seconds": 60.0, "jvm_peak_rss": 1200}
    large |= {"redis_values_per_s": 900_000, "redis_bytes_per_value": 16.6}
    del large["sql_baselines"]
    verdicts = {t["target"]: (t["measured"], t["ok"]) for t in _targets([first, large])}
    assert verdicts["Redis path / server ceiling at 100,000 entities (shown)"] == (0.6, True)
    assert verdicts["Redis path / server ceiling at 1,000,000 entities"] == (0.45, False)
    assert verdicts["Redis path / Feast (74k values/s) at 1,000,000 entities"] == (round(900_000 / FEAST_VALUES_PER_S, 3), False)
    assert verdicts["Redis bytes per value (listpack 256) at 100,000 entities"] == (16.4, True)
    assert verdicts["Redis bytes per value (listpack 256) at 1,000,000 entities"] == (16.6, False)
    assert verdicts["SQL path (2 partitions) / raw psycopg upserts (2 processes) at 100,000 entities"] == (0.75, False)
    assert verdicts["peak executor RSS, 1,000,000 / 100,000 entities"] == (round(1500 / 1300, 3), True)
    assert verdicts["write time per value, 1,000,000 / 100,000 entities"] == (1.5, True)


def test_bench_refuses_bad_sizes_before_starting_anything(capsys):
    from bench.__main__ import EXIT_USAGE, main

    assert main(["--entities", "100000,abc"]) == EXIT_USAGE
    assert main(["--entities", "10"]) == EXIT_USAGE
    assert "at least 1000" in capsys.readouterr().err


def test_the_installed_job_never_imports_bench(capsys):
    """bench/ and throwaway/ are development tooling, outside the wheel: `materialize bench` is no command."""
    import subprocess
    import sys

    from jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["bench", "--entities", "100000"])
    assert exited.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err
    # importing every product module loads no bench or throwaway module
    code = ("import sys, pkgutil, importlib\n"
            "for pkg in ('fm_config', 'stores', 'jobs', 'feature_defs', 'feature_reader', 'serializers', 'sinks'):\n"
            "    for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('bench', 'throwaway')))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_wheel_holds_every_product_package_and_no_development_tooling():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = sorted(
        ".".join(p.parent.relative_to(root).parts)
        for top in {name.split(".")[0] for name in listed}
        for p in (root / top).rglob("__init__.py")
    )
    assert sorted(listed) == found
    assert not any(name.split(".")[0] in ("bench", "throwaway", "tests") for name in listed)


def test_the_suite_does_not_depend_on_the_benchmarks():
    """The tests start their servers with throwaway/; only this module, which tests bench/, imports it,
    and test_soak.py, which runs the soak's harness (bench/soak) in short."""
    import ast
    from pathlib import Path

    importing = []
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(name.split(".")[0] == "bench" for name in names):
                importing.append(path.name)
    assert sorted(set(importing)) == ["test_bench.py", "test_soak.py"]


def test_read_targets_are_judged_on_ratios_within_the_run():
    from bench.reads import targets

    run = {"batches": {1: {"ours": 100, "ceiling": 200}, 100: {"ours": 900, "ceiling": 1000}, 1000: {"ours": 850, "ceiling": 1000}},
           "decode_ns_per_value": 151, "latency_miss": {"p99_us": 240.0}, "latency_raw": {"p99_us": 100.0}, "latency_hit": {"p99_us": 16.0},
           "stampede": {"redis, 64 clients": {"single-flight on": {"p99_us": 10.0, "reads_per_key_per_expiry": 0.9},
                                              "single-flight off": {"p99_us": 100.0, "reads_per_key_per_expiry": 3.0}}},
           "feast": {"1": 10.0, "100": 40.0, "1000": 40.0}}  # fmt: skip
    verdicts = [(t["measured"], t["met"]) for t in targets(run)]
    assert verdicts == [
        (0.85, True),
        (151, False),
        (240.0, True),
        (16.0, False),
        (0.1, True),
        (0.9, True),
        (10.0, False),
        (22.5, True),
        (21.25, True),
    ]


def test_feast_example_is_scaled_with_its_schema_and_each_drivers_latest_hours(tmp_path):
    import pandas as pd
    import pyarrow.parquet as pq

    from bench.feast_example import scale

    last = pd.Timestamp("2026-11-27 08:00", tz="UTC")
    example = pd.DataFrame({
        "event_timestamp": pd.to_datetime([last - pd.Timedelta(hours=h) for h in range(4)]).astype("datetime64[ns, UTC]"),
        "driver_id": [1001, 1002, 1001, 1002], "conv_rate": [0.1, 0.2, 0.3, 0.4],
        "created": pd.Timestamp("2026-11-27 09:00"), "driver_profile": [{"name": f"d{i}", "age": str(30 + i)} for i in range(4)],
    })  # fmt: skip
    path = tmp_path / "driver_stats.parquet"
    example.to_parquet(path)
    schema = pq.read_schema(path)

    written = scale(path, entities=5, rows_per_entity=3)
    scaled = pq.read_table(path)
    assert scaled.schema == schema and scaled.schema.metadata == schema.metadata  # nanoseconds, UTC, struct: as pandas wrote them
    assert written["rows"] == scaled.num_rows == 15 and written["example_rows"] == 4
    assert written["last_event_time"] == "2026-11-27T08:00:00+00:00"
    rows = scaled.to_pylist()
    stamps = {}
    for r in rows:
        stamps.setdefault(r["driver_id"], []).append(r["event_timestamp"])
    hours = [last - pd.Timedelta(hours=h) for h in range(3)]
    assert stamps == {d: hours for d in range(1001, 1006)}  # each driver's 3 latest hours, newest first
    originals = {(r["conv_rate"], r["driver_profile"]["name"]) for r in example.to_dict("records")}
    assert {(r["conv_rate"], r["driver_profile"]["name"]) for r in rows} <= originals  # values of the example's rows

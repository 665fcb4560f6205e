"""The product's imports run one way: every import of every module (module level or inside a
function, read from the source) forms a graph with no cycle, and no package imports one
above it. The read side and the configuration load without Spark or Arrow."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = ["serializers", "feature_defs", "fm_config", "stores", "sinks", "feature_reader", "feature_push", "jobs"]
"""Bottom first: a package may import those before it, never one after it. The writers and
the readers stand side by side: neither imports the other."""
SIDE_BY_SIDE = {("sinks", "feature_reader"), ("feature_reader", "sinks")}

HEAVY = ("pyspark", "delta", "great_expectations", "airflow", "pandas", "pyarrow", "py4j", "scipy")
"""What a model service or the feature server must not need (the [spark] extra)."""


def product_modules() -> dict[str, Path]:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted({p.split(".")[0] for p in packages}) == sorted(LAYERS), "a new top-level package needs its place in LAYERS"
    mods = {}
    for package in packages:
        folder = ROOT / package.replace(".", "/")
        for path in folder.glob("*.py"):
            mods[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the product modules it imports. ``from pkg import name`` is an edge to
    ``pkg.name`` when that is a module, else to ``pkg`` (its __init__)."""

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods] + ([node.module] if any(t not in mods for t in subs) else [])
            else:
                continue
            edges[module] |= {t for t in map(owner, targets) if t and t != module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_product_has_no_import_cycle():
    edges = import_graph(product_modules())
    assert sum(map(len, edges.values())) > 100  # the walk saw the product's imports
    assert cycles(edges) == []


def upward(edges: dict[str, set[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        for target in targets
        if (a := module.split(".")[0]) != (b := target.split(".")[0]) and (rank[b] > rank[a] or (a, b) in SIDE_BY_SIDE)
    )


def test_no_package_imports_one_above_it():
    assert upward(import_graph(product_modules())) == []


JOBS_LAYERS = {
    "jobs.pipeline": 1,
    "jobs.operations.ledger": 2,
    "jobs.operations": 3,
    "jobs.run_metrics": 3,
    "jobs.cli": 4,
    **dict.fromkeys(("jobs.materialize", "jobs.class_archive", "jobs.airflow_tasks", "jobs.airflow_support"), 5),
}
"""Inside jobs/, bottom first: its shared modules (every jobs/*.py not named here: transforms,
spark, event time, SQL text, errors, ...: 0), the pipeline's stages, the ledger, the other
operations (doctor, cleanup, backfill) and the run's metrics, the command line, the entry
points that start it (the console script, Airflow's tasks, the class archive's job)."""


def jobs_layer(module: str) -> int:
    """The longest prefix of ``module`` in JOBS_LAYERS decides (jobs.operations.ledger.lease: 2)."""
    found = [p for p in JOBS_LAYERS if module == p or module.startswith(p + ".")]
    return JOBS_LAYERS[max(found, key=len)] if found else 0


def upward_in_jobs(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        if module.startswith("jobs.")
        for target in targets
        if target.startswith("jobs.") and jobs_layer(target) > jobs_layer(module)
    )


def test_no_module_in_jobs_imports_one_above_it():
    assert upward_in_jobs(import_graph(product_modules())) == []


def test_the_checks_find_a_cycle_and_an_upward_edge():
    # the checks above on graphs that have both: they are not vacuous
    assert cycles({"jobs.x": {"jobs.y"}, "jobs.y": {"jobs.z"}, "jobs.z": {"jobs.x"}, "sinks": set()}) == [["jobs.x", "jobs.y", "jobs.z"]]
    assert upward({"fm_config.run": {"sinks.redis.config"}, "feature_reader.reader": {"sinks", "stores"}, "jobs": {"fm_config"}}) == [
        "feature_reader.reader imports sinks",
        "fm_config.run imports sinks.redis.config",
    ]
    assert upward_in_jobs({"jobs.transforms": {"jobs.pipeline.read"}, "jobs.operations.ledger.lease": {"jobs.operations.backfill"},
                           "jobs.cli.run": {"jobs.operations.ledger.events"}}) == [
        "jobs.operations.ledger.lease imports jobs.operations.backfill",
        "jobs.transforms imports jobs.pipeline.read",
    ]  # fmt: skip
    edges = import_graph(product_modules())  # the walk sees module-level and in-function imports
    assert {"fm_config", "stores.redis"} <= edges["feature_reader.reader"] and "stores.redis" in edges["sinks.redis.node"]
    assert "jobs.pipeline.run" in edges["jobs.cli.common"]  # imported inside a function there


def test_configuration_and_read_side_import_nothing_heavy():
    # in a fresh interpreter, as a model service or the feature server starts
    code = (
        "import sys, feature_reader, feature_reader.server, fm_config, stores.redis, stores.sql\n"
        "from feature_reader import FeatureReader\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
    # and nowhere in their source, not even inside a function
    mods = product_modules()
    for module, path in mods.items():
        if module.split(".")[0] in ("fm_config", "stores", "feature_reader"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module
                    else []
                )
                # the one exception: the driver's report files (Files) go through pyarrow's filesystems, imported when used
                heavy = [n for n in names if n.split(".")[0] in HEAVY and not (module == "fm_config.locations" and n == "pyarrow")]
                assert not heavy, f"{module} imports {heavy}"


def test_test_modules_take_shared_helpers_from_support_not_from_conftest():
    """conftest.py holds fixtures; what tests share is in tests/support/ (redis-py's tests/helpers.py)."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "conftest":
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def imported_test_modules(node: ast.AST, package: str) -> set[str]:
    """The test modules (``tests.test_x``) an import statement in ``package`` names, relative or not."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        parts = package.split(".")
        base = parts[: len(parts) + 1 - node.level] if node.level else []
        module = ".".join([*base, *filter(None, [node.module])])
        names = [module, *(f"{module}.{a.name}" for a in node.names)]  # ``from tests import test_x`` names a module too
    else:
        return set()
    return {
        ".".join(n.split(".")[:2])
        for n in names
        if n.split(".")[0] == "tests" and n.split(".")[1:2] and n.split(".")[1].startswith("test_")
    }


def test_no_test_module_imports_another():
    """Test modules share helpers through tests/support/ and fixtures through conftest.py: no test
    module, conftest.py or support module imports a test module (``tests.test_x``, ``.test_x``,
    ``from . import test_x``, ``..test_x`` in tests/support/), at module level or in a function."""
    tests = ROOT / "tests"
    found = []
    for path in [*sorted(tests.glob("test_*.py")), tests / "conftest.py", *sorted((tests / "support").glob("*.py"))]:
        package = ".".join(path.parent.relative_to(ROOT).parts)  # tests or tests.support
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {m}" for m in sorted(imported_test_modules(node, package))]
    assert found == [], "test modules import other test modules (share what they need through tests/support/):\n" + "\n".join(found)


def test_the_check_finds_every_form_of_importing_a_test_module():
    def found(source: str, package: str = "tests") -> set[str]:
        return set().union(*(imported_test_modules(node, package) for node in ast.walk(ast.parse(source))))

    assert found("from .test_reader import write_sample") == {"tests.test_reader"}
    assert found("from tests.test_server import _settings") == {"tests.test_server"}
    assert found("import tests.test_server as s") == {"tests.test_server"}
    assert found("from . import expected, test_bad_values") == {"tests.test_bad_values"}
    assert found("from tests import test_bad_values") == {"tests.test_bad_values"}
    assert found("def f():\n    from .test_reader import assert_expected") == {"tests.test_reader"}
    assert found("from ..test_reader import write_sample", "tests.support") == {"tests.test_reader"}
    assert found("from .support.reader_sample import write_sample\nfrom .expected import row_of\nimport test_utils") == set()
    assert found("from .test_reader import x", "tests.support") == set()  # tests.support.test_reader: not a test module

"""No product function is longer than a reader can hold at once: at most MAX_LINES lines, from
its ``def`` to its last line (a docstring counts). A longer one is split by meaning, into
named helpers that say what each part does."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAX_LINES = 60


def product_files() -> list[Path]:
    """Every module of the packages pyproject.toml ships ([tool.setuptools] packages, as
    test_imports.product_modules reads them)."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    return sorted({path for package in packages for path in (ROOT / package.replace(".", "/")).glob("*.py")})


def long_functions(path: Path) -> list[str]:
    """``file:line name (length)`` of each function (nested ones and methods too) over MAX_LINES lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    return found


def test_no_product_function_is_over_max_lines():
    files = product_files()
    assert files
    found = [line for path in files for line in long_functions(path)]
    assert not found, f"functions over {MAX_LINES} lines (split them by meaning):\n  " + "\n  ".join(found)

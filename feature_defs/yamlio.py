"""YAML reading that remembers where things are: errors name the file and line.

Plain ``yaml.safe_load`` forgets line numbers and silently keeps the last of two
duplicate keys; both definitions and config need better than that.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class YamlFileError(ValueError):
    """A YAML file that cannot be used; the message starts with ``file:line``."""


def _check_duplicates(node: yaml.Node, path: Path) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else id(key)
            if k in seen:
                raise YamlFileError(
                    f"{path}:{key.start_mark.line + 1}: duplicate key {k!r} (first at line {seen[k]})"
                )
            seen[k] = key.start_mark.line + 1
            _check_duplicates(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicates(item, path)


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML file into (data, node tree). Empty files give ({}, None)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}") from exc
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, None
        _check_duplicates(node, path)
        return loader.construct_document(node), node
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise YamlFileError(f"{path}{line}: invalid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: invalid YAML: {exc}") from exc
    finally:
        loader.dispose()


def line_of(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest node on ``loc`` (a path of keys and indexes)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


def describe_validation_error(exc: ValidationError, path: Path, node: yaml.Node | None, root_loc: Sequence[Any] = ()) -> list[str]:
    """One ``file:line: where: problem`` message per pydantic error."""
    messages = []
    for err in exc.errors(include_url=False):
        loc = [*root_loc, *err["loc"]]
        line = line_of(node, loc)
        where = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        messages.append(f"{path}{f':{line}' if line else ''}: {where}: {msg}")
    return messages

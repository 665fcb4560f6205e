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


MAX_DEPTH = 64
"""Deepest nesting a file may have, aliases expanded: far below Python's recursion limit."""
MAX_NODES = 250_000
"""Most nodes a file may expand to through aliases: refuses alias bombs before anything walks them."""


def line_at(mark: yaml.Mark) -> int:
    """1-based line of a mark as editors and grep count: by newlines only (YAML's own count
    also breaks at NEL, U+2028 and U+2029)."""
    if mark.buffer is None:  # a mark of a byte stream: never made here, text is decoded first
        return mark.line + 1
    return mark.buffer.count("\n", 0, mark.pointer) + 1


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting before Python's recursion limit would, and
    reports a value its constructor cannot build (an int of 5000 digits, 2020-13-45) at its line."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, f"cannot read value: {_one_line(exc)}", node.start_mark) from exc


def _check_keys(node: yaml.MappingNode, path: Path) -> None:
    seen: dict[Any, yaml.Mark] = {}
    for key, _ in node.value:
        k = key.value if isinstance(key, yaml.ScalarNode) else id(key)
        if k in seen:
            raise YamlFileError(f"{path}:{line_at(key.start_mark)}: duplicate key {k!r} (first at line {line_at(seen[k])})")
        seen[k] = key.start_mark


def _measure(node: yaml.Node, path: Path, depth: int, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(nodes, height) of ``node`` with aliases expanded; checks duplicate keys on the way.

    An alias is the same node object as its anchor, so ``memo`` visits each node once: an
    alias bomb costs its file size here and is refused by its expanded size, and an alias
    inside its own anchor (a cycle) by its depth.
    """
    if depth > MAX_DEPTH:
        raise YamlFileError(f"{path}:{line_at(node.start_mark)}: invalid YAML: nested deeper than {MAX_DEPTH} levels (aliases expanded)")
    known = memo.get(id(node))
    if known is None:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            _check_keys(node, path)
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        size, height = 1, 0
        for child in children:
            child_size, child_height = _measure(child, path, depth + 1, memo)
            size, height = size + child_size, max(height, child_height + 1)
        memo[id(node)] = known = (size, height)
    if known[0] > MAX_NODES:
        raise YamlFileError(f"{path}:{line_at(node.start_mark)}: invalid YAML: expands to more than {MAX_NODES} values (aliases)")
    if depth + known[1] > MAX_DEPTH:
        raise YamlFileError(f"{path}:{line_at(node.start_mark)}: invalid YAML: nested deeper than {MAX_DEPTH} levels (aliases expanded)")
    return known


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(f"{path}:{line}: invalid YAML: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML file into (data, node tree). Empty files give ({}, None)."""
    text = _read_text(path)
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:  # a control character: refused before parsing
        line = text.count("\n", 0, exc.position) + 1
        raise YamlFileError(f"{path}:{line}: invalid YAML: character #x{exc.character:04x}: {exc.reason}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return {}, None
        _measure(node, path, 1, {})
        return loader.construct_document(node), node
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{line_at(mark)}" if mark else ""
        raise YamlFileError(f"{path}{line}: invalid YAML: {_one_line(exc.problem or exc)}") from exc
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: invalid YAML: {_one_line(exc)}") from exc
    finally:
        loader.dispose()


def line_of(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest node on ``loc`` (a path of keys and indexes)."""
    if node is None:
        return None
    line = line_at(node.start_mark)
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
        line = line_at(node.start_mark)
    return line


class KeyProblem(ValueError):
    """A model validator's objection to one key of the mapping it checks: reported at that key's line."""

    def __init__(self, key: Any, message: str):
        super().__init__(message)
        self.key = key


def _key_of(err: dict) -> tuple:
    error = err.get("ctx", {}).get("error")
    return (error.key,) if isinstance(error, KeyProblem) else ()


def _loc_text(part: Any) -> str:
    """A key as written, or quoted when it is empty or has spaces or control characters."""
    text = str(part)
    return text if text.isprintable() and text and not any(c.isspace() for c in text) else repr(text)


def describe_validation_error(exc: ValidationError, path: Path, node: yaml.Node | None, root_loc: Sequence[Any] = ()) -> list[str]:
    """One ``file:line: where: problem`` message per pydantic error."""
    messages = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = [*root_loc, *err["loc"], *_key_of(err)]
        line = line_of(node, loc)
        where = ".".join(_loc_text(p) for p in loc) or "(top level)"
        msg = _one_line(err["msg"])
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        messages.append(f"{path}{f':{line}' if line else ''}: {where}: {msg}")
    return messages

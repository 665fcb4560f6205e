"""YAML reading that remembers where things are: errors name the file and line.

Plain ``yaml.safe_load`` forgets line numbers and silently keeps the last of two
duplicate keys; both definitions and config need better than that.
"""

from __future__ import annotations

import errno
import os
import stat
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


def read_file(path: Path) -> bytes:
    """The bytes of a regular file. Anything else that a ``*.yaml`` glob matches (a folder,
    a dangling symlink, a FIFO, which would block the reader forever) is a YamlFileError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO must not wait for a writer
    except OSError as exc:
        dangling = exc.errno == errno.ENOENT and path.is_symlink()
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}" + (f" (a symlink to {os.readlink(path)})" if dangling else "")) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise YamlFileError(f"{path}: is a directory, not a YAML file (every *.yaml in its folder is read: rename or move it)")
        if not stat.S_ISREG(mode):
            raise YamlFileError(f"{path}: not a regular file (a FIFO, socket or device): expected YAML text")
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def _read_text(path: Path, raw: bytes | None = None) -> str:
    raw = read_file(path) if raw is None else raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(f"{path}:{line}: invalid YAML: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_yaml(path: Path, raw: bytes | None = None) -> tuple[Any, yaml.Node | None]:
    """Parse one YAML file (or ``raw``, its bytes read already) into (data, node tree). Empty files give ({}, None)."""
    text = _read_text(path, raw)
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


def _walk(node: yaml.Node, loc: Sequence[Any]) -> tuple[yaml.Node, bool]:
    """The deepest node on ``loc`` (a path of keys and indexes), and whether it is ``loc``'s own."""
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
            return node, False
        node = child
    return node, True


def line_of(node: yaml.Node | None, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest node on ``loc`` (a path of keys and indexes)."""
    return None if node is None else line_at(_walk(node, loc)[0].start_mark)


def written_at(node: yaml.Node | None, loc: Sequence[Any]) -> str | None:
    """The scalar at ``loc`` as the file spells it (``NO``, not the False YAML reads), without quotes."""
    if node is None:
        return None
    found, exact = _walk(node, loc)
    return found.value if exact and isinstance(found, yaml.ScalarNode) else None


class KeyProblem(ValueError):
    """A model validator's objection to one key of the mapping it checks (or, as a tuple, to
    a place under it, e.g. ``(0,)`` for a list's first item): reported at that line.

    ``{written}`` in the message stands for the value there as the file spells it
    (``fallback`` when there is no file). Only for definitions: config values may be secrets."""

    def __init__(self, key: Any, message: str, fallback: str = ""):
        super().__init__(message.replace("{written}", fallback))
        self.key = key
        self.template = message


def _key_of(err: dict) -> tuple:
    error = err.get("ctx", {}).get("error")
    if not isinstance(error, KeyProblem):
        return ()
    return tuple(error.key) if isinstance(error.key, tuple) else (error.key,)


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
        error = err.get("ctx", {}).get("error")
        written = written_at(node, loc) if isinstance(error, KeyProblem) and "{written}" in error.template else None
        if written is not None:
            msg = msg.replace(_one_line(error), _one_line(error.template.replace("{written}", written)))
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        messages.append(f"{path}{f':{line}' if line else ''}: {where}: {msg}")
    return messages

"""Fuzzing: definitions and config files, and stored values, that are wrong in every way.

Loaders must return or raise their own error (DefinitionError / ConfigError) with every
problem as ``file:line: ...``; decoders must return a value the format can hold or raise
DecodeError with its own explanation. Anything else escaping is a bug. Runs are
derandomized and keep no example database, so CI sees the same examples every time.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feature_defs import DefinitionError, Definitions, load_definitions
from fm_config import ConfigError, RunConf, load_config
from serializers import DecodeError, decode, encode

FUZZ = settings(max_examples=200, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

ENTITIES = "entities:\n  - {name: consumer, prefix: c, keys: [{name: consumer_id, type: int}], sql_table: consumer_features}\n"
VALID_SOURCE = {
    "source": {
        "name": "orders",
        "entity": "consumer",
        "location": "orders",
        "layout": "wide",
        "features": [
            {"name": "total", "type": "float", "precision": "float32"},
            {"name": "count", "type": "int", "min_value": 0},
            {"name": "vec", "type": "embedding", "dimension": 4},
            {"name": "ids", "type": "int_list", "compression": "none"},
            {"name": "cuisine", "type": "string", "max_length": 32},
        ],
    }
}
VALID_CONF = {
    "data_root": "data",
    "sinks": ["redis"],
    "spark": {"master": "local[1]", "shuffle_partitions": 2},
    "redis": {"url": "redis://127.0.0.1:1/0", "max_fill": 0.5, "password_env": "X_PW"},
    "sql": {"dialect": "postgres", "batch_rows": 10},
    "quality": {"verify_sample": 0},
}
FEATURE_TYPES = ["float", "int", "bool", "string", "embedding", "int_list", "string_list", "float_list"]

# Text that looks like YAML often enough to reach past the scanner.
YAML_CHARS = st.sampled_from(
    list("abcdefgsource:entities-[]{},&*!|>'\"#%@`?~0123456789._ \n\t\\") + ["\x00", "\x85", "\u2028", "é", "日", "\ufeff"]
)
YAML_TOKENS = st.sampled_from(
    [
        "source:",
        "entities:",
        "  ",
        "- ",
        "name: ",
        "features:",
        "type: ",
        "&a ",
        "*a",
        "<<: ",
        "!!python/object:os.system ",
        "!!binary ",
        "? ",
        "---\n",
        "...\n",
        "{",
        "[",
        "\n",
    ]
)
YAMLISH = st.lists(st.one_of(YAML_TOKENS, st.text(YAML_CHARS, max_size=8)), max_size=40).map("".join)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**30, max_value=10**60),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(FEATURE_TYPES + ["decimal", "", "Float", "wide", "long", "snappy", "float32"]),
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8
)
keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["name", "type", "dimension", "precision", "compression", "layout", "features", "entity", "column"]),
    st.integers(),
)


def problem_lines_ok(problems: list[str], files: list[Path]) -> None:
    """Each problem is one line that starts with one of ``files`` and a line number inside it."""
    for problem in problems:
        assert "\n" not in problem, problem
        match = re.match(r"(.*?):(\d+): \S", problem)
        assert match and Path(match.group(1)) in files, problem
        path = Path(match.group(1))
        lines = path.read_bytes().count(b"\n") + 1
        assert 1 <= int(match.group(2)) <= lines, (problem, lines)


def check_definitions(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "entities.yaml").write_text(ENTITIES)
        (folder / "src.yaml").write_bytes(content)
        try:
            defs = load_definitions(folder)
        except DefinitionError as exc:
            assert exc.problems
            problem_lines_ok(exc.problems, [folder / "entities.yaml", folder / "src.yaml"])
            return
        assert isinstance(defs, Definitions) and set(defs.entities) == {"consumer"}


@FUZZ
@given(st.one_of(YAMLISH.map(str.encode), st.text().map(str.encode), st.binary()))
def test_definitions_loader_survives_arbitrary_files(content):
    check_definitions(content)


@FUZZ
@given(st.data())
def test_definitions_loader_survives_spliced_files(data):
    """Cut, insert and swap characters in a valid definition file."""
    text = yaml.safe_dump(VALID_SOURCE, sort_keys=False, default_flow_style=data.draw(st.sampled_from([False, None])))
    for _ in range(data.draw(st.integers(1, 3))):
        start = data.draw(st.integers(0, len(text)))
        end = data.draw(st.integers(start, min(len(text), start + 12)))
        text = text[:start] + data.draw(st.one_of(YAML_TOKENS, st.text(YAML_CHARS, max_size=4))) + text[end:]
    check_definitions(text.encode())


def mutate(draw, doc):
    """One random change somewhere in ``doc``: replace, add or drop a key, or an item."""
    node, path = doc, []
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(list(node) if isinstance(node, dict) else range(len(node))))
        node, path = node[key], [*path, key]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "add", "drop", "duplicate"]))
    if action == "replace" and path:
        parent[path[-1]] = draw(values)
    elif action == "add" and isinstance(node, dict):
        node[draw(keys)] = draw(values)
    elif action == "add" and isinstance(node, list):
        node.insert(draw(st.integers(0, len(node))), draw(values))
    elif action == "drop" and path:
        del parent[path[-1]]
    elif action == "duplicate" and isinstance(node, list) and node:
        node.append(node[draw(st.integers(0, len(node) - 1))])  # the same object: dumped as an alias


@st.composite
def mutated_sources(draw):
    doc = copy.deepcopy(VALID_SOURCE)
    features = doc["source"]["features"]
    for _ in range(draw(st.integers(0, 3))):  # random names and types, sometimes repeated
        features.append(
            {
                "name": draw(
                    st.one_of(
                        st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), st.text(max_size=10), st.sampled_from(["total", "count"])
                    )
                ),
                "type": draw(st.one_of(st.sampled_from(FEATURE_TYPES), st.text(max_size=8))),
            }
        )
    for _ in range(draw(st.integers(1, 4))):
        mutate(draw, doc)
    return doc


@settings(FUZZ, max_examples=150)
@given(mutated_sources())
def test_definitions_loader_survives_structured_mutations(doc):
    check_definitions(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode())


@settings(FUZZ, max_examples=100)
@given(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), min_size=1, max_size=6))
def test_definitions_loader_reports_every_duplicate_at_its_line(names):
    """Valid apart from repeated names: exactly the repeats are reported, each at its own line."""
    doc = copy.deepcopy(VALID_SOURCE)
    doc["source"]["features"] = [{"name": n, "type": "int"} for n in names]
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    # In block style each feature item starts with a "- name: " line.
    item_lines = [n for n, line in enumerate(text.split("\n"), 1) if line.lstrip().startswith("- name: ")]
    expected = [(item_lines[i], i + 1, n) for i, n in enumerate(names) if n in names[:i]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "entities.yaml").write_text(ENTITIES)
        (folder / "src.yaml").write_text(text)
        if not expected:
            assert [f.name for f in load_definitions(folder).source("orders").features] == names
            return
        with pytest.raises(DefinitionError) as info:
            load_definitions(folder)
    duplicates = [p for p in info.value.problems if "duplicate feature name" in p]
    assert duplicates == [
        f"{folder / 'src.yaml'}:{line}: source 'orders': feature #{i}: duplicate feature name {n!r}" for line, i, n in expected
    ]


SECRET = "Sup3r-Secr3t-Value"


def check_config(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp)
        (conf / "base").mkdir()
        (conf / "fuzz").mkdir()
        (conf / "base" / "x.yaml").write_bytes(content)
        with mock.patch.dict(os.environ, {"FM_CONF_DIR": str(conf)}):
            try:
                result = load_config("fuzz")
            except ConfigError as exc:
                header, *problems = str(exc).split("\n  ")
                assert header == "invalid configuration:"
                problem_lines_ok(problems, [conf / "base" / "x.yaml"])
                assert SECRET not in str(exc)  # values are never echoed
                return
    assert isinstance(result, RunConf) and result.env == "fuzz"


@FUZZ
@given(st.one_of(YAMLISH.map(str.encode), st.binary()))
def test_load_config_survives_arbitrary_files(content):
    check_config(content)


@st.composite
def mutated_confs(draw):
    doc = copy.deepcopy(VALID_CONF)
    for _ in range(draw(st.integers(1, 4))):
        mutate(draw, doc)
    if draw(st.booleans()):  # a secret where it does not belong: a literal key, or inside the DSN
        section = doc.setdefault("sql", {}) if isinstance(doc.get("sql"), dict) else doc
        choice = draw(st.sampled_from(["password", "token", "api_secret", "dsn"]))
        section[choice] = f"postgresql://u:{SECRET}@h/db" if choice == "dsn" else SECRET
    return doc


@settings(FUZZ, max_examples=150)
@given(mutated_confs())
def test_load_config_survives_structured_mutations(doc):
    check_config(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode())


# Every feature type with each option that changes its bytes.
DECODE_CASES = [
    ("float", {}),
    ("float", {"precision": "float32"}),
    ("int", {}),
    ("bool", {}),
    ("string", {}),
    ("string", {"max_length": 4}),
    ("embedding", {"dimension": 1}),
    ("embedding", {"dimension": 4}),
    ("int_list", {"compression": "snappy"}),
    ("int_list", {"compression": "none"}),
    ("string_list", {"compression": "snappy"}),
    ("string_list", {"compression": "none"}),
    ("float_list", {"compression": "none"}),
    ("float_list", {"compression": "snappy"}),
    ("float_list", {"precision": "float32", "compression": "none"}),
    ("float_list", {"precision": "float32", "compression": "snappy"}),
]
INT64 = st.integers(-(2**63), 2**63 - 1)


def valid_values(feature_type: str, options: dict):
    """Values the format can hold for a feature of this type and options."""
    return {
        "float": st.floats(allow_nan=False, allow_infinity=False, width=32 if options.get("precision") else 64),
        "int": INT64,
        "bool": st.booleans(),
        "string": st.text(max_size=options.get("max_length", 50)),
        "embedding": st.lists(
            st.floats(width=32, allow_nan=False, allow_infinity=False),
            min_size=options.get("dimension", 0),
            max_size=options.get("dimension", 8),
        ),
        "int_list": st.lists(INT64, max_size=20),
        "string_list": st.lists(st.text(max_size=10), max_size=8),
        "float_list": st.lists(
            st.floats(allow_nan=False, allow_infinity=False, width=32 if options.get("precision") == "float32" else 64), max_size=20
        ),
    }[feature_type]


def corrupted(feature_type: str, options: dict):
    """Random bytes, and valid encodings with bytes flipped, cut off or added."""

    def damage(args):
        data, position, byte, how = args
        if not data:
            return bytes([byte])
        position %= len(data)
        if how == "flip":
            return data[:position] + bytes([data[position] ^ (byte or 1)]) + data[position + 1 :]
        if how == "cut":
            return data[:position]
        return data[:position] + bytes([byte]) + data[position:]

    encoded = valid_values(feature_type, options).map(lambda v: encode(feature_type, v, **options))
    return st.one_of(
        st.binary(max_size=64),
        st.tuples(encoded, st.integers(0, 10**6), st.integers(0, 255), st.sampled_from(["flip", "cut", "insert"])).map(damage),
        st.sampled_from([b"nan", b"-inf", b" 1", b"1_000", b"+1", b"1e999", b"9" * 30, b"-0", b"\xff", b"\x0d\x00\x00\xc0\x7f"]),
    )


@pytest.mark.parametrize(
    "feature_type, options", DECODE_CASES, ids=[f"{t}-{'-'.join(map(str, o.values())) or 'default'}" for t, o in DECODE_CASES]
)
def test_decoders_reject_corrupt_bytes_with_decode_error(feature_type, options):
    @settings(FUZZ, max_examples=150)
    @given(corrupted(feature_type, options))
    def check(data):
        try:
            value = decode(feature_type, data, **options)
        except DecodeError as exc:
            # Explained by the decoder itself, not by its catch-all for unexpected library errors.
            assert exc.__cause__ is None, repr(exc.__cause__)
            assert re.match(r"(cannot decode \d+ bytes as \w+: |bool must be |embedding has \d+ values)", str(exc)), str(exc)
            return
        # Anything accepted is a value the format can hold: encoding it gives bytes that read back the same.
        canonical = encode(feature_type, value, **options)
        assert canonical is not None
        assert encode(feature_type, decode(feature_type, canonical, **options), **options) == canonical

    check()


@pytest.mark.parametrize(
    "feature_type, options", DECODE_CASES, ids=[f"{t}-{'-'.join(map(str, o.values())) or 'default'}" for t, o in DECODE_CASES]
)
def test_decode_inverts_encode(feature_type, options):
    @settings(FUZZ, max_examples=100)
    @given(valid_values(feature_type, options))
    def check(value):
        got = decode(feature_type, encode(feature_type, value, **options), **options)
        if feature_type == "float" and options:
            # float32 features are written as the shortest text of the nearest float32
            assert np.float32(got) == np.float32(value)
        else:
            assert got == value

    check()

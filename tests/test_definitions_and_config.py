"""Definitions and config loaders: the shipped files load; bad ones fail with file:line."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import xxhash

from feature_defs import DefinitionError, load_definitions
from fm_config import ConfigError, load_config

from .support.confs import env_conf

ENTITIES = """\
entities:
  - name: consumer
    prefix: c
    keys: [{name: consumer_id, type: int}]
    sql_table: consumer_features
"""


def write_defs(folder: Path, source_yaml: str, entities: str = ENTITIES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "entities.yaml").write_text(entities)
    (folder / "src.yaml").write_text(textwrap.dedent(source_yaml))
    return folder


def source(features: str, name: str = "src", extra: str = "") -> str:
    return f"source:\n  name: {name}\n  entity: consumer\n  location: src\n  layout: wide\n{extra}  features:\n{features}"


def test_shipped_definitions_load():
    defs = load_definitions()
    assert set(defs.sources) == {"consumer_daily", "store_features_long"}
    consumer = defs.sources["consumer_daily"]
    assert consumer.feature("taste_embedding").dimension == 32
    assert consumer.feature("churn_score").precision == "float32"
    assert defs.entity_of(consumer).prefix == "c"


def test_loading_definitions_leaves_great_expectations_unimported():
    """What reads definitions without running expectations (the reader, the feature server,
    `ready`, `verify`) does not pay for importing great-expectations (3.0 s and 214 MiB here)."""
    code = (
        "import sys\nfrom feature_defs import load_definitions\nimport feature_reader\n"
        "defs = load_definitions()\nassert defs.extra_expectations, 'the shipped sources declare expectations of their own'\n"
        "print('great_expectations' in sys.modules)\ndefs.check_expectations()\nprint('great_expectations' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["False", "True"]


def line_with(text: str, fragment: str, occurrence: int = 1) -> int:
    """1-based number of the line of ``text`` holding the occurrence-th ``fragment``."""
    return [n for n, line in enumerate(text.split("\n"), 1) if fragment in line][occurrence - 1]


def problems_of(folder: Path) -> str:
    with pytest.raises(DefinitionError) as info:
        load_definitions(folder)
    return str(info.value)


def test_unknown_type_names_file_line_and_entry(tmp_path):
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n    - {name: b, type: decimal}\n"))
    text = problems_of(folder)
    # line 8 is the second feature: source, name, entity, location, layout, features, a, b
    assert f"{folder / 'src.yaml'}:8: source.features.1.type: Input should be 'float'" in text


def test_embedding_without_dimension_and_misplaced_option(tmp_path):
    folder = write_defs(tmp_path, source("    - {name: e, type: embedding}\n    - {name: s, type: int, max_length: 3}\n"))
    text = problems_of(folder)
    assert "src.yaml:7: source.features.0: Value error, an embedding needs a 'dimension'" in text
    assert "src.yaml:8: source.features.1: Value error, option 'max_length' does not apply to type int" in text


def test_source_column_names_may_hold_any_character_but_a_control_character(tmp_path):
    columns = '  key_columns: ["consumer.id"]\n  timestamp_column: "updated at`"\n  date_column: "jour.ds"\n'
    folder = write_defs(tmp_path / "a", source('    - {name: a, type: float, column: "größe.x`"}\n', extra=columns))
    src = load_definitions(folder).sources["src"]
    assert (src.key_columns, src.timestamp_column, src.date_column, src.features[0].source_column) == (
        ["consumer.id"],
        "updated at`",
        "jour.ds",
        "größe.x`",
    )
    folder = write_defs(tmp_path / "b", source('    - {name: a, type: float, column: "tab\\there"}\n'))
    assert "src.yaml:7: source.features.0.column: String should match pattern" in problems_of(folder)


def test_duplicate_yaml_key_is_an_error(tmp_path):
    folder = write_defs(tmp_path, "source:\n  name: src\n  name: other\n")
    assert "src.yaml:3: duplicate key 'name' (first at line 2)" in problems_of(folder)


def test_malformed_yaml_names_the_line(tmp_path):
    folder = write_defs(tmp_path, "source:\n  name: [unclosed\n  entity: consumer\n")
    assert "src.yaml:3: invalid YAML" in problems_of(folder)


def test_duplicate_feature_and_unknown_entity(tmp_path):
    yaml_text = source("    - {name: a, type: float}\n    - {name: b, type: int}\n    - {name: a, type: int}\n")
    text = problems_of(write_defs(tmp_path / "a", yaml_text))
    # the duplicate's own line, not the source's
    line = line_with(yaml_text, "- {name: a, type: int}")
    assert f"{tmp_path / 'a' / 'src.yaml'}:{line}: source 'src': feature #3: duplicate feature name 'a'" in text
    bad_entity = source("    - {name: a, type: float}\n").replace("entity: consumer", "entity: courier")
    assert "unknown entity 'courier'" in problems_of(write_defs(tmp_path / "b", bad_entity))


def test_field_id_collision_names_both_features(tmp_path):
    # f84727 and f114310 share an xxh32 (found by a birthday search; checked here directly).
    assert xxhash.xxh32_intdigest(b"f84727") == xxhash.xxh32_intdigest(b"f114310") == 2088776930
    folder = write_defs(tmp_path, source("    - {name: f84727, type: float}\n    - {name: f114310, type: float}\n"))
    text = problems_of(folder)
    assert "field id collision in entity 'consumer'" in text
    assert "'f114310'" in text and "'f84727'" in text and "2088776930" in text


def test_freshness_field_collision(tmp_path):
    assert xxhash.xxh32_intdigest(b"_ts:src12490") == xxhash.xxh32_intdigest(b"f8385")
    folder = write_defs(tmp_path, source("    - {name: f8385, type: float}\n", name="src12490"))
    text = problems_of(folder)
    assert "'_ts:src12490'" in text and "'f8385'" in text


def test_config_env_overlay_and_errors(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "prod").mkdir()
    (conf / "base" / "m.yaml").write_text("redis:\n  url: redis://base:1/0\n  pipeline_entities: 100\n")
    (conf / "prod" / "m.yaml").write_text("redis:\n  url: redis://prod:1/0\n  password_env: PROD_REDIS_PW\n")
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    monkeypatch.setenv("PROD_REDIS_PW", "s3cret")
    c = load_config("prod")
    assert (c.redis.url, c.redis.pipeline_entities, c.env) == ("redis://prod:1/0", 100, "prod")
    assert c.redis_password().get_secret_value() == "s3cret"
    assert "s3cret" not in repr(c) and "s3cret" not in repr(c.redis_password())

    monkeypatch.setenv("FM_ENV", "prod")
    assert load_config().env == "prod"

    with pytest.raises(ConfigError, match=r"unknown env 'stage'.*envs: prod"):
        load_config("stage")

    (conf / "prod" / "m.yaml").write_text("redis:\n  password: hunter2\n")
    with pytest.raises(ConfigError, match="secrets are never read from config files") as info:
        load_config("prod")
    assert "hunter2" not in str(info.value)

    (conf / "prod" / "m.yaml").write_text("redis:\n  url: a\n  url: b\n")
    with pytest.raises(ConfigError, match=r"m.yaml:3: duplicate key 'url'"):
        load_config("prod")

    (conf / "prod" / "m.yaml").write_text("redis:\n  max_fill: 3\n")
    with pytest.raises(ConfigError, match=r"m.yaml:2: redis.max_fill"):
        load_config("prod")


def test_missing_password_env_var_is_a_clear_error(tmp_path, monkeypatch):
    conf = env_conf(tmp_path / "conf", "x", "redis:\n  password_env: NOT_SET_ANYWHERE\n")
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(ConfigError, match="'NOT_SET_ANYWHERE'.*not set"):
        load_config("x").redis_password()


# Each case: file content, a fragment of the line the problem must be reported at, the message.
MALFORMED = {
    "unclosed flow list": ("source:\n  name: [unclosed\n  entity: consumer\n", "entity: consumer", "invalid YAML"),
    "tab indentation": ("source:\n  name: a\n\tentity: consumer\n", "\tentity", "invalid YAML: found character '\\t'"),
    "not UTF-8": (b"source:\n  name: a\n  entity: caf\xe9\n", "caf", "invalid YAML: not UTF-8 text"),
    "control character": ("source:\n  name: a\x07b\n", "name: a", "invalid YAML: character #x0007"),
    "deep nesting": ("source:\n  name: a\n  location: " + "[" * 300 + "]" * 300 + "\n", "location:", "invalid YAML: nested deeper than"),
    "python tag": (
        "source:\n  name: !!python/object/apply:os.system ['true']\n",
        "os.system",
        "invalid YAML: could not determine a constructor",
    ),
    "int beyond the digit limit": ("source:\n  name: a\n  location: " + "9" * 5000 + "\n", "location:", "invalid YAML: cannot read value"),
    "impossible date": ("source:\n  name: a\n  location: 2026-13-45\n", "2026-13-45", "invalid YAML: cannot read value"),
    "two documents": ("source: {}\n---\nsource: {}\n", "---", "invalid YAML"),
    "not a mapping": (
        "# a comment first\n- source\n",
        "- source",
        "expected a top-level 'entities:' list, a 'source:' mapping or a 'feature_services:' list",
    ),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_files_name_file_and_line(tmp_path, case):
    content, fragment, message = MALFORMED[case]
    folder = write_defs(tmp_path, "")
    (folder / "src.yaml").write_bytes(content if isinstance(content, bytes) else content.encode())
    text = content.decode("latin-1") if isinstance(content, bytes) else content
    assert f"{folder / 'src.yaml'}:{line_with(text, fragment)}: {message}" in problems_of(folder)


@pytest.mark.parametrize(
    "content",
    [
        "source: &s\n  name: a\n  again: *s\n",  # an alias inside its own anchor
        "a: &a [x, x, x, x, x, x, x, x]\n"  # an alias bomb: 8**7 values once expanded
        + "".join(f"{n}: &{n} [{', '.join(['*' + p] * 8)}]\n" for p, n in zip("abcdef", "bcdefg"))
        + "source: *g\n",
    ],
    ids=["alias cycle", "alias bomb"],
)
def test_alias_cycles_and_bombs_are_refused(tmp_path, content):
    folder = write_defs(tmp_path, content)
    problems = problems_of(folder)
    lines = content.count("\n")
    match = re.search(rf"{re.escape(str(folder / 'src.yaml'))}:(\d+): invalid YAML: (nested deeper than|expands to more than)", problems)
    assert match and 1 <= int(match.group(1)) <= lines, problems


def test_duplicate_source_and_entity_across_files(tmp_path):
    first = source("    - {name: a, type: float}\n", name="shared")
    second = "# the same source name again\n" + source("    - {name: b, type: int}\n", name="shared")
    more_entities = (
        "entities:\n  - name: store\n    prefix: s\n    keys: [{name: store_id, type: int}]\n    sql_table: store_features\n"
        "  - name: consumer\n    prefix: c2\n    keys: [{name: consumer_id, type: int}]\n    sql_table: c2_features\n"
    )
    folder = write_defs(tmp_path, first)
    (folder / "zz.yaml").write_text(second)
    (folder / "zz_entities.yaml").write_text(more_entities)
    text = problems_of(folder)
    assert (
        f"{folder / 'zz.yaml'}:{line_with(second, 'name: shared')}: source 'shared' is already defined at "
        f"{folder / 'src.yaml'}:{line_with(first, 'name: shared')}"
    ) in text
    assert (
        f"{folder / 'zz_entities.yaml'}:{line_with(more_entities, '- name: consumer')}: entity 'consumer' is already defined at "
        f"{folder / 'entities.yaml'}:{line_with(ENTITIES, '- name: consumer')}"
    ) in text


def test_entity_prefix_collision_names_file_and_line(tmp_path):
    entities = ENTITIES + "  - name: courier\n    prefix: c\n    keys: [{name: courier_id, type: int}]\n    sql_table: courier_features\n"
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n"), entities=entities)
    expected = (
        f"{folder / 'entities.yaml'}:{line_with(entities, '- name: courier')}: entity 'courier' has key prefix 'c', like entity 'consumer'"
    )
    assert expected in problems_of(folder)


def test_unknown_entity_names_file_and_line(tmp_path):
    text = source("    - {name: a, type: float}\n").replace("entity: consumer", "entity: courier")
    folder = write_defs(tmp_path, text)
    expected = f"{folder / 'src.yaml'}:{line_with(text, 'name: src')}: source 'src': unknown entity 'courier' (defined: consumer)"
    assert expected in problems_of(folder)


def test_field_id_collision_exact_message(tmp_path):
    text = source("    - {name: f84727, type: float}\n    - {name: f114310, type: float}\n")
    folder = write_defs(tmp_path, text)
    assert (
        f"{folder / 'src.yaml'}:{line_with(text, 'f114310')}: field id collision in entity 'consumer': "
        "feature 'f114310' of source 'src' and feature 'f84727' of source 'src' both have field id 2088776930"
    ) in problems_of(folder)


def test_field_id_collision_across_sources(tmp_path):
    other = source("    - {name: other, type: int}\n    - {name: f114310, type: float}\n", name="later")
    folder = write_defs(tmp_path, source("    - {name: f84727, type: float}\n"))
    (folder / "src2.yaml").write_text(other)
    assert (
        f"{folder / 'src2.yaml'}:{line_with(other, 'f114310')}: field id collision in entity 'consumer': "
        "feature 'f114310' of source 'later' and feature 'f84727' of source 'src' both have field id 2088776930"
    ) in problems_of(folder)


def test_two_sources_of_one_entity_type_share_a_feature_name_under_different_stored_names(tmp_path):
    """One hash per entity holds every source's features: a feature name is unique within its
    source, a stored name (the field) within the entity type."""
    other = source("    - {name: a, type: int}\n", name="later")
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n"))
    (folder / "src2.yaml").write_text(other)
    assert problems_of(folder).splitlines()[-1] == (
        f"  {folder / 'src2.yaml'}:{line_with(other, 'name: a')}: entity 'consumer': feature 'a' of source 'later' is stored as "
        "'a', like feature 'a' of source 'src': give it fresh storage with `stored_as: a@2`"
    )
    third = source("    - {name: a, type: string}\n", name="third")
    (folder / "src3.yaml").write_text(third)
    assert problems_of(folder).count("give it fresh storage with `stored_as: a@3`") == 1  # each clash told a name of its own
    (folder / "src3.yaml").unlink()
    (folder / "src2.yaml").write_text(other.replace("{name: a, type: int}", "{name: a, type: int, stored_as: a@2}"))
    defs = load_definitions(folder)
    ours, theirs = defs.sources["src"].feature("a"), defs.sources["later"].feature("a")
    assert (ours.field_id, theirs.field_id) == (xxhash.xxh32_intdigest(b"a"), xxhash.xxh32_intdigest(b"a@2"))
    assert (ours.type, theirs.type) == ("float", "int")


def test_freshness_field_collision_exact_message(tmp_path):
    text = source("    - {name: f8385, type: float}\n", name="src12490")
    folder = write_defs(tmp_path, text)
    assert (
        f"{folder / 'src.yaml'}:{line_with(text, 'f8385')}: field id collision in entity 'consumer': "
        f"feature 'f8385' of source 'src12490' and '_ts:src12490' (freshness field of source 'src12490') "
        f"both have field id {xxhash.xxh32_intdigest(b'f8385')}"
    ) in problems_of(folder)


# Each case: an env config file, a fragment of the line the problem must be reported at, the message.
BAD_CONFIG = {
    "fill above 1": (
        "redis:\n  url: redis://h:1/0\n  max_fill: 2\n",
        "max_fill",
        "redis.max_fill: Input should be less than or equal to 1",
    ),
    "no shuffle partitions": (
        "spark:\n  master: local[1]\n  shuffle_partitions: 0\n",
        "shuffle_partitions",
        "spark.shuffle_partitions: Input should be greater than or equal to 1",
    ),
    "unknown key": ("quality:\n  verify_sample: 10\n  colour: blue\n", "colour", "quality.colour: unknown key"),
    "wrong type": ("sql:\n  dialect: postgres\n  batch_rows: many\n", "batch_rows", "sql.batch_rows: Input should be a valid integer"),
    "unknown sink": ("sinks: [redis, mysql]\n", "sinks", "sinks.1: Input should be 'redis' or 'sql'"),
    "literal password": (
        "redis:\n  url: redis://h:1/0\n  password: hunter2\n",
        "password:",
        "redis.password: Value error, 'password': secrets are never read from config files",
    ),
    "literal token": (
        "data_root: d\napi_token: hunter2\n",
        "api_token",
        "api_token: Value error, 'api_token': secrets are never read from config files",
    ),
    "password in dsn": (
        "sql:\n  dialect: postgres\n  dsn: postgresql://u:hunter2@h/db\n",
        "dsn:",
        "sql.dsn: Value error, dsn contains a password",
    ),
    "malformed": ("redis:\n  url: [x\n  pipeline_entities: 3\n", "pipeline_entities", "invalid YAML"),
    "not UTF-8": (b"redis:\n  url: redis://h\xff:1/0\n", "url:", "invalid YAML: not UTF-8 text"),
    "not a mapping": ("# overrides\n- redis\n", "- redis", "expected a mapping at the top level"),
}


def test_the_sql_stores_old_name_is_read_as_sql_with_one_notice(tmp_path, monkeypatch, caplog):
    """`cockroach` (the SQL store's name before `sql`) still works in the config, on the command
    line and in ledger rows written before, saying so once where a person wrote it."""
    import argparse
    import logging

    from fm_config import stores
    from jobs.cli.common import load
    from jobs.operations.ledger.events import by_store, on_target

    monkeypatch.setattr(stores, "_noticed", set())
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "base" / "m.yaml").write_text("sinks: [redis, cockroach]\nreader:\n  stores:\n    s: [cockroach]\n")
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    with caplog.at_level(logging.WARNING, logger="fm_config.stores"):
        c = load_config("base")
        assert (c.sinks, c.reader.stores) == (["redis", "sql"], {"s": ["sql"]})
        load_config("base")  # said once per place
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "sinks: 'cockroach' is the SQL store's old name, now 'sql' (the old name still works, for a while)",
        "stores: 'cockroach' is the SQL store's old name, now 'sql' (the old name still works, for a while)",
    ]
    caplog.clear()
    args = argparse.Namespace(env="base", data_root=None, sink="cockroach")
    with caplog.at_level(logging.WARNING, logger="fm_config.stores"):
        assert load(args)[0].sinks == ["sql"]
    assert [r.getMessage() for r in caplog.records] == [
        "--sink: 'cockroach' is the SQL store's old name, now 'sql' (the old name still works, for a while)"
    ]
    row = {"targets": '{"cockroach": "postgresql://db:26257/f", "redis": "redis://h:1/0"}', "stores": '{"cockroach": {"lost": null}}'}
    assert by_store(row["targets"]) == {"sql": "postgresql://db:26257/f", "redis": "redis://h:1/0"}
    assert on_target(row, "sql", "postgresql://db:26257/f") and by_store(row["stores"]) == {"sql": {"lost": None}}


@pytest.mark.parametrize("case", BAD_CONFIG, ids=list(BAD_CONFIG))
def test_bad_config_names_file_and_line(tmp_path, monkeypatch, case):
    content, fragment, message = BAD_CONFIG[case]
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "prod").mkdir()
    (conf / "base" / "m.yaml").write_text("redis:\n  pipeline_entities: 100\n")
    (conf / "prod" / "m.yaml").write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    with pytest.raises(ConfigError) as info:
        load_config("prod")
    text = content.decode("latin-1") if isinstance(content, bytes) else content
    assert f"{conf / 'prod' / 'm.yaml'}:{line_with(text, fragment)}: {message}" in str(info.value)
    assert "hunter2" not in str(info.value)  # values are never echoed: they may be secrets


# Each case: features (YAML), a fragment of the line the problem must be reported at, the message there.
# YAML 1.1 reads NO/yes/off as booleans: a check against such a value would fail every row.
WRONG_VALUE_TYPES = {
    "NO in a string's allowed_values": (
        "    - name: country\n      type: string\n      allowed_values:\n        - SE\n        - NO\n",
        "- NO",
        "source.features.0.allowed_values.1: Value error, expected a string (the feature is of type string), "
        "found NO, which YAML reads as the boolean false: quote it: 'NO'",
    ),
    "a number in a string's allowed_values": (
        "    - {name: zip, type: string, allowed_values: ['0100', 1010]}\n",
        "name: zip",
        "source.features.0.allowed_values.1: Value error, expected a string (the feature is of type string), "
        "found 1010, which YAML reads as a number: quote it: '1010'",
    ),
    "a quoted int bound": (
        "    - {name: n, type: int}\n    - {name: orders, type: int, min_value: '5'}\n",
        "name: orders",
        "source.features.1.min_value: Value error, expected an integer (the feature is of type int), "
        "found '5', a string: write an integer, unquoted",
    ),
    "a fraction as an int bound": (
        "    - {name: orders, type: int, min_value: 0, max_value: 7.5}\n",
        "name: orders",
        "source.features.0.max_value: Value error, expected an integer (the feature is of type int), found 7.5, a float: write an integer",
    ),
    "a boolean as a float bound": (
        "    - name: score\n      type: float\n      min_value: off\n",
        "min_value: off",
        "source.features.0.min_value: Value error, expected a finite number (the feature is of type float), "
        "found off, which YAML reads as the boolean false: write a number",
    ),
    "NaN as a float bound": (
        "    - {name: score, type: float, max_value: .nan}\n",
        "name: score",
        "source.features.0.max_value: Value error, expected a finite number (the feature is of type float), "
        "found .nan, not a finite number: write a number",
    ),
    "a string in a bool's allowed_values": (
        "    - name: late\n      type: bool\n      allowed_values: [true, 'false']\n",
        "allowed_values",
        "source.features.0.allowed_values.1: Value error, expected a boolean (the feature is of type bool), "
        "found 'false', a string: write true or false, unquoted",
    ),
    "a boolean in an int's allowed_values": (
        "    - name: tier\n      type: int\n      allowed_values:\n        - 1\n        - yes\n",
        "- yes",
        "source.features.0.allowed_values.1: Value error, expected an integer (the feature is of type int), "
        "found yes, which YAML reads as the boolean true: write an integer",
    ),
    "yes as a null fraction": (
        "    - name: score\n      type: float\n      max_null_fraction: yes\n",
        "max_null_fraction",
        "source.features.0.max_null_fraction: Input should be a valid number",
    ),
    "on as a dimension": (
        "    - name: vec\n      type: embedding\n      dimension: on\n",
        "dimension",
        "source.features.0.dimension: Input should be a valid integer",
    ),
}


@pytest.mark.parametrize("case", WRONG_VALUE_TYPES, ids=list(WRONG_VALUE_TYPES))
def test_values_of_another_type_than_the_feature_are_refused_at_their_line(tmp_path, case):
    features, fragment, message = WRONG_VALUE_TYPES[case]
    text = source(features)
    folder = write_defs(tmp_path, text)
    assert f"{folder / 'src.yaml'}:{line_with(text, fragment)}: {message}" in problems_of(folder)


def test_doing_what_the_message_says_loads_the_values_as_written(tmp_path):
    features = (
        "    - {name: country, type: string, allowed_values: [NO, SE, '1010']}\n"
        "    - {name: late, type: bool, allowed_values: [yes]}\n"
        "    - {name: orders, type: int, min_value: 0, max_value: 7, allowed_values: [0, 7]}\n"
        "    - {name: score, type: float, min_value: 0, max_value: 0.5, max_null_fraction: 1}\n"
    )
    assert "found NO, which YAML reads as the boolean false: quote it: 'NO'" in problems_of(write_defs(tmp_path / "a", source(features)))
    quoted = features.replace("[NO, SE,", "['NO', SE,")
    src = load_definitions(write_defs(tmp_path / "b", source(quoted))).sources["src"]
    assert src.feature("country").allowed_values == ["NO", "SE", "1010"]
    assert src.feature("late").allowed_values == [True]
    assert (src.feature("orders").min_value, src.feature("orders").max_value, src.feature("orders").allowed_values) == (0, 7, [0, 7])
    assert (src.feature("score").min_value, src.feature("score").max_value, src.feature("score").max_null_fraction) == (0, 0.5, 1)


def test_on_tie_is_fail_unless_keep_one_and_another_value_is_refused_at_its_line(tmp_path):
    features = "    - {name: a, type: float}\n"
    assert load_definitions(write_defs(tmp_path / "a", source(features))).sources["src"].on_tie == "fail"
    kept = load_definitions(write_defs(tmp_path / "b", source(features, extra="  on_tie: keep_one\n"))).sources["src"]
    assert kept.on_tie == "keep_one"
    text = source(features, extra="  on_tie: first\n")
    folder = write_defs(tmp_path / "c", text)
    expected = f"{folder / 'src.yaml'}:{line_with(text, 'on_tie')}: source.on_tie: Input should be 'fail' or 'keep_one'"
    assert expected in problems_of(folder)


def test_a_boolean_ttl_is_refused_at_its_line(tmp_path):
    entities = ENTITIES + "    ttl_seconds: on\n"  # YAML 1.1: true, which lax parsing took for 1 second
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n"), entities=entities)
    expected = f"{folder / 'entities.yaml'}:{line_with(entities, 'ttl_seconds')}: entities.0.ttl_seconds: Input should be a valid integer"
    assert expected in problems_of(folder)


def test_expectation_arguments_must_name_one_column_and_fit_its_type(tmp_path):
    text = source("    - {name: country, type: string}\n    - {name: orders, type: int}\n") + (
        "  expectations:\n"
        "    - type: expect_column_values_to_be_in_set\n"
        "      kwargs: {column: country, value_set: [DK, 'NO', off]}\n"
        "    - type: expect_column_values_to_be_between\n"
        "      kwargs:\n"
        "        column: [country, orders]\n"
        "        min_value: 0\n"
        "    - type: expect_column_values_to_be_between\n"
        "      kwargs:\n"
        "        column: consumer_id\n"
        "        min_value: '1'\n"
    )
    folder = write_defs(tmp_path, text)
    problems = problems_of(folder)
    path = folder / "src.yaml"
    assert (
        f"{path}:{line_with(text, 'value_set')}: source 'src': expectations[0] expect_column_values_to_be_in_set: kwargs.value_set.2: "
        "expected a string (column 'country' is of type string), found off, which YAML reads as the boolean false: quote it: 'off'"
    ) in problems
    assert (
        f"{path}:{line_with(text, 'type: expect_column_values_to_be_between')}: "
        "source 'src': expectations[1] expect_column_values_to_be_between: "
        "kwargs.column: expected one column name, found a list: write one expectation per column"
    ) in problems
    # a key column has its entity's key type
    assert (
        f"{path}:{line_with(text, 'min_value: ' + repr('1'))}: "
        "source 'src': expectations[2] expect_column_values_to_be_between: kwargs.min_value: "
        "expected an integer (column 'consumer_id' is of type int), found '1', a string: write an integer, unquoted"
    ) in problems
    assert len(problems.split("\n")) == 1 + 3, problems


def test_long_layout_features_reading_the_same_name_are_refused(tmp_path):
    features = "    - {name: rating, type: float}\n    - {name: orders, type: int}\n    - {name: rating_int, type: int, column: rating}\n"
    text = source(features).replace("layout: wide\n", "layout: long\n  name_column: feature_name\n  value_column: value\n")
    folder = write_defs(tmp_path / "long", text)
    assert (
        f"{folder / 'src.yaml'}:{line_with(text, 'name: rating_int')}: source 'src': "
        f"features 'rating' (line {line_with(text, 'name: rating,')}) "
        "and 'rating_int' both read the rows where feature_name is 'rating': a long layout gives each name to one feature "
        "(set another 'column', or drop one)"
    ) in problems_of(folder)
    # a wide layout may read one column into two features: each is a select of its own
    wide = load_definitions(write_defs(tmp_path / "wide", source(features))).sources["src"]
    assert [f.source_column for f in wide.features] == ["rating", "orders", "rating"]


def load_within(folder: Path, seconds: float = 10) -> DefinitionError:
    """The loader's DefinitionError; a failure, not a hung test, when a read blocks (a FIFO)."""
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_definitions(folder)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # let the blocked reader go before failing
        for fifo in (p for p in folder.iterdir() if p.is_fifo()):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert outcome, f"the loader blocked for {seconds}s"
    assert isinstance(outcome[0], DefinitionError), repr(outcome[0])
    return outcome[0]


def test_unreadable_definition_files_are_named_not_crashes(tmp_path):
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n"))
    (folder / "a_folder.yaml").mkdir()
    (folder / "b_dangling.yaml").symlink_to(tmp_path / "gone.yaml")
    os.mkfifo(folder / "c_pipe.yaml")
    error = load_within(folder)
    assert error.problems == [
        f"{folder / 'a_folder.yaml'}: is a directory, not a YAML file (every *.yaml in its folder is read: rename or move it)",
        f"{folder / 'b_dangling.yaml'}: cannot read: No such file or directory (a symlink to {tmp_path / 'gone.yaml'})",
        f"{folder / 'c_pipe.yaml'}: not a regular file (a FIFO, socket or device): expected YAML text",
    ]


def test_a_feature_service_listing_a_feature_twice_is_refused(tmp_path):
    """Readers map a response's columns by position: a feature twice, by the same reference or
    through its source's name, is a mistake in the definitions."""
    folder = write_defs(tmp_path, source("    - {name: a, type: float}\n    - {name: b, type: float}\n"))
    (folder / "services.yaml").write_text(
        "feature_services:\n  - {name: twice, features: [src:a, src:b, src:a]}\n  - {name: both, features: [src:b, src]}\n"
    )
    text = problems_of(folder)
    assert "feature service 'twice': feature 'src:a' is listed twice ('src:a' and 'src:a')" in text
    assert "feature service 'both': feature 'src:b' is listed twice ('src:b' and 'src')" in text
    (folder / "services.yaml").write_text("feature_services:\n  - {name: once, features: [src:a, src:b]}\n")
    assert load_definitions(folder).services["once"].features == ["src:a", "src:b"]

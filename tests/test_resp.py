"""The column-wise RESP builder, byte for byte against redis-py's own command packer."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from redis.connection import PythonRespSerializer

from serializers.resp import WRITE_SCRIPT, WRITE_SCRIPT_SHA, entity_commands

FIELDS = [b"\x01\x02\x03\x04", b"abcd", b"\x00\x00\x00\x00"]
FRESH = b"TSTS"
SUB = b"USUS"
HORIZON = 1795392000


def pack(*args: bytes) -> bytes:
    """redis-py's packing of one command (the independent expectation)."""
    return b"".join(PythonRespSerializer(6000, lambda v: v).pack(*args))


def expected(key: bytes, values: list[bytes | None], stamp: bytes, ttl: int | None, micros: int | None = None) -> bytes:
    """``micros`` (a source by event time): the write's microseconds past its second, set among the
    pairs (before the freshness field) when not 0, deleted after the null features when 0."""
    fields, values = list(FIELDS), list(values)
    if micros is not None:
        fields.append(SUB)
        values.append(str(micros).encode() if micros else None)
    pairs = [x for fid, value in zip(fields, values) if value is not None for x in (fid, value)]
    nulls = [fid for fid, value in zip(fields, values) if value is None]
    ttl_arg = str(ttl or 0).encode()
    count = str(len(pairs) // 2 + 1).encode()
    order = (b"", b"0") if micros is None else (SUB, str(micros).encode())
    return pack(b"EVALSHA", WRITE_SCRIPT_SHA, b"1", key, ttl_arg, str(HORIZON).encode(), count, *order, *pairs, FRESH, stamp, *nulls)


def test_script_sha_is_the_sha1_of_the_script():
    import hashlib

    assert WRITE_SCRIPT.startswith(b"#!lua\n")  # flags declared: OOM refuses it whole, before it runs
    assert WRITE_SCRIPT_SHA == hashlib.sha1(WRITE_SCRIPT).hexdigest().encode()


ROWS = [
    (b"c:1", [b"0.5", b"", b"x" * 5000]),  # empty value, long value (formatted, not tabled)
    (b"c:22", [None, b"7", None]),
    (b"c:\xc3\xa9:3", [None, None, None]),  # only the freshness field is set
    (b"c:4", [b"\r\n", b"$1", b"*2"]),  # protocol bytes inside values are just data
]


@pytest.mark.parametrize("ttl", [None, [86400, 90000, 7, 10**9]])
@pytest.mark.parametrize("per_row_stamp", [False, True])
def test_entity_commands_match_redis_py_packing(ttl, per_row_stamp):
    keys = pa.array([k for k, _ in ROWS], pa.binary())
    columns = [pa.array([values[j] for _, values in ROWS], pa.binary()) for j in range(len(FIELDS))]
    stamps = [1700000000, 5, 1800000000, 1700000000]
    freshness = pa.array(stamps, pa.int64()) if per_row_stamp else b"1700000000"
    cmds = entity_commands(keys, columns, FIELDS, FRESH, freshness, None if ttl is None else np.array(ttl), horizon=HORIZON)
    for i, (key, values) in enumerate(ROWS):
        stamp = str(stamps[i]).encode() if per_row_stamp else b"1700000000"
        assert cmds.wire[i].as_py() == expected(key, values, stamp, None if ttl is None else ttl[i])
    assert cmds.values_set.tolist() == [3, 1, 0, 3]
    # a chunk's wire bytes are its entities' commands back to back
    assert bytes(cmds.wire_bytes(1, 3)) == cmds.wire[1].as_py() + cmds.wire[2].as_py()


def test_a_source_by_event_time_sends_its_microseconds_and_sets_or_deletes_its_sub_second_field():
    keys = pa.array([k for k, _ in ROWS], pa.binary())
    columns = [pa.array([values[j] for _, values in ROWS], pa.binary()) for j in range(len(FIELDS))]
    stamps, micros = [1700000000, 5, 1800000000, 1700000000], [0, 750000, 1, 999999]
    cmds = entity_commands(
        keys, columns, FIELDS, FRESH, pa.array(stamps, pa.int64()), horizon=HORIZON, subsecond=(SUB, pa.array(micros, pa.int64()))
    )
    for i, (key, values) in enumerate(ROWS):
        assert cmds.wire[i].as_py() == expected(key, values, str(stamps[i]).encode(), None, micros[i])
    assert cmds.values_set.tolist() == [3, 1, 0, 3]  # the sub-second field is not a feature value


def test_a_command_of_version_1_4_byte_for_byte():
    # the golden bytes serializers/FORMAT.md shows: key c:7, no TTL, one feature (field 01020304,
    # value "5"), as of 1795863600.75 (the sub-second field USUS stands for xxh32("_us:<source>"))
    [wire] = entity_commands(
        pa.array([b"c:7"]), [pa.array([b"5"])], [b"\x01\x02\x03\x04"], FRESH, pa.array([1795863600]),
        horizon=HORIZON, subsecond=(SUB, pa.array([750000])),
    ).wire.to_pylist()  # fmt: skip
    assert wire == (
        b"*15\r\n$7\r\nEVALSHA\r\n$40\r\n" + WRITE_SCRIPT_SHA + b"\r\n$1\r\n1\r\n$3\r\nc:7\r\n$1\r\n0\r\n$10\r\n1795392000\r\n"
        b"$1\r\n3\r\n$4\r\nUSUS\r\n$6\r\n750000\r\n$4\r\n\x01\x02\x03\x04\r\n$1\r\n5\r\n$4\r\nUSUS\r\n$6\r\n750000\r\n"
        b"$4\r\nTSTS\r\n$10\r\n1795863600\r\n"
    )


def test_the_format_doc_shows_the_script_the_writers_load():
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "serializers" / "FORMAT.md").read_text()
    shown = doc.split("```lua\n", 1)[1].split("```", 1)[0]
    assert "".join(line.removeprefix("  ") + "\n" for line in shown.splitlines() if line.strip()).encode() == WRITE_SCRIPT

"""Redis commands for a whole batch of entities, built column-wise as RESP bytes.

Building commands argument by argument in Python (what a client library does) costs
more than the Redis server spends running them. Here each entity's command becomes one
value of an Arrow binary array, assembled by Arrow compute from the encoded feature
columns, so no Python object is made per value. The array's data buffer then holds the
wire bytes of any run of consecutive entities: a pipeline chunk is a zero-copy slice.

Per entity (FORMAT.md), one ``EVALSHA`` of :data:`WRITE_SCRIPT`, which on
the server, atomically:

- leaves the hash as it is (replies 0) when its freshness field for this source holds a
  later as-of time than this write's, up to the horizon: an older snapshot never replaces
  a newer one, whoever writes it and in whatever order;
- else ``HSET``s every non-null feature and the freshness field, ``HDEL``s the source's
  null features, and ``EXPIRE``s the key (``PERSIST`` when the entity type has no TTL),
  and replies 1, or 2 when the stored as-of time was beyond the horizon: later than any
  date a run accepts (``serializers.horizon``), so corrupt, and replaced.

The script declares its flags (``#!lua``), so Redis refuses it whole with ``OOM`` before
it runs when memory is full: an entity gets all of its commands or none.

Arguments: ``KEYS[1]`` the key; ``ARGV`` the TTL (0: none), the horizon (UTC epoch seconds,
from the writer's clock, not the server's), the number of (field, value) pairs, the
sub-second field and the write's microseconds past its second (``""`` and ``0`` for a source
selected by date, which has none), the pairs with the freshness field last, then the fields
to delete. Of two as-of times in the same second, the one with more microseconds is later
(a stored sub-second field absent: 0); the sub-second field is set among the pairs when the
write has microseconds, and deleted among the fields to delete when it has none. A value's
argument is written as ``\\r\\n$4\\r\\n<fid>\\r\\n$<len>\\r\\n<value>``: the CRLF that ends
each argument leads the next one, so a null value (no argument at all) is an empty piece,
and the freshness argument, always present, closes the pairs.

The reader builds its commands (``HMGET``, ``PING``) with :func:`bulks`, :func:`command` and
:func:`key_command_format` too; it runs without pyarrow, so Arrow is imported only by the
functions that build a batch's commands, not with the module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

CRLF = b"\r\n"

WRITE_SCRIPT = b"""#!lua
local last = 5 + 2 * tonumber(ARGV[3])
local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[last - 1]))
local reply = 1
if stored then
  local new = tonumber(ARGV[last])
  local later = stored > new
  if stored == new and ARGV[4] ~= '' then
    later = (tonumber(redis.call('HGET', KEYS[1], ARGV[4])) or 0) > tonumber(ARGV[5])
  end
  if later then
    if stored <= tonumber(ARGV[2]) then return 0 end
    reply = 2
  end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6, last))
if #ARGV > last then redis.call('HDEL', KEYS[1], unpack(ARGV, last + 1)) end
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return reply
"""
"""The conditional write of one entity and source (see the module docstring)."""
WRITE_SCRIPT_SHA = hashlib.sha1(WRITE_SCRIPT).hexdigest().encode()
MAX_FEATURES = 3000
"""Features of one source in one script call: Lua's unpack takes about 8,000 values."""
WRITTEN, SKIPPED_NEWER, REPLACED_FUTURE = 1, 0, 2
"""The script's replies (REPLACED_FUTURE: written over an as-of time beyond the horizon)."""


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def bulks(args: Iterable[bytes]) -> bytes:
    """RESP bulk strings one after another: a command's arguments without its array header."""
    return b"".join(bulk(a) for a in args)


def command(*args: bytes) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + bulks(args)


def key_command_format(name: bytes) -> bytes:
    """The command ``name`` on one key, as a %-format of its arguments: ``fmt % (count,
    len(key), key, rest)`` is one command, ``rest`` the arguments after the key already as
    RESP (:func:`bulks`, made once and kept) and ``count`` every argument, name and key
    included. For a hot path: one formatting per command, no call."""
    return b"*%%d\r\n%s$%%d\r\n%%s\r\n%%s" % bulk(name).replace(b"%", b"%%")


@dataclass(frozen=True)
class EntityCommands:
    wire: pa.Array
    """One binary value per entity: its command (one reply each)."""
    values_set: np.ndarray
    """Per entity: feature values in its HSET (the freshness field not counted)."""

    def __len__(self) -> int:
        return len(self.wire)

    def wire_bytes(self, start: int, stop: int) -> memoryview:
        """The commands of entities ``start``..``stop-1`` as one buffer, without copying."""
        arr = self.wire
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]
        data = arr.buffers()[2]
        return memoryview(data)[int(offsets[start]) : int(offsets[stop])]


def _decimal(values: pa.Array | np.ndarray) -> pa.Array:
    """Decimal ASCII of integers, as a binary array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, np.ndarray):
        values = pa.array(values)
    return pc.cast(pc.cast(values, pa.string()), pa.binary())


def _join(*pieces, nulls_as_empty: bool = False) -> pa.Array:
    """Row-wise concatenation; a null piece makes the row null unless ``nulls_as_empty``."""
    import pyarrow.compute as pc

    if nulls_as_empty:
        return pc.binary_join_element_wise(*pieces, b"", null_handling="replace", null_replacement=b"")
    return pc.binary_join_element_wise(*pieces, b"")


_SHORT = 4096


def _value_heads(prefix: bytes, col: pa.Array) -> pa.Array:
    """``prefix + <len> + CRLF`` per value (null for null values).

    Values are short (a float is a few bytes, an embedding ~130), so the heads of every
    length up to the longest are made once and picked by length: a gather, no formatting.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths = pc.binary_length(col)
    longest = pc.max(lengths).as_py() or 0
    if longest >= _SHORT:
        return _join(prefix, _decimal(lengths), CRLF)
    table = pa.array([prefix + b"%d\r\n" % size for size in range(longest + 1)], pa.binary())
    return pc.take(table, lengths)


def entity_commands(
    keys: pa.Array,
    columns: Sequence[pa.Array],
    fields: Sequence[bytes],
    freshness_field: bytes,
    freshness: bytes | pa.Array,
    ttl: pa.Array | np.ndarray | None = None,
    *,
    horizon: int,
    subsecond: tuple[bytes, pa.Array] | None = None,
) -> EntityCommands:
    """The RESP command of each entity (see the module docstring).

    ``keys``: binary, the full Redis key per entity. ``columns``: encoded feature values
    (binary, null where not written) in the order of ``fields``. ``freshness``: the as-of
    value, one for all or one per entity. ``ttl``: seconds per entity, or None.
    ``horizon``: a stored as-of time later than this is replaced (``serializers.horizon``).
    ``subsecond``: a source selected by event time: its sub-second field and, per entity,
    the microseconds of its as-of time past the second (0 to 999,999).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(fields) > MAX_FEATURES:
        raise ValueError(f"{len(fields)} features in one source: at most {MAX_FEATURES} fit one write script call")
    n = len(keys)
    columns, fields, order = _ordered(columns, fields, subsecond)
    keys = keys.cast(pa.binary())
    key_arg = _join(b"$", _decimal(pc.binary_length(keys)), CRLF, keys)  # no CRLF: see module docstring
    valid = _valid(columns, n)
    values_set = valid.sum(axis=0, dtype=np.int64)
    nulls = len(columns) - values_set

    seconds = _decimal(np.zeros(n, np.int64) if ttl is None else ttl)
    pairs = _decimal(values_set + 1)
    # EVALSHA sha 1 key ttl horizon pairs subsecond-field micros, the pairs' 2 arguments each, the deletes
    head = b"\r\n$7\r\nEVALSHA\r\n$40\r\n" + WRITE_SCRIPT_SHA + b"\r\n$1\r\n1\r\n"
    pieces: list = [
        _join(b"*", _decimal(2 * values_set + nulls + 11), head, key_arg, CRLF),
        _join(
            b"$",
            _decimal(pc.binary_length(seconds)),
            CRLF,
            seconds,
            CRLF + bulk(b"%d" % horizon) + b"$",
            _decimal(pc.binary_length(pairs)),
            CRLF,
            pairs,
            order,
        ),
    ]
    for fid, col in zip(fields, columns):
        pieces += [_value_heads(b"\r\n$4\r\n" + fid + b"\r\n$", col), col]
    pieces.append(_freshness_piece(freshness_field, freshness))
    pieces += _deletes(fields, valid)
    if subsecond is not None:
        values_set = values_set - valid[-1]
    return EntityCommands(wire=_join(*pieces, nulls_as_empty=True), values_set=values_set)


def _valid(columns: Sequence[pa.Array], n: int) -> np.ndarray:
    """Per column and entity: whether the value is written (not null)."""
    valid = np.zeros((len(columns), n), dtype=bool)
    for j, col in enumerate(columns):
        valid[j] = np.asarray(col.is_valid().to_numpy(zero_copy_only=False))
    return valid


def _freshness_piece(freshness_field: bytes, freshness: bytes | pa.Array):
    """The freshness pair, the last of the pairs: one value for all, or one per entity."""
    import pyarrow.compute as pc

    fresh_head = b"\r\n$4\r\n" + freshness_field + b"\r\n"
    if isinstance(freshness, bytes):
        return fresh_head + bulk(freshness)
    stamp = _decimal(freshness)
    return _join(fresh_head + b"$", _decimal(pc.binary_length(stamp)), CRLF, stamp, CRLF)


def _ordered(columns: Sequence[pa.Array], fields: Sequence[bytes], subsecond: tuple[bytes, pa.Array] | None) -> tuple[list, list, object]:
    """The columns and fields with the sub-second field's (set where not 0, else deleted: a
    column null where 0), and the script's two ordering arguments (``""`` and ``0``: none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if subsecond is None:
        return list(columns), list(fields), pa.scalar(b"\r\n$0\r\n\r\n$1\r\n0")
    micros = subsecond[1].cast(pa.int64())
    text = _decimal(micros)
    column = pc.if_else(pc.equal(micros, 0), pa.scalar(None, pa.binary()), text)
    order = _join(b"\r\n$4\r\n" + subsecond[0] + b"\r\n$", _decimal(pc.binary_length(text)), CRLF, text)
    return [*columns, column], [*fields, subsecond[0]], order


def _deletes(fields: Sequence[bytes], valid: np.ndarray) -> list:
    """The HDEL arguments: per field with a null value, its bulk string where the value is null
    (null elsewhere, an empty piece)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    null = pa.scalar(None, pa.binary())
    return [pc.if_else(pa.array(~valid[j]), pa.scalar(bulk(fid)), null) for j, fid in enumerate(fields) if not valid[j].all()]

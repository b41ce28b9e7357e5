"""The record store's write-ahead-log payload: one :class:`~addon.records.schema.CallRecord` per frame.

Contract
--------
``encode(parts)`` takes a record as :func:`~addon.records.schema.row_parts` gives it, returns the frame payload and
raises ValueError for a row that does not fit :data:`~addon.records.schema.SCHEMA` (the check
:func:`~addon.records.schema.rows_batch` makes, done here without Arrow), so a row the WAL acknowledged always
converts when its shard is written. ``decode(payload)`` returns a record equal to the one encoded (built, and so
checked, as :class:`~addon.records.schema.CallRecord`). The payload is a msgpack map: the scalar columns
(timestamps as msgpack timestamps, UTC; the JSON columns as their text) and the three token columns as raw
little-endian int32 / float32 bytes (the arrays :class:`~addon.records.schema.TurnTokens` already packed, copied
once).

WAL format 1 held one Arrow IPC record batch per frame instead (:func:`decode_arrow` reads it, for segments a
crashed older proxy left). Why it changed: pyarrow converts one row in ~0.3 ms of per-call overhead over 35 columns
(0.5-0.6 ms in a loaded proxy), on the path between the engine's last token and the client's final event; this
encoding costs ~0.03 ms, and the store converts its buffered records in bulk when it writes a shard (~0.06 ms a
row). Measured in benchmarks/results/round12.md.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
import pyarrow as pa

from addon.records.schema import SCALARS, SCHEMA, CallRecord, RowParts, from_row

if sys.byteorder != "little":
    raise ImportError("addon.records.frames writes token ids as little-endian int32: not on a big-endian host")

_TOKENS = ("prompt_ids", "completion_ids", "completion_logprobs")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def _fits(t: pa.DataType) -> Callable[[Any], bool]:
    """Whether a Python value converts to Arrow type ``t`` (the types SCHEMA's scalar columns use)."""
    if pa.types.is_string(t):
        return lambda v: isinstance(v, str)
    if pa.types.is_binary(t):
        return lambda v: isinstance(v, bytes)
    if pa.types.is_boolean(t):
        return lambda v: isinstance(v, bool)
    if pa.types.is_integer(t):
        lo, hi = -(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    if pa.types.is_timestamp(t):
        return lambda v: isinstance(v, datetime) and v.utcoffset() is not None
    if pa.types.is_list(t) and pa.types.is_string(t.value_type):
        return lambda v: isinstance(v, tuple | list) and all(isinstance(x, str) for x in v)
    raise TypeError(f"no frame check for Arrow type {t}")  # a new column type: add its check


_CHECKS = tuple((f.name, f.nullable, _fits(f.type)) for f in SCALARS)


def encode(parts: RowParts) -> bytes:
    scalars, tokens = parts
    for name, nullable, fits in _CHECKS:
        value = scalars[name]
        if not (fits(value) or (value is None and nullable)):
            raise ValueError(f"record does not fit the schema: {name}={value!r:.200}")
    row = dict(scalars)
    for name, arr in zip(_TOKENS, tokens, strict=True):
        width = arr.type.byte_width
        row[name] = memoryview(arr.buffers()[1])[arr.offset * width : (arr.offset + len(arr)) * width]
    try:
        return _encode(row)
    except (UnicodeEncodeError, msgspec.EncodeError) as e:  # a string that is not UTF-8 (lone surrogates)
        raise ValueError(f"record does not fit the schema: {e}") from e


def decode(payload: bytes) -> CallRecord:
    """The record of a payload; ValueError for one that is not a record of this schema."""
    try:
        row = _decode(payload)
        prompt, completion, logprobs = array("i"), array("i"), array("f")
        prompt.frombytes(row["prompt_ids"])
        completion.frombytes(row["completion_ids"])
        logprobs.frombytes(row["completion_logprobs"])
        row.update(prompt_ids=prompt, completion_ids=tuple(completion), completion_logprobs=tuple(logprobs))
        return from_row(row)
    except (msgspec.DecodeError, KeyError, TypeError) as e:
        raise ValueError(f"WAL frame is not a record of this schema: {e!r:.200}") from e


def decode_arrow(payload: bytes) -> CallRecord:
    """A WAL format 1 frame (one Arrow IPC record batch of SCHEMA) as a record."""
    batch = pa.ipc.read_record_batch(pa.py_buffer(payload), SCHEMA)
    return from_row(batch.to_pylist()[0])


__all__ = ["decode", "decode_arrow", "encode"]

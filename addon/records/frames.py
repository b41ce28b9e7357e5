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

Delta frames (WAL format 3). A call's prompt is mostly its parent's prompt and answer
(``prompt_reused_tokens`` ids of them, docs/records.md), so a frame that held every prompt id wrote and fsynced the
whole context on every call: ~0.5 MB of ids at 128k tokens, between the engine's last token and the client's final
event. ``encode(parts, base=PromptBase(parent, n))`` writes only the ids after the first ``n`` and names the call
whose prompt + completion begin with them; the store does this only when the parent's own frame sits in a segment it
keeps as long as this one (:mod:`addon.records.store`). :class:`FrameReader` decodes a segment sequence in order and
rebuilds each such prompt from the calls it has read; a frame whose parent no earlier frame holds is refused
(ValueError), never guessed.

Request deltas (WAL format 4). The ``request_canonical`` blob of a tool loop's call repeats its parent's first bytes:
the zstd frames of the history's sealed segments (:mod:`addon.records.blob_frames`). Written whole, it was the
largest O(context) part of a frame (~200 KB at 128k tokens, against ~15 KB at 8k). A delta frame whose
``PromptBase.request_bytes`` is set holds only the blob's bytes after that many of the parent's
(:func:`request_base`); the reader puts the parent's bytes back in front.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import msgspec
import pyarrow as pa

from addon.records.schema import SCALARS, SCHEMA, CallRecord, RowParts, from_row
from addon.records.token_ids import FrozenIds

if sys.byteorder != "little":
    raise ImportError("addon.records.frames writes token ids as little-endian int32: not on a big-endian host")

_TOKENS = ("prompt_ids", "completion_ids", "completion_logprobs")
_BASE = "prompt_base"  # a delta frame's (parent call id, ids taken from it)
_REQUEST_BASE = "request_base"  # a delta frame's bytes of request_canonical taken from its parent's (format 4)
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


@dataclass(frozen=True)
class PromptBase:
    """The first ``tokens`` prompt ids of a record are the first ``tokens`` ids of call ``parent``'s prompt +
    completion; its ``request_canonical`` blob begins with the first ``request_bytes`` bytes of the parent's
    (0: the frame holds the whole blob)."""

    parent: str
    tokens: int
    request_bytes: int = 0


MIN_SHARED_BYTES: Final = 4096  # a shorter common start of two request blobs is not worth a delta
_BLOCK = 65536  # shared_prefix compares this many bytes at a time, then bisects the first block that differs


def shared_prefix(a: bytes, b: bytes) -> int:
    """How many bytes ``a`` and ``b`` have in common from the start. ``bytes.startswith`` at an offset is one memcmp
    (~0.02 ms for two 200 KB blobs that share most of their bytes); a memoryview's ``==`` compared 16 KB in ~33 us,
    element by element."""
    end = min(len(a), len(b))
    lo = 0
    while lo < end:
        hi = min(lo + _BLOCK, end)
        if not a.startswith(b[lo:hi], lo):
            break
        lo = hi
    else:
        return end
    # a[:lo] == b[:lo], and they differ before hi: halve [lo, hi) until the first difference is at lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def request_base(parent: bytes, blob: bytes) -> int:
    """How many bytes of ``blob`` a delta frame takes from its parent's request blob ``parent``: their common start
    when it is at least :data:`MIN_SHARED_BYTES`, else 0 (the frame holds the whole blob)."""
    shared = shared_prefix(parent, blob)
    return shared if shared >= MIN_SHARED_BYTES else 0


def raw(arr: pa.Array) -> memoryview:
    """The values of an int32 / float32 Arrow array without nulls, as bytes (no copy)."""
    width = arr.type.byte_width
    return memoryview(arr.buffers()[1]).cast("B")[arr.offset * width : (arr.offset + len(arr)) * width]


def extends(child: pa.Array, n: int, parent: tuple[pa.Array, pa.Array]) -> bool:
    """Whether the first ``n`` ids of ``child`` (a prompt) are the first ``n`` of ``parent``'s prompt + completion
    (Arrow's comparison of the int32 values: ~20 us for 128k ids, where a memoryview's ``==`` takes 1.5 ms)."""
    prompt, completion = parent
    if n > len(child) or n > len(prompt) + len(completion):
        return False
    head = min(n, len(prompt))
    return bool(
        child.slice(0, head).equals(prompt.slice(0, head))
        and child.slice(head, n - head).equals(completion.slice(0, n - head))
    )


def encode(parts: RowParts, base: PromptBase | None = None) -> bytes:
    """The frame of a row; with ``base``, one that holds only the prompt ids after ``base.tokens`` (the caller
    checked that the parent's ids begin the prompt: :func:`extends`)."""
    scalars, tokens = parts
    for name, nullable, fits in _CHECKS:
        value = scalars[name]
        if not (fits(value) or (value is None and nullable)):
            raise ValueError(f"record does not fit the schema: {name}={value!r:.200}")
    row = dict(scalars)
    for name, arr in zip(_TOKENS, tokens, strict=True):
        row[name] = raw(arr)
    if base is not None:
        if not 0 < base.tokens <= len(tokens[0]):
            raise ValueError(f"a prompt base of {base.tokens} ids for a prompt of {len(tokens[0])}")
        row["prompt_ids"] = raw(tokens[0].slice(base.tokens))
        row[_BASE] = (base.parent, base.tokens)
        if base.request_bytes:
            blob = scalars["request_canonical"]
            if not 0 < base.request_bytes <= len(blob):
                raise ValueError(f"a request base of {base.request_bytes} bytes for a blob of {len(blob)}")
            row["request_canonical"] = memoryview(blob)[base.request_bytes :]
            row[_REQUEST_BASE] = base.request_bytes
    try:
        return _encode(row)
    except (UnicodeEncodeError, msgspec.EncodeError) as e:  # a string that is not UTF-8 (lone surrogates)
        raise ValueError(f"record does not fit the schema: {e}") from e


class FrameReader:
    """Decodes the frames of a WAL in the order they were written (format 1, 2 or 3), holding each call's prompt
    and completion ids so that a later delta frame's prompt can be rebuilt from them."""

    def __init__(self) -> None:
        self._sequences: dict[str, tuple[array[int], array[int]]] = {}
        self._requests: dict[str, bytes] = {}  # call id -> its request_canonical blob (the record's own bytes)

    def decode(self, payload: bytes, format_version: int = 3) -> CallRecord:
        """The record of a payload; ValueError for one that is not a record of this schema, or whose parent
        (a delta frame's) no frame read before it holds."""
        if format_version == 1:
            record = decode_arrow(payload)
            self._sequences[record.call_id] = (
                array("i", record.tokens.prompt_ids),
                array("i", record.tokens.completion_ids),
            )
            self._requests[record.call_id] = record.request_canonical
            return record
        try:
            row = _decode(payload)
            prompt, completion, logprobs = array("i"), array("i"), array("f")
            base = row.pop(_BASE, None)
            if base is not None:
                parent, n = base
                if parent not in self._sequences:
                    raise ValueError(
                        f"WAL frame of {row.get('call_id')!r} extends {parent!r}, which no earlier frame holds"
                    )
                parent_prompt, parent_completion = self._sequences[parent]
                prompt.extend(parent_prompt[:n])
                prompt.extend(parent_completion[: n - len(prompt)])
                if len(prompt) != n:
                    raise ValueError(f"WAL frame of {row.get('call_id')!r}: {parent!r} has fewer than {n} ids")
                shared = row.pop(_REQUEST_BASE, 0)
                if shared:
                    parent_request = self._requests[parent]
                    if len(parent_request) < shared:
                        raise ValueError(f"WAL frame of {row.get('call_id')!r}: {parent!r}'s request is shorter")
                    row["request_canonical"] = parent_request[:shared] + row["request_canonical"]
            prompt.frombytes(row["prompt_ids"])
            completion.frombytes(row["completion_ids"])
            logprobs.frombytes(row["completion_logprobs"])
            row.update(prompt_ids=prompt, completion_ids=tuple(completion), completion_logprobs=tuple(logprobs))
            record = from_row(row)
        except (msgspec.DecodeError, KeyError, TypeError) as e:
            raise ValueError(f"WAL frame is not a record of this schema: {e!r:.200}") from e
        held = record.tokens.prompt_ids  # the record's packed copy of these ids: hold that one, not a second
        self._sequences[record.call_id] = (held.packed if isinstance(held, FrozenIds) else prompt, completion)
        self._requests[record.call_id] = record.request_canonical
        return record


def decode(payload: bytes) -> CallRecord:
    """The record of a self-contained payload (no delta); ValueError for one that is not a record of this schema."""
    return FrameReader().decode(payload)


def run_id(payload: bytes, format_version: int) -> str:
    """The run id of a frame, without rebuilding its record (a delta frame needs its parent for that)."""
    if format_version == 1:
        return decode_arrow(payload).run_id
    try:
        value = _decode(payload)["run_id"]
    except (msgspec.DecodeError, KeyError, TypeError) as e:
        raise ValueError(f"WAL frame is not a record of this schema: {e!r:.200}") from e
    if not isinstance(value, str):
        raise ValueError(f"WAL frame has a run_id of {type(value).__name__}")
    return value


def decode_arrow(payload: bytes) -> CallRecord:
    """A WAL format 1 frame (one Arrow IPC record batch of SCHEMA) as a record."""
    batch = pa.ipc.read_record_batch(pa.py_buffer(payload), SCHEMA)
    return from_row(batch.to_pylist()[0])


__all__ = [
    "MIN_SHARED_BYTES",
    "FrameReader",
    "PromptBase",
    "decode",
    "decode_arrow",
    "encode",
    "extends",
    "raw",
    "request_base",
    "run_id",
    "shared_prefix",
]

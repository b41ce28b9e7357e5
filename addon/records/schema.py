"""Call records: one typed row per model call, its versioned Arrow schema, and readers over Parquet shards.

Contract
--------
* :class:`CallRecord` is one model call as the capture addon saw it; token data travels in :class:`TurnTokens`
  (``prompt_ids``, ``completion_ids``, ``completion_logprobs``), checked on construction. Both are frozen.
* :data:`SCHEMA` is the explicit Arrow schema of the Parquet shards (field by field in ``docs/records.md``); its
  metadata carries :data:`SCHEMA_VERSION`. Bump the version on any change to the fields or their meaning.
* :func:`to_batch` / :func:`records_from_table` convert between records and Arrow (a one-row record batch is also
  what the write-ahead log stores, so WAL, shards and readers share one conversion).
* :func:`pack_json` / :func:`unpack_json` (from :mod:`addon.records.blobs`, re-exported here) make and read the
  zstd-compressed JSON of ``request_canonical`` and ``completion_canonical`` (standard zstd frames: ``zstd -d``
  reads them too); :mod:`addon.records.blobs` also has the per-message cache that keeps building them cheap.
* :func:`read_records` reads every shard of one or many run folders, local or on any pyarrow filesystem, through
  ``pyarrow.dataset``; :func:`iter_sessions` splits such a table into sessions ordered by ``call_index``.

The durable writer is :class:`addon.records.store.RecordStore`. Nothing here imports mitmproxy.

Layout: schema, typed records, Arrow conversion, readers.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from addon.records import token_ids
from addon.records.blobs import pack_json as pack_json  # re-exported: the blob columns' encoding
from addon.records.blobs import unpack_json as unpack_json
from converters.canonical import WIRE_FORMATS, FinishReason, WireFormat

SCHEMA_VERSION: Final = 2  # 2: engine_wait_ms
SCHEMA_VERSION_KEY: Final = b"harnessrl.schema_version"
RUN_ID_KEY: Final = b"harnessrl.run_id"
SHARD_NAME: Final = re.compile(r"^shard-(\d{5,})\.parquet$")

_TS = pa.timestamp("us", tz="UTC")
SCHEMA: Final = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("call_index", pa.int32(), nullable=False),
        pa.field("call_id", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("harness_version", pa.string()),
        pa.field("wire_format", pa.string(), nullable=False),
        pa.field("route", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("served_model", pa.string()),
        pa.field("policy_version", pa.int64()),
        pa.field("received_at", _TS, nullable=False),
        pa.field("first_token_at", _TS),
        pa.field("done_at", _TS, nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("tool_call_names", pa.list_(pa.string()), nullable=False),
        pa.field("tool_call_count", pa.int32(), nullable=False),
        pa.field("auxiliary", pa.bool_(), nullable=False),
        pa.field("auxiliary_reason", pa.string()),
        pa.field("sampling_requested", pa.string(), nullable=False),
        pa.field("sampling_applied", pa.string(), nullable=False),
        pa.field("request_canonical", pa.binary(), nullable=False),
        pa.field("completion_canonical", pa.binary()),
        pa.field("error", pa.string()),
        pa.field("budget_stop", pa.string()),
        pa.field("incomplete", pa.bool_(), nullable=False),
        pa.field("identity_hints", pa.string(), nullable=False),
        pa.field("parent_call_id", pa.string()),
        pa.field("fork_reason", pa.string()),
        pa.field("prompt_reused_tokens", pa.int32(), nullable=False),
        pa.field("engine_wait_ms", pa.int32()),
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

_INT32_MAX = 2**31 - 1
# ``error`` of a call sampled to its end whose output held tool-call markup the parser could not read: the text went
# to the harness as text and the ids are trained on like any other answer, so it is a sampled call, not a failed one
MALFORMED_TOOL_CALLS: Final = "malformed_tool_calls="
# The token columns are built over array('i') / array('f') buffers, read as int32 / float32.
if array("i").itemsize != 4 or array("f").itemsize != 4:
    raise ImportError("addon.records.schema needs a platform whose C int and float are 4 bytes")


@dataclass(frozen=True)
class TurnTokens:
    """The exact token ids of one call: the prompt the engine saw, and what it sampled with each token's logprob.

    The ids are also packed once, on construction, into Arrow arrays (``arrow()``): the range checks run on them
    vectorised and :func:`to_batch` uses them as they are, so a 130k-token prompt costs one C-level conversion per
    call instead of a Python-level pass per check and another for the Arrow column.
    """

    # given as any sequence; held as a tuple, or as FrozenIds (a packed copy) when given packed (an array('i'))
    prompt_ids: Sequence[int]
    completion_ids: tuple[int, ...] = ()
    completion_logprobs: tuple[float, ...] = ()
    _arrow: tuple[pa.Array, pa.Array, pa.Array] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Ids already packed (the session graph's array('i')) are held as a packed copy that backs the Arrow column;
        # any other sequence (lists from the engine or a shard) as a tuple: a record cannot change after the fact.
        ids = self.prompt_ids
        if isinstance(ids, array):
            ids = token_ids.FrozenIds(ids, "prompt_ids")
        elif not isinstance(ids, tuple | token_ids.FrozenIds):
            ids = tuple(ids)
        object.__setattr__(self, "prompt_ids", ids)
        self._set_completion(_pack_ids(ids, "prompt_ids"), self.completion_ids, self.completion_logprobs)

    def with_completion(self, completion_ids: Sequence[int], completion_logprobs: Sequence[float]) -> TurnTokens:
        """These prompt ids with a completion. The prompt half is not checked or packed again: the generator builds
        it while the engine samples, so after the engine only the sampled part is left to pack (a 128k-token
        prompt's tuple and Arrow array cost milliseconds; the completion is a few hundred ids)."""
        tokens = object.__new__(TurnTokens)
        object.__setattr__(tokens, "prompt_ids", self.prompt_ids)
        tokens._set_completion(self._arrow[0], completion_ids, completion_logprobs)
        return tokens

    def _set_completion(self, prompt: pa.Array, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        if not isinstance(ids, tuple):
            ids = tuple(ids)
        try:
            # Round to float32 now, as the column stores them: a record then equals itself read back.
            packed_lp = array("f", logprobs)
        except (OverflowError, TypeError) as e:
            raise ValueError(f"completion_logprobs must be float32 numbers: {e}") from e
        # NaN is allowed: it marks a sampled token the engine gave no logprob for (vLLM sends null for a
        # non-finite value); addon.records.sequences masks such tokens from training.
        lp = pa.Array.from_buffers(pa.float32(), len(packed_lp), [None, pa.py_buffer(packed_lp)])
        if len(ids) != len(packed_lp):
            raise ValueError(
                f"completion_ids has {len(ids)} tokens but completion_logprobs has "
                f"{len(packed_lp)}; each sampled token needs exactly one logprob"
            )
        object.__setattr__(self, "completion_ids", ids)
        object.__setattr__(self, "completion_logprobs", tuple(packed_lp.tolist()))
        object.__setattr__(self, "_arrow", (prompt, _pack_ids(ids, "completion_ids"), lp))

    def arrow(self) -> tuple[pa.Array, pa.Array, pa.Array]:
        """``prompt_ids`` (int32), ``completion_ids`` (int32), ``completion_logprobs`` (float32) as Arrow arrays."""
        return self._arrow


def _pack_ids(ids: Sequence[int], name: str) -> pa.Array:
    """Token ids as an int32 Arrow array over an ``array('i')`` buffer; ValueError outside [0, 2**31)."""
    return token_ids.arrow(token_ids.pack(ids, name))


@dataclass(frozen=True)
class CallRecord:
    """One model call. ``schema_version`` and ``tool_call_count`` are columns derived when the row is written.

    Timestamps must be timezone-aware (they are stored in UTC). ``sampling_*`` and ``identity_hints`` are
    JSON-compatible mappings stored as JSON text; ``request_canonical`` / ``completion_canonical`` are
    :func:`pack_json` bytes.
    """

    run_id: str
    session_id: str
    call_index: int
    call_id: str
    harness: str
    wire_format: WireFormat
    route: str
    model: str
    received_at: datetime
    done_at: datetime
    tokens: TurnTokens
    request_canonical: bytes
    harness_version: str | None = None
    served_model: str | None = None
    policy_version: int | None = None
    first_token_at: datetime | None = None
    finish_reason: FinishReason | None = None
    tool_call_names: tuple[str, ...] = ()
    auxiliary: bool = False
    auxiliary_reason: str | None = None
    sampling_requested: Mapping[str, Any] = field(default_factory=dict)
    sampling_applied: Mapping[str, Any] = field(default_factory=dict)
    completion_canonical: bytes | None = None
    error: str | None = None
    budget_stop: str | None = None
    incomplete: bool = False
    identity_hints: Mapping[str, str] = field(default_factory=dict)
    parent_call_id: str | None = None
    fork_reason: str | None = None
    prompt_reused_tokens: int = 0
    engine_wait_ms: int | None = None  # how long the call waited for an engine that could not take it yet

    def __post_init__(self) -> None:
        if not isinstance(self.tool_call_names, tuple):
            object.__setattr__(self, "tool_call_names", tuple(self.tool_call_names))
        for name in ("run_id", "session_id", "call_id"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        if self.wire_format not in WIRE_FORMATS:
            raise ValueError(f"wire_format {self.wire_format!r} is not one of {', '.join(WIRE_FORMATS)}")
        if not 0 <= self.call_index <= _INT32_MAX:
            raise ValueError(f"call_index must be in [0, 2**31); got {self.call_index}")
        self._check_times()
        if self.auxiliary != (self.auxiliary_reason is not None):
            raise ValueError("auxiliary_reason is required for an auxiliary call and forbidden otherwise")
        if self.fork_reason is not None and self.parent_call_id is None:
            raise ValueError("fork_reason needs a parent_call_id (a fork is relative to a parent call)")
        if not 0 <= self.prompt_reused_tokens <= len(self.tokens.prompt_ids):
            raise ValueError(
                f"prompt_reused_tokens={self.prompt_reused_tokens} must be within the prompt's "
                f"{len(self.tokens.prompt_ids)} tokens"
            )
        if self.engine_wait_ms is not None and not 0 <= self.engine_wait_ms <= _INT32_MAX:
            raise ValueError(f"engine_wait_ms must be in [0, 2**31); got {self.engine_wait_ms}")

    @property
    def sampled(self) -> bool:
        """The engine sampled this call to its end: no budget stop, not cut short, no error other than a malformed
        tool call (:data:`MALFORMED_TOOL_CALLS`, which is the model's output, not a failure of the call)."""
        if self.budget_stop is not None or self.incomplete:
            return False
        return self.error is None or self.error.startswith(MALFORMED_TOOL_CALLS)

    def _check_times(self) -> None:
        stamps = [("received_at", self.received_at), ("first_token_at", self.first_token_at)]
        stamps.append(("done_at", self.done_at))
        present = [(name, t) for name, t in stamps if t is not None]
        for name, t in present:
            if t.tzinfo is None or t.utcoffset() is None:
                raise ValueError(f"{name} must be timezone-aware (naive datetimes are ambiguous)")
        for (a_name, a), (b_name, b) in zip(present, present[1:], strict=False):
            if a > b:
                raise ValueError(f"{a_name} ({a.isoformat()}) is after {b_name} ({b.isoformat()})")


# ------------------------------------------------------------------------------------------------ Arrow conversion


def _dumps(value: Mapping[str, Any], what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-serialisable: {e}") from e


_TOKEN_COLUMNS: Final = ("prompt_ids", "completion_ids", "completion_logprobs")
SCALARS: Final = pa.struct([f for f in SCHEMA if f.name not in _TOKEN_COLUMNS])  # every other column, as one struct
# per column of SCHEMA: its index in a TurnTokens.arrow() triple, or -1 for the next field of SCALARS (schema order)
_TOKEN_SLOTS: Final = tuple(_TOKEN_COLUMNS.index(f.name) if f.name in _TOKEN_COLUMNS else -1 for f in SCHEMA)


def to_row(record: CallRecord) -> dict[str, Any]:
    """The record as a dict of column values (schema order)."""
    tokens = record.tokens
    return {
        **scalar_row(record),
        "prompt_ids": tuple(tokens.prompt_ids),
        "completion_ids": tokens.completion_ids,
        "completion_logprobs": tokens.completion_logprobs,
    }


def scalar_row(record: CallRecord) -> dict[str, Any]:
    """Every column but the token lists, as the row holds them (the JSON columns as text: ValueError if not JSON)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": record.run_id,
        "session_id": record.session_id,
        "call_index": record.call_index,
        "call_id": record.call_id,
        "harness": record.harness,
        "harness_version": record.harness_version,
        "wire_format": record.wire_format,
        "route": record.route,
        "model": record.model,
        "served_model": record.served_model,
        "policy_version": record.policy_version,
        "received_at": record.received_at,
        "first_token_at": record.first_token_at,
        "done_at": record.done_at,
        "finish_reason": record.finish_reason,
        "tool_call_names": record.tool_call_names,
        "tool_call_count": len(record.tool_call_names),
        "auxiliary": record.auxiliary,
        "auxiliary_reason": record.auxiliary_reason,
        "sampling_requested": _dumps(record.sampling_requested, "sampling_requested"),
        "sampling_applied": _dumps(record.sampling_applied, "sampling_applied"),
        "request_canonical": record.request_canonical,
        "completion_canonical": record.completion_canonical,
        "error": record.error,
        "budget_stop": record.budget_stop,
        "incomplete": record.incomplete,
        "identity_hints": _dumps(record.identity_hints, "identity_hints"),
        "parent_call_id": record.parent_call_id,
        "fork_reason": record.fork_reason,
        "prompt_reused_tokens": record.prompt_reused_tokens,
        "engine_wait_ms": record.engine_wait_ms,
    }


# a record as its row: the scalar columns (scalar_row) and the token columns as packed (TurnTokens.arrow())
RowParts = tuple[dict[str, Any], tuple[pa.Array, pa.Array, pa.Array]]


def row_parts(record: CallRecord) -> RowParts:
    return scalar_row(record), record.tokens.arrow()


def to_batch(records: Sequence[CallRecord]) -> pa.RecordBatch:
    """Records as one record batch of :data:`SCHEMA` (raises ValueError if a value does not fit its column)."""
    return rows_batch([row_parts(r) for r in records])


def rows_batch(rows: Sequence[RowParts]) -> pa.RecordBatch:
    """Rows as one record batch of :data:`SCHEMA` (raises ValueError if a value does not fit its column).

    The token columns are assembled from the arrays :class:`TurnTokens` packed (offsets + values, no per-id
    Python work); the other columns go through ``pa.array`` as values. pyarrow's overhead is per call (~0.3 ms for
    one row, ~0.06 ms a row for a thousand): the record store converts a shard's rows at once.
    """
    try:
        # the other columns as one struct array: one conversion call, ~4x faster than a pa.array per column
        scalars = iter(pa.array([row for row, _ in rows], type=SCALARS).flatten())
        # (a field index looked up by name per column cost ~30 us a row, more than the token columns)
        columns = [
            next(scalars) if slot < 0 else _list_column([tokens[slot] for _, tokens in rows], f.type)
            for f, slot in zip(SCHEMA, _TOKEN_SLOTS, strict=True)
        ]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise ValueError(f"record does not fit the schema: {e}") from e


def _list_column(parts: list[pa.Array], list_type: pa.DataType) -> pa.Array:
    """One list column from each row's values array: offsets are running lengths, values one concatenation."""
    lengths = array("i", [0])
    for part in parts:
        lengths.append(lengths[-1] + len(part))
    values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts) if parts else pa.array([], list_type.value_type)
    offsets = pa.Array.from_buffers(pa.int32(), len(lengths), [None, pa.py_buffer(lengths)])
    return pa.ListArray.from_arrays(offsets, values, type=list_type)


def from_row(row: Mapping[str, Any]) -> CallRecord:
    """Rebuild a record from a row of :data:`SCHEMA` (as ``Table.to_pylist`` gives it)."""
    version = row["schema_version"]
    if version != SCHEMA_VERSION:
        raise ValueError(f"row has schema version {version}; this code reads version {SCHEMA_VERSION}")
    derived = {"schema_version", "tool_call_count", "prompt_ids", "completion_ids", "completion_logprobs"}
    fields = {k: v for k, v in row.items() if k not in derived}
    for name in ("sampling_requested", "sampling_applied", "identity_hints"):
        fields[name] = json.loads(fields[name])
    fields["tokens"] = TurnTokens(row["prompt_ids"], row["completion_ids"], row["completion_logprobs"])
    fields["tool_call_names"] = tuple(row["tool_call_names"])
    return CallRecord(**fields)


def records_from_table(table: pa.Table | pa.RecordBatch) -> list[CallRecord]:
    return [from_row(row) for row in table.to_pylist()]


# ------------------------------------------------------------------------------------------------ readers


def _resolve(source: str | os.PathLike[str], filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, os.fspath(source)
    text = os.fspath(source)
    if "://" in text:
        fs, path = pafs.FileSystem.from_uri(text)
        return fs, path
    return pafs.LocalFileSystem(), os.path.abspath(text)


def shard_files(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, list[str]]:
    """Every finished ``shard-*.parquet`` under ``sources`` (searched recursively; ``.tmp`` files never match)."""
    items = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    resolved = [_resolve(item, filesystem) for item in items]
    filesystems = {type(fs) for fs, _ in resolved}
    if len(filesystems) > 1:
        raise ValueError("all sources must be on one filesystem")
    fs = resolved[0][0] if resolved else (filesystem or pafs.LocalFileSystem())
    files: list[str] = []
    for _, path in resolved:
        selector = pafs.FileSelector(path, recursive=True)
        for info in fs.get_file_info(selector):
            if info.type == pafs.FileType.File and SHARD_NAME.match(info.base_name):
                files.append(info.path)
    return fs, sorted(files)


def read_records(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    filesystem: pafs.FileSystem | None = None,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
) -> pa.Table:
    """All rows of all shards under ``sources`` (run folders or folders of runs) as one table of :data:`SCHEMA`.

    ``sources`` are local paths, URIs (``s3://…``) or paths inside ``filesystem``. ``columns`` and ``filter`` are
    pushed down to Parquet, so reading only ``session_id``/``call_id`` of a large corpus stays cheap.
    """
    fs, files = shard_files(sources, filesystem)
    dataset = ds.dataset(files, schema=SCHEMA, format="parquet", filesystem=fs)
    for fragment in dataset.get_fragments():
        version = (fragment.physical_schema.metadata or {}).get(SCHEMA_VERSION_KEY)
        if version != str(SCHEMA_VERSION).encode():
            raise ValueError(f"{fragment.path} has schema version {version!r}; expected {SCHEMA_VERSION}")
    return dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)


@dataclass(frozen=True)
class Session:
    """One session's calls, in ``call_index`` order."""

    run_id: str
    session_id: str
    calls: pa.Table


def iter_sessions(table: pa.Table) -> Iterator[Session]:
    """Split a :func:`read_records` table by ``(run_id, session_id)``, each sorted by ``call_index``."""
    n = table.num_rows
    if n == 0:
        return
    ordered = table.sort_by([("run_id", "ascending"), ("session_id", "ascending"), ("call_index", "ascending")])
    run, session = ordered["run_id"], ordered["session_id"]
    # Sorting made each session contiguous: a session starts where (run_id, session_id) differs from the row before.
    changed = pc.or_(
        pc.not_equal(run.slice(1), run.slice(0, n - 1)), pc.not_equal(session.slice(1), session.slice(0, n - 1))
    )
    starts = [0] + [i + 1 for i in pc.indices_nonzero(changed).to_pylist()] + [n]
    for start, end in zip(starts, starts[1:], strict=False):
        yield Session(run[start].as_py(), session[start].as_py(), ordered.slice(start, end - start))

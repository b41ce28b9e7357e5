"""The durable record store: a write-ahead log in front of zstd Parquet shards, with crash recovery.

Contract
--------
``RecordStore.open(folder, run_id)`` opens (or creates) one run folder::

    folder/.lock                  flock: one store per folder at a time
    folder/wal/wal-NNNNNNNN.log   write-ahead log segments (addon.records.wal)
    folder/shard-NNNNN.parquet    finished shards, SCHEMA of addon.records.schema
    folder/manifest.json          index of the shards, always written last

* :meth:`RecordStore.append` writes the record to the WAL (one checksummed frame, :mod:`addon.records.frames`) and
  fsyncs before it returns: a record is *acknowledged* when append returns, and every acknowledged record survives a
  crash. A call that extends a row still in memory (``parent_call_id``, ``prompt_reused_tokens``, checked) gets a
  delta frame, only the ids after the parent's: its parent's frame is in a segment of the same cut, retired with it.
  Records gather in memory; the append that fills a shard (``shard_rows``) writes it, converting them to Arrow in
  one go (one row at a time cost ~5x more per row, on every call's path); with ``background_shards`` it only asks a
  :class:`~addon.records.flusher.ShardFlusher` thread to, and returns once its record is durable (the proxy's way:
  the call that filled the buffer no longer waits for a whole shard).
* A shard is written as ``shard-N.parquet.tmp``, fsynced, renamed to ``shard-N.parquet``; THEN the WAL segments
  holding its rows are deleted; the manifest (tmp + rename) comes last. A crash at any point leaves either the WAL
  or the shard holding each row, and recovery dedupes by ``call_id``.
* :meth:`RecordStore.open` recovers: removes ``*.tmp``, rebuilds the manifest from the shards on disk, turns WAL
  frames not yet in a shard into shards (torn tails skipped), then deletes the segments.
* ``flush()`` writes the buffer as a shard; ``close_session(id)`` does so when that session has rows in memory;
  ``finalize()`` flushes, closes and returns :class:`StoreCounts`.
* Thread-safe. Failures raise :class:`RecordStoreError`. An append that raises is not acknowledged and leaves the
  store usable and consistent (the record is not in memory; a partial frame is truncated away or left as a torn
  tail). An append never raises for a shard write after its record is acknowledged: that failure is logged, the rows
  stay in the WAL and memory, and the next ``flush``/``close_session``/``close`` retries and raises if it fails again.

Locks: ``_shard_lock`` (held while cutting and writing a shard) is always taken before ``_lock`` (WAL + buffer), so
an append that does not fill a shard never waits for a shard write, and whoever holds ``_shard_lock`` knows no cut
rows are in flight.

Layout: value types, the store (open/recover, append, shards, manifest). The durable file writes (shard,
manifest) and :class:`RecordStoreError` live in :mod:`addon.records.files`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from addon.records import files, frames, wal
from addon.records.files import RecordStoreError
from addon.records.flusher import ShardFlusher
from addon.records.schema import (
    RUN_ID_KEY,
    SCHEMA,
    SCHEMA_VERSION,
    SHARD_NAME,
    CallRecord,
    RowParts,
    row_parts,
    rows_batch,
)

log = logging.getLogger(__name__)

CONVERT_ROWS = 100  # rows converted to Arrow at a time when a shard is written (see RecordStore._write_shard)


@dataclass(frozen=True)
class StoreConfig:
    shard_rows: int = 1000
    """Rows per shard; the append that reaches it writes the shard."""
    row_group_rows: int = 256
    """Parquet row-group size (fixed): bounds reader memory to ~8 MB of prompt ids per group at 8k tokens."""
    compression_level: int = 1
    """zstd level of the shards: level 3 writes 2x slower for ~the same size on token ids (docs/records.md)."""
    background_shards: bool = False
    """Write a full buffer's shard on a background thread, not in the append that filled it (the proxy sets it)."""

    def __post_init__(self) -> None:
        if self.shard_rows < 1 or self.row_group_rows < 1:
            raise ValueError("shard_rows and row_group_rows must be at least 1")
        if not 1 <= self.compression_level <= 22:
            raise ValueError(f"zstd compression_level must be in 1..22, got {self.compression_level}")


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`RecordStore.open` found and repaired."""

    recovered_rows: int = 0
    duplicate_rows: int = 0
    torn_bytes: int = 0
    segments: int = 0
    removed_tmp: tuple[str, ...] = ()
    manifest_rebuilt: bool = False


@dataclass(frozen=True)
class StoreCounts:
    rows: int
    shards: int
    sessions: int
    appended: int
    recovered: int


@dataclass
class _Cut:
    """Rows taken out of memory for one shard, and the WAL segments that hold them."""

    parts: list[RowParts] = field(default_factory=list)  # each row's columns, converted to Arrow at the shard
    segments: list[Path] = field(default_factory=list)
    sessions: Counter[str] = field(default_factory=Counter)
    # call id -> its prompt and completion ids, for the delta frames of the calls that extend it (frames.PromptBase)
    tokens: dict[str, tuple[pa.Array, pa.Array]] = field(default_factory=dict)
    requests: dict[str, bytes] = field(default_factory=dict)  # call id -> its request blob (the row's own bytes)

    @property
    def rows(self) -> int:
        return len(self.parts)

    def absorb(self, other: _Cut) -> None:
        self.parts.extend(other.parts)
        self.segments.extend(other.segments)
        self.sessions.update(other.sessions)
        self.tokens.update(other.tokens)
        self.requests.update(other.requests)


class RecordStore:
    """Append-only, crash-safe store of :class:`~addon.records.schema.CallRecord` rows for one run. Use :meth:`open`."""

    def __init__(self, folder: Path, run_id: str, config: StoreConfig, lock_file: IO[bytes]) -> None:
        self.folder = folder
        self.run_id = run_id
        self.config = config
        self._lock_file = lock_file
        self._wal_dir = folder / "wal"
        self._lock = threading.Lock()
        self._shard_lock = threading.Lock()
        self._segment: wal.SegmentWriter | None = None
        self._next_segment = 1
        self._buffer = _Cut()
        self._failed = _Cut()  # rows of a shard write that failed; retried with the next cut
        self._call_ids: set[str] = set()
        self._shards: dict[str, int] = {}  # file name -> rows
        self._shard_sessions: set[str] = set()
        self._next_shard = 0
        self._appended = 0
        self.delta_frames = 0  # appends whose frame held only the prompt ids after its parent's (frames.PromptBase)
        self._closed = False
        self.recovery = RecoveryReport()
        self.flusher: ShardFlusher | None = None  # started by open() once recovery succeeded (background_shards)

    # -------------------------------------------------------------------------------------------- open / recover

    @classmethod
    def open(
        cls, folder: str | os.PathLike[str], run_id: str | None = None, config: StoreConfig | None = None
    ) -> RecordStore:
        """Open or create the run folder, recovering whatever a crash left; ``run_id`` is needed for a new run."""
        path = Path(folder)
        try:
            (path / "wal").mkdir(parents=True, exist_ok=True)
            lock_file = open(path / ".lock", "ab")  # noqa: SIM115 - held for the store's lifetime
        except OSError as e:
            raise RecordStoreError(f"cannot open record folder {path}: {e}") from e
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            lock_file.close()
            raise RecordStoreError(f"{path} is already open by another record store") from e
        try:
            store = cls(path, run_id or "", config or StoreConfig(), lock_file)
            store._recover(run_id)
        except BaseException:
            lock_file.close()
            raise
        if store.config.background_shards:  # not before: a store that failed to open leaves no thread behind
            store.flusher = ShardFlusher(store._flush_full, f"records-{path.name}")
        return store

    def _recover(self, run_id: str | None) -> None:
        try:
            removed = self._remove_tmp_files()
            manifest_run = self._load_shards()
            self.run_id = self._pick_run_id(run_id, manifest_run)
            recovered, duplicates, torn, segments = self._replay_wal()
            stale = manifest_run is None or bool(removed) or recovered > 0 or self._manifest_stale()
            rebuilt = stale and bool(self._shards)
            if rebuilt:
                self._write_manifest()
        except (OSError, ValueError, wal.WalError, pa.ArrowException) as e:
            raise RecordStoreError(f"recovery of {self.folder} failed: {e}") from e
        self.recovery = RecoveryReport(recovered, duplicates, torn, segments, removed, rebuilt)
        if recovered or torn or removed:
            log.warning("record store %s recovered: %s", self.folder, self.recovery)

    def _remove_tmp_files(self) -> tuple[str, ...]:
        removed = []
        for entry in sorted(self.folder.iterdir()):
            if entry.name.endswith(".tmp") and entry.is_file():
                entry.unlink()
                removed.append(entry.name)
        if removed:
            wal.fsync_dir(self.folder)
        return tuple(removed)

    def _load_shards(self) -> str | None:
        """Index the shards on disk (the truth; the manifest is only an index). Returns the manifest's run id."""
        run_ids: set[str] = set()
        for entry in sorted(self.folder.iterdir()):
            match = SHARD_NAME.match(entry.name)
            if not match:
                continue
            pf = pq.ParquetFile(entry)
            meta = pf.schema_arrow.metadata or {}
            if pf.schema_arrow.remove_metadata() != SCHEMA.remove_metadata():
                raise RecordStoreError(f"{entry} does not have this code's schema (version {SCHEMA_VERSION})")
            run_ids.add(meta.get(RUN_ID_KEY, b"").decode())
            ids = pf.read(columns=["call_id", "session_id"])
            self._call_ids.update(ids["call_id"].to_pylist())
            self._shard_sessions.update(ids["session_id"].to_pylist())
            self._shards[entry.name] = pf.metadata.num_rows
            self._next_shard = max(self._next_shard, int(match.group(1)) + 1)
        manifest = self._read_manifest()
        if manifest is not None:
            run_ids.add(manifest["run_id"])
        if len(run_ids) > 1:
            raise RecordStoreError(f"{self.folder} mixes runs {sorted(run_ids)}; one folder holds one run")
        return manifest["run_id"] if manifest is not None else (run_ids.pop() if run_ids else None)

    def _pick_run_id(self, requested: str | None, found: str | None) -> str:
        if found and requested and found != requested:
            raise RecordStoreError(f"{self.folder} belongs to run {found!r}, not {requested!r}")
        chosen = found or requested or self._run_id_from_wal()
        if not chosen:
            # A new folder and no run id given: start a new run, named so that runs sort by start time.
            chosen = f"run-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
            log.info("%s: new run %s", self.folder, chosen)
        return chosen

    def _run_id_from_wal(self) -> str | None:
        for _, seg in wal.list_segments(self._wal_dir):
            contents = wal.read_segment(seg)
            for frame in contents.frames:
                return frames.run_id(frame, contents.format_version)
        return None

    def _replay_wal(self) -> tuple[int, int, int, int]:
        """Turn WAL rows not yet in a shard into shards, then delete the segments."""
        segments = wal.list_segments(self._wal_dir)
        cut, duplicates, torn = _Cut(), 0, 0
        reader = frames.FrameReader()  # in write order: a delta frame's parent comes before it
        for _, seg in segments:
            contents = wal.read_segment(seg)
            torn += contents.torn_bytes
            if contents.frames and contents.schema_version != SCHEMA_VERSION:
                raise RecordStoreError(f"{seg} holds schema version {contents.schema_version}; recover it with that")
            for frame in contents.frames:
                record = reader.decode(frame, contents.format_version)
                if record.call_id in self._call_ids:
                    duplicates += 1
                    continue
                self._call_ids.add(record.call_id)
                cut.parts.append(row_parts(record))
        for start in range(0, len(cut.parts), self.config.shard_rows):
            part = _Cut(cut.parts[start : start + self.config.shard_rows])
            self._write_shard(self._reserve_shard(), part)
        for _, seg in segments:
            seg.unlink()
        if segments:
            wal.fsync_dir(self._wal_dir)
        self._next_segment = segments[-1][0] + 1 if segments else 1
        return len(cut.parts), duplicates, torn, len(segments)

    def _manifest_stale(self) -> bool:
        manifest = self._read_manifest()
        return manifest is None or {s["file"]: s["rows"] for s in manifest["shards"]} != self._shards

    # -------------------------------------------------------------------------------------------- append

    @property
    def buffered_rows(self) -> int:
        """Acknowledged rows held in memory until the next shard (a failed shard write's rows included)."""
        with self._lock:
            return self._buffer.rows + self._failed.rows

    def append(self, record: CallRecord) -> None:
        """Make ``record`` durable (WAL + fsync) before returning; write a shard when the buffer is full."""
        if record.run_id != self.run_id:
            raise ValueError(f"record of run {record.run_id!r} appended to the store of run {self.run_id!r}")
        parts = row_parts(record)  # outside the lock, as is the encoding: ValueError for a row that does not fit
        base = self._prompt_base(record, parts)
        payload = frames.encode(parts, base)
        with self._lock:
            self._check_open()
            if record.call_id in self._call_ids:
                raise ValueError(f"call_id {record.call_id!r} is already in the store")
            if base is not None and base.parent not in self._buffer.tokens:  # a shard took the parent meanwhile
                base, payload = None, frames.encode(parts)
            segment = self._current_segment()
            try:
                segment.append(payload)
            except wal.WalWriteError as e:
                self._segment = None  # the writer closed itself; the next append starts a fresh segment
                raise RecordStoreError(f"record {record.call_id} was not stored: {e}") from e
            self._call_ids.add(record.call_id)
            self._buffer.parts.append(parts)
            self._buffer.sessions[record.session_id] += 1
            self._buffer.tokens[record.call_id] = (parts[1][0], parts[1][1])
            self._buffer.requests[record.call_id] = record.request_canonical
            self._appended += 1
            self.delta_frames += base is not None
            full = self._buffer.rows >= self.config.shard_rows
        if full and not (self.flusher is not None and self.flusher.request()):
            try:
                self._flush_if(lambda: self._buffer.rows >= self.config.shard_rows)
            except RecordStoreError:
                # This record is acknowledged (it is in the WAL): raising would tell the caller otherwise. The rows
                # stay in memory and the WAL; the next flush/close_session/close retries and raises if it fails again.
                log.exception("record store %s: shard write failed; the rows are kept in the WAL", self.folder)

    def _prompt_base(self, record: CallRecord, parts: RowParts) -> frames.PromptBase | None:
        """The parent whose ids begin this record's prompt, when its frame is in a segment that goes with this one
        (the buffer's: a cut takes both; the segments of rows already in a shard may be gone when this one is
        read back). The record's word is checked (:func:`frames.extends`): a claim that does not hold gets a whole
        frame, never a frame that recovery would rebuild wrong."""
        parent, n = record.parent_call_id, record.prompt_reused_tokens
        if parent is None or n == 0:
            return None
        with self._lock:
            tokens = self._buffer.tokens.get(parent)
            request = self._buffer.requests.get(parent)
        if tokens is None or request is None:
            return None
        if not frames.extends(parts[1][0], n, tokens):
            log.debug(
                "record %s: its first %d prompt ids are not %s's; its frame holds them all", record.call_id, n, parent
            )
            return None
        return frames.PromptBase(parent, n, frames.request_base(request, record.request_canonical))

    def _current_segment(self) -> wal.SegmentWriter:
        if self._segment is None:
            path = wal.segment_path(self._wal_dir, self._next_segment)
            self._next_segment += 1
            # Listed before it exists: a half-created segment is then retired with the buffer's rows.
            self._buffer.segments.append(path)
            try:
                self._segment = wal.SegmentWriter(path, SCHEMA_VERSION)
            except wal.WalWriteError as e:
                raise RecordStoreError(str(e)) from e
        return self._segment

    def _check_open(self) -> None:
        if self._closed:
            raise RecordStoreError(f"record store {self.folder} is closed")

    # -------------------------------------------------------------------------------------------- shards

    def flush(self) -> None:
        """Write every record in memory to a shard (no-op when there is none)."""
        self._flush_if(lambda: True)

    def close_session(self, session_id: str) -> None:
        """Return once every acknowledged record of ``session_id`` is in a shard."""
        self._flush_if(lambda: self._buffer.sessions[session_id] > 0 or self._failed.sessions[session_id] > 0)

    def _flush_full(self) -> None:
        """The flusher's job: a shard if the buffer is full. ``close`` stops the flusher before its own last flush,
        so this never races it; it may run once more while ``close`` waits for it (closing: no open check)."""
        self._flush_if(lambda: self._buffer.rows >= self.config.shard_rows, closing=True)

    def _flush_if(self, wanted: Callable[[], bool], closing: bool = False) -> None:
        with self._shard_lock:
            with self._lock:
                if not closing:
                    self._check_open()
                if not wanted():
                    return
                cut = self._take_locked()
                if cut.rows == 0:
                    return
                index = self._reserve_shard()
            try:
                self._write_shard(index, cut)
            except (OSError, ValueError, pa.ArrowException) as e:
                with self._lock:
                    self._failed.absorb(cut)  # still in the WAL; the next flush retries them first
                raise RecordStoreError(f"writing shard {index} of {self.folder} failed: {e}") from e
            try:
                self._retire(cut.segments)
                self._write_manifest()
            except OSError as e:
                # The shard is durable; a leftover segment is deduped and a stale manifest rebuilt on open.
                raise RecordStoreError(f"finishing shard {index} of {self.folder} failed: {e}") from e

    def _take_locked(self) -> _Cut:
        """Take the failed and buffered rows. The current segment holds only buffered rows: it goes with them."""
        cut, self._failed = self._failed, _Cut()
        if self._segment is not None:
            self._segment.close()
            self._segment = None
        cut.absorb(self._buffer)
        self._buffer = _Cut()
        return cut

    def _reserve_shard(self) -> int:
        index, self._next_shard = self._next_shard, self._next_shard + 1
        return index

    def _write_shard(self, index: int, cut: _Cut) -> None:
        """Write ``shard-index.parquet`` durably (see :func:`addon.records.files.write_shard`)."""
        name = f"shard-{index:05d}.parquet"
        metadata = {**(SCHEMA.metadata or {}), RUN_ID_KEY: self.run_id.encode()}
        # Batches of CONVERT_ROWS rows: converting the rows' Python values holds the GIL, and a whole shard's at
        # once stalled the event loop (every call in flight) for 60-100 ms at 150 KB request blobs; 100-row batches
        # hold it 8-14 ms each, cost the same in all, and the Parquet writer took ~20% less time on them
        # (one-row chunks, by contrast, made it ~10x slower).
        batches = [rows_batch(cut.parts[k : k + CONVERT_ROWS]) for k in range(0, len(cut.parts), CONVERT_ROWS)]
        table = pa.Table.from_batches(batches, schema=SCHEMA).replace_schema_metadata(metadata)
        files.write_shard(self.folder / name, table, self.config.compression_level, self.config.row_group_rows)
        with self._lock:  # counts() reads these from other threads
            self._shards[name] = table.num_rows
            self._shard_sessions.update(table["session_id"].to_pylist())

    def _retire(self, segments: list[Path]) -> None:
        for seg in segments:
            seg.unlink(missing_ok=True)
        if segments:
            wal.fsync_dir(self._wal_dir)

    # -------------------------------------------------------------------------------------------- manifest

    def _write_manifest(self) -> None:
        files.write_manifest(self.folder, self.run_id, self._shards)

    def _read_manifest(self) -> dict[str, Any] | None:
        return files.read_manifest(self.folder)

    # -------------------------------------------------------------------------------------------- lifecycle

    def counts(self) -> StoreCounts:
        with self._lock:
            in_memory = self._buffer.rows + self._failed.rows
            sessions = self._shard_sessions | set(self._buffer.sessions) | set(self._failed.sessions)
            return StoreCounts(
                rows=sum(self._shards.values()) + in_memory,
                shards=len(self._shards),
                sessions=len(sessions),
                appended=self._appended,
                recovered=self.recovery.recovered_rows,
            )

    def finalize(self) -> StoreCounts:
        """Flush, close, and return the run's counts."""
        self.close()
        return self.counts()

    def close(self) -> None:
        """Flush what is in memory and release the folder. Raises if the flush fails (the WAL still holds it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # first, so that no append slips in after the final flush
        try:
            if self.flusher is not None:
                self.flusher.close()  # a shard it is writing is finished first; then the rest below
            self._flush_if(lambda: True, closing=True)
        finally:
            with self._lock:
                if self._segment is not None:
                    self._segment.close()
                    self._segment = None
            self._lock_file.close()  # closing the file releases the flock

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

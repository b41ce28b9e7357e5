"""Write-ahead log for the record store: length-prefixed, checksummed frames in numbered segment files.

Contract
--------
A segment is a file ``wal-NNNNNNNN.log`` in one folder. It starts with a fixed header (magic ``HRLWAL``, format
version, schema version) and holds frames ``<u32 length><u32 crc32(payload)><payload>`` (little-endian). The WAL
does not know what a payload is; the record store puts one record in each (:mod:`addon.records.frames`); the header's
format version says which payloads a segment holds (4: msgpack maps, some of them deltas of an earlier frame's
prompt ids and request blob; 3: deltas of prompt ids only; 2: whole maps; 1: one Arrow IPC record batch each; all
four still read).

* :class:`SegmentWriter` appends a frame and returns only after ``write`` + ``fsync`` (an acknowledged frame is on
  disk). When a write fails it truncates the file back to the last whole frame, closes it and raises
  :class:`WalWriteError`; the segment is then finished (the store opens a fresh one), so a partial frame can only
  ever sit at a segment's tail.
* :func:`read_segment` returns every whole frame of a segment. A bad frame that reaches the end of the file is a torn
  write (a crash mid-append): it is skipped and counted. A bad frame with more bytes after it is real corruption and
  raises :class:`WalCorruptError`: guessing would risk silently losing acknowledged records.
* :func:`list_segments`, :func:`segment_path` and :func:`fsync_dir` name and order segments and make renames and
  unlinks durable.

Layout: constants and errors, naming helpers, the writer, the reader.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"HRLWAL"
# the store's payloads: 4, as 3 with request blob deltas; 3, frames maps, some of them deltas of their prompt ids;
# 2, whole maps; 1, Arrow IPC batches
FORMAT_VERSION = 4
READABLE_FORMATS = (1, 2, 3, 4)
_HEADER = struct.Struct("<6sHI")  # magic, WAL format version, record schema version
_FRAME = struct.Struct("<II")  # payload length, crc32 of payload
_SEGMENT_NAME = re.compile(r"^wal-(\d{8})\.log$")
# A frame larger than this is rejected on write and treated as corruption on read (a record is ~100 KB-10 MB).
MAX_FRAME_BYTES = 1 << 30


class WalError(Exception):
    """Base class of WAL failures."""


class WalWriteError(WalError):
    """An append did not reach the disk; the frame is not acknowledged."""


class WalCorruptError(WalError):
    """A segment holds a bad frame that is not a torn tail (or a foreign header)."""


def segment_path(folder: Path, number: int) -> Path:
    return folder / f"wal-{number:08d}.log"


def list_segments(folder: Path) -> list[tuple[int, Path]]:
    """Segments in ``folder`` as ``(number, path)``, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _SEGMENT_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def fsync_dir(folder: Path) -> None:
    """Make a create/rename/unlink in ``folder`` durable (POSIX needs the directory itself fsynced)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """Appends frames to one new segment file. Not thread-safe: the record store serialises calls."""

    def __init__(self, path: Path, schema_version: int) -> None:
        self.path = path
        # O_EXCL: a segment number is never reused, so an existing file means two writers or a bug.
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        self.frames = 0
        try:
            self._write_durably(_HEADER.pack(MAGIC, FORMAT_VERSION, schema_version))
            fsync_dir(path.parent)
        except OSError as e:
            self._abandon()
            raise WalWriteError(f"cannot start WAL segment {path}: {e}") from e

    @property
    def closed(self) -> bool:
        return self._fd is None

    def append(self, payload: bytes) -> None:
        """Write one frame and fsync it; on failure truncate it away, close the segment and raise WalWriteError."""
        if self._fd is None:
            raise WalWriteError(f"WAL segment {self.path} is closed")
        if len(payload) > MAX_FRAME_BYTES:
            raise WalWriteError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
        frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        try:
            self._write_durably(frame)
        except OSError as e:
            self._abandon()
            raise WalWriteError(f"WAL append to {self.path} failed: {e}") from e
        self.frames += 1

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _write_durably(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:  # os.write may write less than asked (signals, large buffers)
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        self._size += len(data)

    def _abandon(self) -> None:
        """After a failed write: cut the file back to its last whole frame (best effort) and close it."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError:
            pass  # the partial frame stays as this segment's tail, where the reader treats it as torn
        self.close()


@dataclass(frozen=True)
class SegmentContents:
    """What :func:`read_segment` found: whole frames, and whether a torn tail was dropped (its size)."""

    schema_version: int
    frames: list[bytes]
    torn_bytes: int
    format_version: int = FORMAT_VERSION  # what the payloads are: the header's WAL format version


def read_segment(path: Path) -> SegmentContents:
    """Read all whole frames of a segment; skip a torn tail; raise WalCorruptError on anything else."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        # A crash while the header itself was written: nothing was ever acknowledged in this segment.
        return SegmentContents(schema_version=-1, frames=[], torn_bytes=len(data))
    magic, fmt, schema_version = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or fmt not in READABLE_FORMATS:
        raise WalCorruptError(f"{path} is not a WAL segment of format {READABLE_FORMATS} (header {data[:8]!r})")
    frames: list[bytes] = []
    offset = _HEADER.size
    while offset < len(data):
        problem = _frame_problem(data, offset)
        if problem is None:
            length, _ = _FRAME.unpack_from(data, offset)
            start = offset + _FRAME.size
            frames.append(data[start : start + length])
            offset = start + length
            continue
        declared_end = _declared_end(data, offset)
        if declared_end >= len(data) or not data[offset:].strip(b"\0"):
            return SegmentContents(schema_version, frames, torn_bytes=len(data) - offset, format_version=fmt)
        raise WalCorruptError(
            f"{path}: {problem} at byte {offset} with {len(data) - declared_end} bytes after it; "
            "this is corruption, not a torn write. Move the segment aside to open the store without it."
        )
    return SegmentContents(schema_version, frames, torn_bytes=0, format_version=fmt)


def _frame_problem(data: bytes, offset: int) -> str | None:
    if offset + _FRAME.size > len(data):
        return "truncated frame header"
    length, crc = _FRAME.unpack_from(data, offset)
    if length == 0 or length > MAX_FRAME_BYTES:
        # Length 0 is never written; it is what a zero-filled tail (a crash after the file grew) looks like.
        return f"implausible frame length {length}"
    start = offset + _FRAME.size
    if start + length > len(data):
        return "truncated frame payload"
    if zlib.crc32(data[start : start + length]) != crc:
        return "checksum mismatch"
    return None


def _declared_end(data: bytes, offset: int) -> int:
    """Where the frame at ``offset`` claims to end (past the file when its header is cut or absurd)."""
    if offset + _FRAME.size > len(data):
        return len(data)
    length, _ = _FRAME.unpack_from(data, offset)
    return offset + _FRAME.size + min(length, MAX_FRAME_BYTES + 1)

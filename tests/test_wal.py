"""Tests for addon.records.wal: frames round-trip, torn tails are skipped, corruption is loud, failed writes leave no
debris."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from addon.records import wal

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, payloads: list[bytes], preallocate: int = wal.PREALLOCATE_BYTES) -> None:
    writer = wal.SegmentWriter(path, schema_version=3, preallocate=preallocate)
    for payload in payloads:
        writer.append(payload)
    writer.close()


def _data_end(payloads: list[bytes]) -> int:
    """Where a segment's last frame ends: its header, then each frame's 8-byte header and payload."""
    return 12 + sum(8 + len(p) for p in payloads)


PAYLOADS = [b"a", b"bb" * 100, os.urandom(5000), b"last frame"]


def test_frames_round_trip_and_segments_are_listed_in_order(tmp_path: Path) -> None:
    for n in (10, 2, 1):
        _write(wal.segment_path(tmp_path, n), PAYLOADS[:n] if n < 5 else PAYLOADS)
    (tmp_path / "wal-1.log").write_bytes(b"not a segment name")
    assert [n for n, _ in wal.list_segments(tmp_path)] == [1, 2, 10]
    contents = wal.read_segment(wal.segment_path(tmp_path, 10))
    assert contents.frames == PAYLOADS and contents.torn_bytes == 0 and contents.schema_version == 3


def test_segment_numbers_are_never_reused(tmp_path: Path) -> None:
    _write(wal.segment_path(tmp_path, 1), [b"x"])
    with pytest.raises(FileExistsError):
        wal.SegmentWriter(wal.segment_path(tmp_path, 1), 3)


def test_every_truncation_of_the_last_frame_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS, preallocate=0)
    whole = path.read_bytes()
    assert len(whole) == _data_end(PAYLOADS)
    last = 8 + len(PAYLOADS[-1])
    for cut in range(1, last + 1):
        path.write_bytes(whole[:-cut])
        contents = wal.read_segment(path)
        assert contents.frames == PAYLOADS[:-1], cut
        assert contents.torn_bytes == last - cut


@pytest.mark.parametrize("written", [1, 5, 8, 9, 17])
def test_a_last_frame_cut_short_inside_the_zero_filled_space_is_torn(tmp_path: Path, written: int) -> None:
    """A crash in the middle of an append into the space kept ahead: the frame's first bytes, then zeros."""
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS)
    whole = path.read_bytes()
    end = _data_end(PAYLOADS)
    assert len(whole) == 12 + wal.PREALLOCATE_BYTES and not whole[end:].strip(b"\0")  # the frames fit in it
    start = end - 8 - len(PAYLOADS[-1])
    path.write_bytes(whole[: start + written] + bytes(len(whole) - start - written))
    contents = wal.read_segment(path)
    assert contents.frames == PAYLOADS[:-1] and contents.torn_bytes == 8 + len(PAYLOADS[-1])


def test_zero_filled_tail_is_the_end_not_corrupt(tmp_path: Path) -> None:
    # The space a writer keeps ahead, or zeros where the data never landed after a crash that kept the file's length.
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS[:2], preallocate=0)
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    contents = wal.read_segment(path)
    assert contents.frames == PAYLOADS[:2] and contents.torn_bytes == 0


@pytest.mark.parametrize("preallocate", [0, wal.PREALLOCATE_BYTES])
def test_checksum_mismatch_at_the_tail_is_torn(tmp_path: Path, preallocate: int) -> None:
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS, preallocate)
    data = bytearray(path.read_bytes())
    data[_data_end(PAYLOADS) - 1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert wal.read_segment(path).frames == PAYLOADS[:-1]


def test_appends_into_the_zero_filled_space_are_fdatasynced_and_growth_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(wal.os, "fsync", lambda fd: calls.append("fsync"))
    monkeypatch.setattr(wal.os, "fdatasync", lambda fd: calls.append("fdatasync"))
    path = tmp_path / "wal-00000001.log"
    writer = wal.SegmentWriter(path, 3, preallocate=4096)
    assert calls == ["fsync", "fsync"]  # the header and its zeros; the directory entry
    calls.clear()
    payloads = [bytes([i]) * 1000 for i in range(1, 10)]
    sizes = []
    for p in payloads:
        writer.append(p)
        sizes.append(path.stat().st_size)
    writer.close()
    # frame k ends at 12 + 1008 * k: the 5th passes 12 + 4096 and grows the file, with 4096 zeros after it
    assert calls == ["fdatasync"] * 4 + ["fsync"] + ["fdatasync"] * 4
    assert sizes == [12 + 4096] * 4 + [12 + 5 * 1008 + 4096] * 5
    big = os.urandom(10_000)  # larger than the space ahead: written at the end, zeros after it
    writer = wal.SegmentWriter(tmp_path / "wal-00000002.log", 3, preallocate=4096)
    writer.append(big)
    writer.append(b"after")
    writer.close()
    contents = wal.read_segment(tmp_path / "wal-00000002.log")
    assert contents.frames == [big, b"after"] and contents.torn_bytes == 0
    assert wal.read_segment(path).frames == payloads


def test_corruption_before_the_tail_raises(tmp_path: Path) -> None:
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS)
    data = bytearray(path.read_bytes())
    data[12 + 8] ^= 0xFF  # the first frame's payload: after the 12-byte segment header and its 8-byte frame header
    path.write_bytes(bytes(data))
    with pytest.raises(wal.WalCorruptError, match="checksum mismatch at byte 12 with .* bytes after it"):
        wal.read_segment(path)


def test_foreign_file_raises_and_cut_header_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "wal-00000001.log"
    path.write_bytes(b"PAR1" + b"\0" * 20)
    with pytest.raises(wal.WalCorruptError, match="is not a WAL segment"):
        wal.read_segment(path)
    path.write_bytes(b"HRLW")  # crash while the header was written
    assert wal.read_segment(path).frames == []


def test_closed_writer_and_oversized_frame_raise(tmp_path: Path) -> None:
    writer = wal.SegmentWriter(tmp_path / "wal-00000001.log", 1)
    with pytest.raises(wal.WalWriteError, match="exceeds"):
        writer.append(b"x" * (wal.MAX_FRAME_BYTES + 1))
    writer.close()
    assert writer.closed
    with pytest.raises(wal.WalWriteError, match="is closed"):
        writer.append(b"x")


_FILL_SCRIPT = """
import os, resource, signal, sys
from pathlib import Path
from addon.records import wal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))
writer = wal.SegmentWriter(Path(sys.argv[1]), 1)
acked = 0
try:
    for i in range(100):
        writer.append(bytes([i]) * 900)
        acked += 1
except wal.WalWriteError as e:
    print(acked, writer.closed, type(e.__cause__).__name__, writer.preallocate, flush=True)
"""


def test_failed_write_is_truncated_away_and_closes_the_segment(tmp_path: Path) -> None:
    """A write that hits the file-size limit partially: the partial frame is cut off, acknowledged frames stay."""
    path = tmp_path / "wal-00000001.log"
    out = subprocess.run(
        [sys.executable, "-c", _FILL_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    acked, closed, cause, ahead = out.stdout.split()
    assert (closed, cause) == ("True", "OSError")
    assert ahead == "0"  # 1 MiB of zeros never fit under the limit: the segment went on without them
    contents = wal.read_segment(path)
    assert len(contents.frames) == int(acked) > 0
    assert contents.frames == [bytes([i]) * 900 for i in range(int(acked))]
    assert contents.torn_bytes == 0  # truncated back to the last whole frame

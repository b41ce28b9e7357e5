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


def _write(path: Path, payloads: list[bytes]) -> None:
    writer = wal.SegmentWriter(path, schema_version=3)
    for payload in payloads:
        writer.append(payload)
    writer.close()


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
    _write(path, PAYLOADS)
    whole = path.read_bytes()
    last = 8 + len(PAYLOADS[-1])
    for cut in range(1, last + 1):
        path.write_bytes(whole[:-cut])
        contents = wal.read_segment(path)
        assert contents.frames == PAYLOADS[:-1], cut
        assert contents.torn_bytes == last - cut


def test_zero_filled_tail_is_torn_not_corrupt(tmp_path: Path) -> None:
    # After a crash a file can keep its new length with zeros where the data never landed.
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS[:2])
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    contents = wal.read_segment(path)
    assert contents.frames == PAYLOADS[:2] and contents.torn_bytes == 64


def test_checksum_mismatch_at_the_tail_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "wal-00000001.log"
    _write(path, PAYLOADS)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert wal.read_segment(path).frames == PAYLOADS[:-1]


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
    print(acked, writer.closed, type(e.__cause__).__name__, flush=True)
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
    acked, closed, cause = out.stdout.split()
    assert (closed, cause) == ("True", "OSError")
    contents = wal.read_segment(path)
    assert len(contents.frames) == int(acked) > 0
    assert contents.frames == [bytes([i]) * 900 for i in range(int(acked))]
    assert contents.torn_bytes == 0  # truncated back to the last whole frame

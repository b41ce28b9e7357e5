"""Tests for addon.records.store: durability, real crash recovery (SIGKILL, torn frames), order, threads, disk full."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records import frames as record_frames
from addon.records import store as record_store
from addon.records import wal
from addon.records.schema import SCHEMA_VERSION, CallRecord, read_records, records_from_table, row_parts, to_batch
from addon.records.store import RecordStore, RecordStoreError, StoreConfig
from tests.record_factory import extend_record, make_record, records, session_chains, tool_loop_requests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _stored(folder: Path) -> list[CallRecord]:
    return sorted(records_from_table(read_records(folder)), key=lambda r: r.call_id)


def _ids(folder: Path) -> list[str]:
    return read_records(folder, columns=["call_id"])["call_id"].to_pylist()


def _segments(folder: Path) -> list[Path]:
    return [p for _, p in wal.list_segments(folder / "wal")]


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


# ------------------------------------------------------------------------------------------------ basics


@pytest.mark.parametrize("convert_rows", [record_store.CONVERT_ROWS, 3])
def test_round_trip_shards_row_groups_and_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, convert_rows: int
) -> None:
    # a shard's rows are converted to Arrow a few at a time (3: batches that do not line up with the row groups)
    monkeypatch.setattr(record_store, "CONVERT_ROWS", convert_rows)
    recs = [make_record(i, session_id=f"s{i % 3}") for i in range(23)]
    with RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=10, row_group_rows=4)) as store:
        for rec in recs:
            store.append(rec)
        assert store.counts().shards == 2 and len(_segments(tmp_path)) == 1
    assert _stored(tmp_path) == sorted(recs, key=lambda r: r.call_id)
    shards = sorted(tmp_path.glob("shard-*.parquet"))
    assert [pq.ParquetFile(s).metadata.num_rows for s in shards] == [10, 10, 3]
    first = pq.ParquetFile(shards[0]).metadata
    assert [first.row_group(g).num_rows for g in range(first.num_row_groups)] == [4, 4, 2]
    assert first.row_group(0).column(0).compression == "ZSTD"
    assert _manifest(tmp_path) == {
        "format": "harnessrl-records",
        "schema_version": SCHEMA_VERSION,
        "run_id": "run-1",
        "total_rows": 23,
        "shards": [{"file": s.name, "rows": n} for s, n in zip(shards, [10, 10, 3], strict=True)],
    }
    assert _segments(tmp_path) == [] and not list(tmp_path.glob("*.tmp"))


def test_finalize_returns_counts_and_closes(tmp_path: Path) -> None:
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=4))
    for i in range(9):
        store.append(make_record(i, session_id=f"s{i % 2}"))
    counts = store.finalize()
    assert (counts.rows, counts.shards, counts.sessions, counts.appended, counts.recovered) == (9, 3, 2, 9, 0)
    with pytest.raises(RecordStoreError, match="is closed"):
        store.append(make_record(10))


def test_shard_then_wal_retired_then_manifest_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_rename, real_unlink = os.rename, Path.unlink

    def rename(src: str | Path, dst: str | Path) -> None:
        events.append(("rename", Path(dst).name))
        real_rename(src, dst)

    def unlink(path: Path, missing_ok: bool = False) -> None:
        events.append(("unlink", path.name))
        real_unlink(path, missing_ok=missing_ok)

    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=3))
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(Path, "unlink", unlink)
    for i in range(3):
        store.append(make_record(i))
    assert events == [
        ("rename", "shard-00000.parquet"),
        ("unlink", "wal-00000001.log"),
        ("rename", "manifest.json"),
    ]
    store.close()


def test_validation_of_appends_and_opens(tmp_path: Path) -> None:
    fresh = RecordStore.open(tmp_path / "new")  # a new folder without a run id starts a new, time-named run
    assert fresh.run_id.startswith("run-")
    fresh.close()
    store = RecordStore.open(tmp_path, "run-1")
    store.append(make_record(0))
    with pytest.raises(ValueError, match="already in the store"):
        store.append(make_record(0))
    with pytest.raises(ValueError, match="record of run 'run-2'"):
        store.append(make_record(1, run_id="run-2"))
    with pytest.raises(RecordStoreError, match="already open by another record store"):
        RecordStore.open(tmp_path, "run-1")
    store.close()
    with pytest.raises(RecordStoreError, match="belongs to run 'run-1', not 'run-9'"):
        RecordStore.open(tmp_path, "run-9")
    with RecordStore.open(tmp_path) as again:  # the run id comes from the folder
        assert again.run_id == "run-1"
        with pytest.raises(ValueError, match="already in the store"):  # ids in shards count too
            again.append(make_record(0))


def test_a_record_that_does_not_fit_is_refused_before_the_wal_and_the_store_goes_on(tmp_path: Path) -> None:
    bad = make_record(1)
    object.__setattr__(bad, "policy_version", 2**63)  # past the int64 column: never acknowledged, never in a shard
    with RecordStore.open(tmp_path, "run-1") as store:
        store.append(make_record(0))
        with pytest.raises(ValueError, match="policy_version"):
            store.append(bad)
        store.append(make_record(2))
        assert store.buffered_rows == 2
    assert _ids(tmp_path) == ["run-1/sess-a/call-0", "run-1/sess-a/call-2"]


def test_a_wal_segment_of_format_1_is_recovered(tmp_path: Path) -> None:
    """A crashed proxy of the previous WAL format (one Arrow IPC batch per frame) leaves segments the new one reads."""
    rows = [make_record(i, prompt_len=300) for i in range(3)]
    (tmp_path / "wal").mkdir()
    frames = b"".join(
        wal._FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        for payload in (to_batch([r]).serialize().to_pybytes() for r in rows)
    )
    header = wal._HEADER.pack(wal.MAGIC, 1, SCHEMA_VERSION)
    (tmp_path / "wal" / "wal-00000001.log").write_bytes(header + frames + frames[:25])  # and a torn tail
    with RecordStore.open(tmp_path, "run-1") as store:
        assert store.recovery.recovered_rows == 3 and store.recovery.torn_bytes == 25
        store.append(make_record(3))  # appended in the current format, after the old segment's number
        assert [n for n, _ in wal.list_segments(tmp_path / "wal")] == [2]
    assert _stored(tmp_path) == sorted([*rows, make_record(3)], key=lambda r: r.call_id)


@pytest.mark.parametrize("version", [2, 3])
def test_a_wal_segment_of_an_older_format_is_recovered(tmp_path: Path, version: int) -> None:
    """Format 2 (whole msgpack frames) and 3 (deltas of prompt ids only) are what earlier proxies wrote."""
    root = make_record(0, prompt_len=300, parent_call_id=None, fork_reason=None, prompt_reused_tokens=0)
    rows = [root, make_record(1, prompt_len=300), extend_record(root, 2)]
    (tmp_path / "wal").mkdir()
    payloads = [record_frames.encode(row_parts(r)) for r in rows[:2]]
    last = rows[2]
    base = record_frames.PromptBase(root.call_id, last.prompt_reused_tokens) if version == 3 else None
    payloads.append(record_frames.encode(row_parts(last), base))
    body = b"".join(wal._FRAME.pack(len(p), zlib.crc32(p)) + p for p in payloads)
    (tmp_path / "wal" / "wal-00000001.log").write_bytes(wal._HEADER.pack(wal.MAGIC, version, SCHEMA_VERSION) + body)
    with RecordStore.open(tmp_path, "run-1") as store:
        assert store.recovery.recovered_rows == 3
    assert _stored(tmp_path) == sorted(rows, key=lambda r: r.call_id)


def _crash_copy(folder: Path, to: Path) -> Path:
    """The folder as a crash would leave it now (the store that wrote it still open)."""
    shutil.copytree(folder, to)
    return to


def _wal_growth(store: RecordStore, folder: Path, chain: list[CallRecord]) -> list[int]:
    """Append ``chain``; how many bytes the WAL grew by with each append after the first."""
    sizes = []
    for record in chain:
        store.append(record)
        sizes.append(sum(p.stat().st_size for p in _segments(folder)))
    return [b - a for a, b in zip(sizes, sizes[1:], strict=False)]


def _crash_recovers_all(tmp_path: Path, store: RecordStore, chain: list[CallRecord]) -> None:
    """A crash copy of the open store's folder recovers every row of ``chain``, equal to what the store writes."""
    crashed = _crash_copy(tmp_path / "run", tmp_path / "crashed")
    store.close()
    with RecordStore.open(crashed) as again:
        assert again.recovery.recovered_rows == len(chain)
    assert _stored(crashed) == _stored(tmp_path / "run") == sorted(chain, key=lambda r: r.call_id)


def test_a_call_that_extends_a_buffered_call_writes_only_its_new_ids_and_is_recovered_whole(tmp_path: Path) -> None:
    chain = list(session_chains(12, sessions=2, prompt_len=20_000))
    store = RecordStore.open(tmp_path / "run", "run-1", StoreConfig(shard_rows=100))
    grown = _wal_growth(store, tmp_path / "run", chain)
    assert store.delta_frames == 10
    # a root's frame holds its 20k prompt ids (80 KB); each later one its ~66 new ids, not its ~20k-id prompt
    assert min(grown[:1]) > 80_000 and max(grown[1:]) < 4_000
    _crash_recovers_all(tmp_path, store, chain)


def test_a_tool_loops_frames_hold_only_the_request_bytes_its_parent_did_not_and_recover_whole(tmp_path: Path) -> None:
    blobs = list(tool_loop_requests(16))
    chain = [make_record(0, prompt_len=500, parent_call_id=None, fork_reason=None, prompt_reused_tokens=0,
                         request_canonical=blobs[0])]  # fmt: skip
    for i, blob in enumerate(blobs[1:], 1):
        chain.append(extend_record(chain[-1], i, request_canonical=blob))
    store = RecordStore.open(tmp_path / "run", "run-1", StoreConfig(shard_rows=100))
    grown = _wal_growth(store, tmp_path / "run", chain)
    assert store.delta_frames == 15
    taken = [record_frames.request_base(a, b) for a, b in zip(blobs, blobs[1:], strict=False)]
    # the blob grows every call (~18 KB by the last); the frame holds only what the parent's blob did not start with
    for k, (grew, blob, common) in enumerate(zip(grown, blobs[1:], taken, strict=True)):
        held = len(blob) - common
        assert held <= grew < held + 2_000, k
    assert sum(grown[-5:]) < sum(len(b) for b in blobs[-5:]) / 2
    _crash_recovers_all(tmp_path, store, chain)


def test_a_call_whose_parent_is_already_in_a_shard_gets_a_whole_frame(tmp_path: Path) -> None:
    """A shard retires its rows' segments: a frame must never need one of them to be read back."""
    root = make_record(0, prompt_len=3000, parent_call_id=None, fork_reason=None, prompt_reused_tokens=0)
    first = extend_record(root, 1)
    store = RecordStore.open(tmp_path / "run", "run-1", StoreConfig(shard_rows=2))
    store.append(root)
    store.append(first)  # fills the shard: root and first are now in shard 0 and their segment is gone
    second = extend_record(first, 2)
    store.append(second)
    assert store.delta_frames == 1 and len(_segments(tmp_path / "run")) == 1
    crashed = _crash_copy(tmp_path / "run", tmp_path / "crashed")
    store.close()
    with RecordStore.open(crashed) as again:
        assert again.recovery.recovered_rows == 1
    assert _stored(crashed) == [root, first, second]


def test_a_lineage_that_does_not_hold_gets_a_whole_frame(tmp_path: Path) -> None:
    """A record whose first ids are not its parent's, whatever its ``prompt_reused_tokens`` says, is stored whole."""
    root = make_record(0, prompt_len=300, parent_call_id=None, fork_reason=None, prompt_reused_tokens=0)
    liar = make_record(1, prompt_len=300, parent_call_id=root.call_id, prompt_reused_tokens=200)
    seq = len(root.tokens.prompt_ids) + len(root.tokens.completion_ids)
    overclaim = extend_record(root, 2, prompt_reused_tokens=seq + 5)  # 5 more ids than the parent has
    unclaimed = extend_record(root, 3, prompt_reused_tokens=0)  # no reuse claimed: nothing to share
    store = RecordStore.open(tmp_path / "run", "run-1")
    for record in (root, liar, overclaim, unclaimed):
        store.append(record)
    assert store.delta_frames == 0
    crashed = _crash_copy(tmp_path / "run", tmp_path / "crashed")
    store.close()
    RecordStore.open(crashed).close()
    assert _stored(crashed) == [root, liar, overclaim, unclaimed]


def test_a_delta_frame_whose_parent_is_missing_fails_recovery_loudly(tmp_path: Path) -> None:
    root, child = list(session_chains(4, sessions=3))[0], list(session_chains(4, sessions=3))[3]
    store = RecordStore.open(tmp_path / "run", "run-1")
    store.append(root)
    store.append(child)
    assert store.delta_frames == 1
    crashed = _crash_copy(tmp_path / "run", tmp_path / "crashed")
    store.close()
    (segment,) = _segments(crashed)
    contents = wal.read_segment(segment)
    header = wal._HEADER.pack(wal.MAGIC, wal.FORMAT_VERSION, SCHEMA_VERSION)
    child_frame = contents.frames[1]
    segment.write_bytes(header + wal._FRAME.pack(len(child_frame), zlib.crc32(child_frame)) + child_frame)
    with pytest.raises(RecordStoreError, match="extends .*which no earlier frame holds"):
        RecordStore.open(crashed)
    assert _segments(crashed) == [segment]  # nothing deleted: the WAL is kept for whoever looks into it


def test_close_session_puts_that_sessions_rows_in_shards(tmp_path: Path) -> None:
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=100))
    for i in range(3):
        store.append(make_record(i, session_id="s1"))
    store.append(make_record(3, session_id="s2"))
    store.close_session("nobody")
    assert not list(tmp_path.glob("shard-*"))
    store.close_session("s1")
    assert sorted(_ids(tmp_path)) == sorted(make_record(i, session_id=f"s{s}").call_id for i, s in enumerate("1112"))
    assert _segments(tmp_path) == []
    store.close_session("s1")  # nothing new: no empty shard
    assert len(list(tmp_path.glob("shard-*"))) == 1
    store.close()


def test_background_shards_leave_the_filling_append_to_return_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection (a shard write held on an event): the append that fills the buffer returns once its record
    is durable, while the flusher thread writes the shard; appends meanwhile start the next buffer."""
    release, started = threading.Event(), threading.Event()
    write_shard = record_store.files.write_shard

    def held(*args: object, **kwargs: object) -> None:
        started.set()
        assert release.wait(30)
        write_shard(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(record_store.files, "write_shard", held)
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=3, background_shards=True))
    assert store.flusher is not None
    for i in range(3):
        store.append(make_record(i))  # the third fills the buffer: returns with the shard still unwritten
    assert started.wait(30) and not list(tmp_path.glob("shard-*.parquet"))
    store.append(make_record(3))  # acknowledged while the shard is written
    assert store.buffered_rows == 1
    release.set()
    assert store.flusher.wait_idle(30) and store.flusher.failures == 0
    assert sorted(_ids(tmp_path)) == sorted(make_record(i).call_id for i in range(3))
    store.close()
    assert sorted(_ids(tmp_path)) == sorted(make_record(i).call_id for i in range(4)) and _segments(tmp_path) == []


def test_a_failed_background_shard_is_logged_kept_and_written_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    write_shard, fail = record_store.files.write_shard, [True]

    def flaky(*args: object, **kwargs: object) -> None:
        if fail.pop() if fail else False:
            raise OSError(28, "No space left on device")
        write_shard(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(record_store.files, "write_shard", flaky)
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=2, background_shards=True))
    assert store.flusher is not None
    for i in range(2):
        store.append(make_record(i))  # acknowledged; the shard write fails on the flusher's thread
    assert store.flusher.wait_idle(30) and store.flusher.failures == 1
    assert "background shard write failed" in caplog.text and store.buffered_rows == 2
    store.close()  # retries: the rows were kept
    assert sorted(_ids(tmp_path)) == sorted(make_record(i).call_id for i in range(2)) and _segments(tmp_path) == []


# ------------------------------------------------------------------------------------------------ recovery

_CHILD = """
import sys, time
from addon.records.store import RecordStore, StoreConfig
from tests.record_factory import session_chains
folder, count, shard_rows, background = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
store = RecordStore.open(folder, "run-1", StoreConfig(shard_rows=shard_rows, background_shards=background))
for i, record in enumerate(session_chains(count)):  # three sessions' tool loops: most frames are deltas
    store.append(record)
    print(i, flush=True)  # acknowledged: append returned
print("waiting", flush=True)
time.sleep(600)
"""


def _run_and_kill(
    folder: Path, count: int, shard_rows: int, kill_after: int | None = None, background: bool = False
) -> list[int]:
    """Run a child that appends, SIGKILL it (after ``kill_after`` acks, else once all are in), return the acks."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(folder), str(count), str(shard_rows), "1" if background else "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert child.stdout is not None
    acked: list[int] = []
    for line in child.stdout:
        if line.strip() == "waiting":
            break
        acked.append(int(line))
        if kill_after is not None and len(acked) >= kill_after:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # What the child printed before it died was acknowledged too (it prints after append returns).
    acked += [int(word) for word in child.stdout.read().split() if word.isdigit()]
    return acked


def _call_id(i: int) -> str:
    return make_record(i, session_id=f"s{i % 3}").call_id


def _chain_rows(acked: list[int]) -> list[CallRecord]:
    """The records the child appended for ``acked``, as :func:`_stored` lists them."""
    chain = list(session_chains(max(acked) + 1))
    return sorted((chain[i] for i in acked), key=lambda r: r.call_id)


def test_sigkill_before_the_shard_write_recovers_exactly_the_acknowledged(tmp_path: Path) -> None:
    acked = _run_and_kill(tmp_path, count=17, shard_rows=5)
    assert acked == list(range(17))
    assert len(list(tmp_path.glob("shard-*.parquet"))) == 3 and len(_segments(tmp_path)) == 1
    with RecordStore.open(tmp_path) as store:
        assert (store.recovery.recovered_rows, store.recovery.duplicate_rows, store.recovery.torn_bytes) == (2, 0, 0)
        assert store.counts().rows == 17
    ids = _ids(tmp_path)
    assert sorted(ids) == sorted(_call_id(i) for i in acked) and len(set(ids)) == len(ids)
    assert _manifest(tmp_path)["total_rows"] == 17 and _segments(tmp_path) == []
    assert _stored(tmp_path) == _chain_rows(acked)  # the two rows rebuilt from delta frames included


@pytest.mark.parametrize("background", [False, True], ids=["shards-inline", "shards-in-background"])
def test_sigkill_mid_stream_loses_nothing_acknowledged(tmp_path: Path, background: bool) -> None:
    acked = _run_and_kill(tmp_path, count=10_000, shard_rows=7, kill_after=40, background=background)
    with RecordStore.open(tmp_path):
        pass
    ids = _ids(tmp_path)
    assert len(set(ids)) == len(ids)
    acknowledged = {_call_id(i) for i in acked}
    # The append in flight at the kill may or may not have reached the WAL; nothing else may appear.
    assert acknowledged <= set(ids) <= acknowledged | {_call_id(len(acked))}
    assert acked == list(range(len(acked)))


def test_torn_last_frame_is_skipped(tmp_path: Path) -> None:
    acked = _run_and_kill(tmp_path, count=8, shard_rows=5)
    (segment,) = _segments(tmp_path)
    os.truncate(segment, segment.stat().st_size - 5)  # the last append was torn: it was never acknowledged
    with RecordStore.open(tmp_path) as store:
        assert store.recovery.torn_bytes > 0 and store.recovery.recovered_rows == 2
    assert sorted(_ids(tmp_path)) == sorted(_call_id(i) for i in acked[:-1])
    assert _stored(tmp_path) == _chain_rows(acked[:-1])


def test_crash_between_shard_rename_and_wal_retirement_is_deduplicated(tmp_path: Path) -> None:
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=100))
    for i in range(4):
        store.append(make_record(i))
    (segment,) = _segments(tmp_path)
    kept = segment.read_bytes()
    store.close()  # writes the shard and retires the segment
    segment.write_bytes(kept)  # as if the crash came right after the shard's rename
    with RecordStore.open(tmp_path) as again:
        assert (again.recovery.recovered_rows, again.recovery.duplicate_rows) == (0, 4)
    assert sorted(_ids(tmp_path)) == sorted(make_record(i).call_id for i in range(4))
    assert _segments(tmp_path) == []


def test_tmp_files_removed_and_missing_manifest_rebuilt(tmp_path: Path) -> None:
    with RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=2)) as store:
        for i in range(4):
            store.append(make_record(i))
    expected = _manifest(tmp_path)
    (tmp_path / "shard-00002.parquet.tmp").write_bytes(b"PAR1 half written")
    (tmp_path / "manifest.json.tmp").write_text("{")
    (tmp_path / "manifest.json").unlink()
    with RecordStore.open(tmp_path) as store:
        assert store.recovery.removed_tmp == ("manifest.json.tmp", "shard-00002.parquet.tmp")
        assert store.recovery.manifest_rebuilt
    assert not list(tmp_path.glob("*.tmp"))
    assert _manifest(tmp_path) == expected


def test_recovery_continues_numbering_and_appends(tmp_path: Path) -> None:
    _run_and_kill(tmp_path, count=6, shard_rows=4)
    with RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=4)) as store:
        for i in range(6, 10):
            store.append(make_record(i, session_id=f"s{i % 3}", prompt_len=2000))
    assert sorted(_ids(tmp_path)) == sorted(_call_id(i) for i in range(10))
    assert [s["file"] for s in _manifest(tmp_path)["shards"]] == [f"shard-{n:05d}.parquet" for n in range(3)]


# ------------------------------------------------------------------------------------------------ concurrency


def test_threads_appending_and_closing_sessions_concurrently(tmp_path: Path) -> None:
    store = RecordStore.open(tmp_path, "run-1", StoreConfig(shard_rows=7))
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker(t: int) -> None:
        try:
            for i in range(40):
                store.append(make_record(i, session_id=f"t{t}"))
        except BaseException as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    def closer() -> None:
        while not stop.is_set():
            for t in range(8):
                store.close_session(f"t{t}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    closing = threading.Thread(target=closer)
    closing.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    closing.join()
    assert errors == []
    counts = store.finalize()
    ids = _ids(tmp_path)
    assert counts.rows == len(ids) == len(set(ids)) == 320
    assert set(ids) == {make_record(i, session_id=f"t{t}").call_id for t in range(8) for i in range(40)}
    assert _manifest(tmp_path)["total_rows"] == 320 and _segments(tmp_path) == []


# ------------------------------------------------------------------------------------------------ property


_ops = st.lists(
    st.one_of(
        st.just(("append",)),
        st.just(("extend",)),  # the next call of the last appended record's session: a delta frame if it can be
        st.just(("flush",)),
        st.just(("crash",)),
        st.tuples(st.just("close"), st.sampled_from(["s1", "s2"])),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=_ops, shard_rows=st.integers(1, 6), data=st.data())
def test_any_sequence_written_and_recovered_is_the_same_rows(
    ops: list[tuple[str, ...]], shard_rows: int, data: st.DataObject
) -> None:
    config = StoreConfig(shard_rows=shard_rows, row_group_rows=2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gen0"
        store = RecordStore.open(folder, "run-p", config)
        written: list[CallRecord] = []
        for n, op in enumerate(ops):
            if op[0] == "append" or (op[0] == "extend" and not written):
                rec = data.draw(records(call_id=f"c{len(written)}"))
                store.append(rec)
                written.append(rec)
            elif op[0] == "extend":
                rec = extend_record(written[-1], len(written), new_len=data.draw(st.integers(0, 40)))
                store.append(rec)
                written.append(rec)
            elif op[0] == "flush":
                store.flush()
            elif op[0] == "close":
                store.close_session(op[1])
            else:  # a crash: the disk as it is now, opened by a new process
                snapshot = Path(tmp) / f"gen{n + 1}"
                shutil.copytree(folder, snapshot)
                store.close()
                folder, store = snapshot, RecordStore.open(snapshot, "run-p", config)
        store.close()
        assert _stored(folder) == sorted(written, key=lambda r: r.call_id)


# ------------------------------------------------------------------------------------------------ disk full


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (we run as root in CI and the dev box); grown later with ``mount -o remount``."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_disk_full_raises_and_keeps_the_store_consistent(tiny_disk: Path, tmp_path: Path) -> None:
    folder = tiny_disk / "run"
    store = RecordStore.open(folder, "run-1", StoreConfig(shard_rows=1000))
    acked: list[CallRecord] = []
    with pytest.raises(RecordStoreError, match="was not stored") as info:
        for i in range(1000):
            rec = make_record(i, prompt_len=3000, seed=1000 + i)
            store.append(rec)
            acked.append(rec)
    assert isinstance(info.value.__cause__.__cause__, OSError)  # type: ignore[union-attr]
    assert 5 < len(acked) < 1000
    with pytest.raises(RecordStoreError):  # still full: it keeps failing cleanly
        store.append(make_record(5000, prompt_len=3000, seed=5000))
    snapshot = tmp_path / "crashed-now"
    shutil.copytree(folder, snapshot)
    with RecordStore.open(snapshot) as recovered:
        assert recovered.recovery.torn_bytes == 0  # failed frames were truncated away
    assert _stored(snapshot) == sorted(acked, key=lambda r: r.call_id)

    subprocess.run(["mount", "-o", "remount,size=8m", str(tiny_disk)], check=True)
    late = make_record(9999, prompt_len=3000, seed=9999)
    store.append(late)
    store.close()
    assert _stored(folder) == sorted([*acked, late], key=lambda r: r.call_id)


def test_failed_shard_write_keeps_rows_and_retries(tiny_disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=1m", str(tiny_disk)], check=True)
    store = RecordStore.open(tiny_disk / "run", "run-1", StoreConfig(shard_rows=1000))
    recs = [make_record(i, prompt_len=3000, seed=i) for i in range(12)]
    for rec in recs[:10]:
        store.append(rec)
    ballast = tiny_disk / "ballast"
    with open(ballast, "wb", buffering=0) as f, pytest.raises(OSError):  # fill the disk to the last byte
        while True:
            f.write(b"\0" * 4096)
    with pytest.raises(RecordStoreError, match="writing shard 0 .* failed"):
        store.flush()
    assert not list((tiny_disk / "run").glob("shard-*")) and len(_segments(tiny_disk / "run")) == 1
    ballast.unlink()
    for rec in recs[10:]:
        store.append(rec)
    store.close_session("sess-a")  # retries the failed rows first, with the new ones
    assert sorted(_ids(tiny_disk / "run")) == sorted(r.call_id for r in recs)
    assert _segments(tiny_disk / "run") == []
    assert store.finalize().rows == 12


def test_append_that_fills_a_shard_does_not_raise_when_the_shard_fails(
    tiny_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    subprocess.run(["mount", "-o", "remount,size=1m", str(tiny_disk)], check=True)
    folder = tiny_disk / "run"
    store = RecordStore.open(folder, "run-1", StoreConfig(shard_rows=10))
    recs = [make_record(i, prompt_len=3000, seed=i) for i in range(10)]
    for rec in recs[:9]:
        store.append(rec)
    stat = os.statvfs(tiny_disk)
    # Room for one more WAL frame (~13 KB), not for a 10-row shard (~70 KB compressed).
    (tiny_disk / "ballast").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 24_000))
    store.append(recs[9])  # acknowledged: no exception although its shard write fails
    assert "shard write failed" in caplog.text
    assert not list(folder.glob("shard-*")) and not list(folder.glob("*.tmp"))
    assert store.counts().rows == 10
    with pytest.raises(RecordStoreError, match="writing shard 1 .* failed"):
        store.flush()  # an explicit flush raises while the disk is still full
    (tiny_disk / "ballast").unlink()
    store.close()
    assert _stored(folder) == sorted(recs, key=lambda r: r.call_id)


_FULL_CHILD = """
import os, resource, signal, sys
from addon.records.store import RecordStore, RecordStoreError, StoreConfig
from tests.record_factory import make_record
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
store = RecordStore.open(sys.argv[1], "run-1", StoreConfig(shard_rows=1000))
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
try:
    for i in range(1000):
        store.append(make_record(i, prompt_len=3000, seed=i))
        print(i, flush=True)
except RecordStoreError as e:
    print("error", type(e.__cause__.__cause__).__name__, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # fuller still: the shard cannot be written either
try:
    store.flush()  # fails; the WAL still holds the rows
except RecordStoreError:
    print("flush-error", flush=True)
os._exit(0)  # a crash: no close
"""


def test_file_size_limit_in_a_child_then_recovery(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _FULL_CHILD, str(tmp_path)], capture_output=True, text=True, env=ENV, check=True
    )
    lines = out.stdout.split("\n")
    assert "error OSError" in lines and "flush-error" in lines, out.stdout + out.stderr
    acked = [int(x) for x in lines if x.isdigit()]
    assert len(acked) > 3
    assert not list(tmp_path.glob("*.tmp"))  # the failed shard's tmp file was removed
    with RecordStore.open(tmp_path) as store:
        assert store.recovery.recovered_rows == len(acked)
    assert _stored(tmp_path) == sorted(
        (make_record(i, prompt_len=3000, seed=i) for i in acked), key=lambda r: r.call_id
    )


def test_record_store_module_has_no_mitmproxy_dependency() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, addon.records.store; print('mitmproxy' in sys.modules)"],
        capture_output=True,
        text=True,
        env=ENV,
        check=True,
    )
    assert out.stdout.strip() == "False"
    assert record_store.RecordStore is RecordStore

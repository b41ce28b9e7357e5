"""Benchmark of the record store: the cost of one acknowledged append, and shard write / read throughput.

Rows are realistic for coding agents: 8k prompt ids, 300 completion ids + logprobs, a ~24 KB canonical request
and a ~2 KB canonical completion (zstd-packed JSON), a few tool calls and identity hints.

    .venvs/proxy/bin/python benchmarks/records_append.py [--calls 1000] [--shard-rows 1000] [--dir PATH] \
        [--threads 1 8 32] [--background-rounds 2]

``--dir`` picks the disk to measure (the default is a fresh folder under the system temp dir); fsync cost depends on
it entirely. Printed: append p50/p99/max in ms (record -> WAL frame -> write -> fsync), the append that also
writes a shard, shard write rows/s and MB/s, bytes per row on disk, and read_records rows/s. ``--threads`` then
appends the same rows from that many threads at once (as the addon's worker threads do) into a fresh store and
prints acknowledged appends/s and the per-append latency: with one fsync per append, made under the store's lock,
appends/s cannot exceed 1 / (write + fsync) however many threads wait (the figure group commit would raise).
``--background-rounds`` then appends the rows into fresh stores with shards written inline and by the store's flusher
thread (``background_shards``, the proxy's setting), alternating, and prints what the append that fills a buffer costs.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from addon.records.schema import CallRecord, TurnTokens, pack_json, read_records  # noqa: E402
from addon.records.store import RecordStore, StoreConfig  # noqa: E402


def realistic_record(i: int, rng: random.Random) -> CallRecord:
    t0 = datetime(2026, 12, 2, tzinfo=UTC) + timedelta(seconds=i)
    words = [f"w{rng.randrange(5000)}" for _ in range(4000)]
    return CallRecord(
        run_id="bench",
        session_id=f"s{i % 16}",
        call_index=i // 16,
        call_id=f"bench-{i}",
        harness="claude-code",
        harness_version="2.0.1",
        wire_format="anthropic",
        route="/v1/messages",
        model="claude-sonnet-4-5",
        served_model="smollm2",
        policy_version=3,
        received_at=t0,
        first_token_at=t0 + timedelta(milliseconds=150),
        done_at=t0 + timedelta(seconds=2),
        tokens=TurnTokens(
            tuple(rng.randrange(150_000) for _ in range(8192)),
            tuple(rng.randrange(150_000) for _ in range(300)),
            tuple(-rng.random() * 3 for _ in range(300)),
        ),
        finish_reason="tool_calls",
        tool_call_names=("Bash", "Edit"),
        sampling_requested={"max_tokens": 32000, "temperature": 1.0},
        sampling_applied={"max_tokens": 4096, "temperature": 1.0},
        request_canonical=pack_json({"messages": [{"role": "user", "text": " ".join(words)}]}),
        completion_canonical=pack_json({"text": " ".join(words[:300])}),
        identity_hints={"x-claude-code-session-id": f"cc-{i % 16}"},
    )


def _ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def concurrent_appends(folder: Path, recs: list[CallRecord], threads: int, shard_rows: int) -> None:
    """Append ``recs`` from ``threads`` threads at once; print appends/s and the per-append latency."""
    store = RecordStore.open(folder, "bench", StoreConfig(shard_rows=shard_rows))
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def work(part: list[CallRecord]) -> None:
        mine = []
        start.wait()
        for rec in part:
            t = time.perf_counter()
            store.append(rec)
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=work, args=(recs[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    store.close()
    if len(latencies) != len(recs):
        raise RuntimeError(f"{len(recs) - len(latencies)} appends did not complete")
    print(
        f"{threads} threads: {len(recs) / elapsed:,.0f} acknowledged appends/s, "
        f"append p50 {_ms(latencies, 0.5):.2f} ms, p99 {_ms(latencies, 0.99):.2f} ms (shard writes included)",
        flush=True,
    )


def filling_appends(folder: Path, recs: list[CallRecord], shard_rows: int, background: bool) -> None:
    """Append ``recs`` one by one; print the latency of the appends that fill a shard's buffer and of the rest."""
    store = RecordStore.open(folder, "bench", StoreConfig(shard_rows=shard_rows, background_shards=background))
    filling: list[float] = []
    others: list[float] = []
    for i, rec in enumerate(recs):
        t = time.perf_counter()
        store.append(rec)
        (filling if (i + 1) % shard_rows == 0 else others).append(time.perf_counter() - t)
    store.close()
    assert read_records(folder, columns=["call_id"]).num_rows == len(recs)
    mode = "background" if background else "inline"
    print(
        f"shards {mode}: the {len(filling)} appends that fill a buffer take {_ms(filling, 0.5):.1f} ms (median); "
        f"the others p50 {_ms(others, 0.5):.2f} ms, p99 {_ms(others, 0.99):.2f} ms, max {max(others) * 1e3:.1f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--threads", type=int, nargs="*", default=[], help="concurrent appenders to measure")
    parser.add_argument(
        "--background-rounds",
        type=int,
        default=0,
        help="then append the rows with shards written inline and by the flusher thread, alternating, this many times",
    )
    args = parser.parse_args()
    if any(n < 1 for n in args.threads):
        parser.error("--threads takes positive counts")

    base = Path(tempfile.mkdtemp(prefix="records-bench-", dir=args.dir))
    rng = random.Random(0)
    print(f"building {args.calls} rows (8192 prompt ids, 300 completion ids) ...", flush=True)
    recs = [realistic_record(i, rng) for i in range(args.calls)]
    try:
        store = RecordStore.open(base / "run", "bench", StoreConfig(shard_rows=args.shard_rows))
        appends: list[float] = []
        cut_appends: list[float] = []
        for rec in recs:
            shards_before = store.counts().shards
            t = time.perf_counter()
            store.append(rec)
            elapsed = time.perf_counter() - t
            (cut_appends if store.counts().shards != shards_before else appends).append(elapsed)
        t = time.perf_counter()
        store.close()
        closing = time.perf_counter() - t

        shards = sorted((base / "run").glob("shard-*.parquet"))
        on_disk = sum(s.stat().st_size for s in shards)
        t = time.perf_counter()
        table = read_records(base / "run")
        read_s = time.perf_counter() - t
        assert table.num_rows == args.calls

        mean_ms = statistics.mean(appends) * 1e3
        print(f"folder: {base} ({shutil.disk_usage(base).total / 2**30:.0f} GiB filesystem)")
        print(
            f"append (WAL + fsync), {len(appends)} calls: p50 {_ms(appends, 0.5):.2f} ms, "
            f"p99 {_ms(appends, 0.99):.2f} ms, max {max(appends) * 1e3:.2f} ms, mean {mean_ms:.2f} ms"
        )
        writes = cut_appends + ([closing] if args.calls % args.shard_rows else [])
        write_s = sum(writes)
        print(
            f"shard writes: {len(writes)} shards, {args.calls} rows in {write_s:.2f} s = "
            f"{args.calls / write_s:,.0f} rows/s, {table.nbytes / write_s / 2**20:,.0f} MB/s of Arrow data"
            + (f"; the append that writes a shard takes {_ms(cut_appends, 0.5):.0f} ms" if cut_appends else "")
        )
        per_row_disk, per_row_mem = on_disk / args.calls / 1024, table.nbytes / args.calls / 1024
        print(f"on disk: {per_row_disk:.1f} KiB/row (Arrow in memory {per_row_mem:.1f} KiB/row)")
        print(f"read_records: {args.calls / read_s:,.0f} rows/s")
        for n in args.threads:
            concurrent_appends(base / f"threads-{n}", recs, n, args.shard_rows)
        for r in range(args.background_rounds):
            for background in (False, True):
                filling_appends(base / f"fill-{r}-{background}", recs, args.shard_rows, background)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Generation workers: the capture proxy spread over several processes (``harnessrl_workers=N``).

Contract
--------
With ``N > 1`` the mitmproxy process keeps TLS, HTTP and admission, and is also worker 0; :class:`WorkerPool` starts
``N - 1`` more processes (``python -m addon.serving.worker``), each a whole :class:`~addon.serving.runtime.Runtime`
(engine client, renderer, generator, its own record store and internal server on a free loopback port). A call of
session ``s`` goes to worker :func:`worker_of` ``(s, N)``, a stable hash, so a session's prefix graph, call counter
and records live in one process and attribution stays exact; only the retarget's port differs from ``N = 1``.

Records: worker ``k > 0`` writes ``<records_dir>/worker-<k>`` with the same run id as worker 0 (readers search
folders recursively: :func:`addon.records.schema.shard_files`). Each store fsyncs before the last byte of a call
reaches the client, as with one process.

Admin: worker 0's internal server stays the one admin port; :class:`WorkerPool` is its ``peers``: closing a session
goes to its worker, ``policy_version`` to every worker, and ``sessions``/``stats``/``memory`` merge every worker's
answer (:func:`merge_stats`).

Failure: a worker that exits is started again (its store recovers the write-ahead log; its sessions' prefix graphs
start afresh, which costs one full render each); until it answers, calls for its sessions get the vendor's
retryable 503 from the addon (:meth:`WorkerPool.port_of` returns ``None``). Workers exit when the proxy does: they
take SIGTERM with mitmdump's process group, and also watch their parent.

Why processes: one proxy process spends most of its CPU in Python (mitmproxy's layers, rendering, streaming
encoders, records) under one GIL; session-affine workers put the generator's share on every core. mitmproxy itself
(TLS and HTTP for every call) stays in one process, which bounds how far this scales (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from addon.serving.aio import spawn

log = logging.getLogger("harnessrl.workers")

ROOT = Path(__file__).resolve().parents[2]
HEADER_LOCAL = "x-harnessrl-local"  # on an admin request: answer for this process only (no fan-out to its peers)
READY_PREFIX = "harnessrl-worker-port "  # the worker's first stdout line once its internal server listens
START_TIMEOUT_S = 120.0
RESTART_BACKOFF_S = 1.0


def worker_of(session: str, workers: int) -> int:
    """The worker that owns ``session``: stable across processes and runs (crc32, not Python's salted hash)."""
    if workers <= 1:
        return 0
    return zlib.crc32(session.encode("utf-8", "surrogatepass")) % workers


def worker_records_dir(records_dir: Path, index: int) -> Path:
    return records_dir if index == 0 else records_dir / f"worker-{index}"


@dataclass
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    port: int | None = None  # None while (re)starting
    restarts: int = 0
    pump: asyncio.Task | None = field(default=None, repr=False)


class WorkerPool:
    """Workers ``1..N-1`` of a proxy (worker 0 is the calling process); see the module docstring."""

    def __init__(self, workers: int, options: Mapping[str, Any], run_id: str, records_dir: Path) -> None:
        if workers < 2:
            raise ValueError("a worker pool needs harnessrl_workers >= 2")
        self.workers = workers
        self._options = dict(options)
        self._run_id = run_id
        self._records_dir = records_dir
        self._members = [_Worker(i) for i in range(1, workers)]
        self._monitor: asyncio.Task | None = None
        self._stopping = False
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), trust_env=False)

    # ------------------------------------------------------------------------------------------- lifecycle

    async def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start every worker and wait until each listens (raises ``RuntimeError`` naming the one that did not)."""
        try:
            await asyncio.wait_for(asyncio.gather(*(self._spawn(w) for w in self._members)), timeout)
        except TimeoutError as e:
            await self.stop()
            raise RuntimeError(f"generation workers not ready after {timeout:g} s") from e
        except BaseException:
            await self.stop()
            raise
        self._monitor = spawn(self._watch(), "harnessrl-workers")

    def _argv(self, index: int) -> list[str]:
        options = json.dumps(self._options)
        return [sys.executable, "-m", "addon.serving.worker", "--index", str(index), "--run-id", self._run_id,
                "--records-dir", str(worker_records_dir(self._records_dir, index)), "--options", options]  # fmt: skip

    async def _spawn(self, worker: _Worker) -> None:
        worker.port = None
        proc = await asyncio.create_subprocess_exec(
            *self._argv(worker.index), cwd=ROOT, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
        )
        worker.process = proc
        assert proc.stdout is not None
        while True:
            line = (await proc.stdout.readline()).decode("utf-8", "replace")
            if not line:
                code = await proc.wait()
                raise RuntimeError(f"generation worker {worker.index} exited with status {code} before it listened")
            if line.startswith(READY_PREFIX):
                worker.port = int(line[len(READY_PREFIX) :])
                break
        worker.pump = spawn(_drain(proc.stdout), f"harnessrl-worker-{worker.index}-stdout")
        log.info("harnessrl: generation worker %d (pid %d) on port %d", worker.index, proc.pid, worker.port)

    async def _watch(self, every: float = 1.0) -> None:
        """Restart a worker that exited (the proxy never loses a slice of its sessions for good)."""
        while not self._stopping:
            await asyncio.sleep(every)
            for worker in self._members:
                proc = worker.process
                if self._stopping or proc is None or proc.returncode is None:
                    continue
                log.error(
                    "harnessrl: generation worker %d exited with status %s; starting it again (its sessions get a "
                    "retryable 503 meanwhile)",
                    worker.index,
                    proc.returncode,
                )
                worker.restarts += 1
                await asyncio.sleep(RESTART_BACKOFF_S)
                try:
                    await asyncio.wait_for(self._spawn(worker), START_TIMEOUT_S)
                except (RuntimeError, TimeoutError, OSError) as e:
                    log.error("harnessrl: generation worker %d did not start again: %s", worker.index, e)

    async def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM every worker (each finishes or records its calls and closes its store), SIGKILL after grace."""
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
        procs = [w.process for w in self._members if w.process is not None and w.process.returncode is None]
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        if procs:
            _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=grace_s)
            if pending:
                for proc in procs:
                    if proc.returncode is None:
                        proc.kill()
                await asyncio.wait(pending, timeout=5.0)
        for worker in self._members:
            if worker.pump is not None:
                worker.pump.cancel()
        await self._client.aclose()

    # ------------------------------------------------------------------------------------------- routing

    def port_of(self, index: int) -> int | None:
        """The loopback port of worker ``index`` (>= 1); ``None`` while it (re)starts."""
        return self._members[index - 1].port

    def owner(self, session: str) -> int:
        return worker_of(session, self.workers)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"worker": w.index, "pid": w.process.pid if w.process else None, "port": w.port, "restarts": w.restarts}
            for w in self._members
        ]

    # ------------------------------------------------------------------------------------------- admin fan-out

    async def admin(self, method: str, path: str, body: Any = None, index: int | None = None) -> list[dict]:
        """``/_harnessrl/admin/<path>`` on worker ``index`` (default: every worker 1..N-1), their JSON answers in
        worker order; a worker that cannot answer contributes ``{"worker": k, "error": ...}``."""
        members = self._members if index is None else [self._members[index - 1]]
        return list(await asyncio.gather(*(self._admin_one(w, method, path, body) for w in members)))

    async def _admin_one(self, worker: _Worker, method: str, path: str, body: Any) -> dict:
        if worker.port is None:
            return {"worker": worker.index, "error": "starting"}
        return await ask_admin(self._client, worker.index, worker.port, method, path, body)


async def ask_admin(client: httpx.AsyncClient, worker: int, port: int, method: str, path: str, body: Any) -> dict:
    """``/_harnessrl/admin/<path>`` of the process ``worker`` on ``port``, answered for that process alone
    (``x-harnessrl-local``), as ``{"worker": worker, **its JSON}``; ``{"worker": worker, "error": ...}`` when it
    cannot answer."""
    url = f"http://127.0.0.1:{port}/_harnessrl/admin/{path}"
    try:
        r = await client.request(method, url, json=body, headers={HEADER_LOCAL: "1"})
        answer = r.json()
    except (httpx.HTTPError, ValueError) as e:
        return {"worker": worker, "error": str(e) or type(e).__name__}
    return {"worker": worker, **answer} if isinstance(answer, dict) else {"worker": worker}


async def _drain(stream: asyncio.StreamReader) -> None:
    """Read (and drop) what a worker prints after its ready line, so a full pipe never blocks it; its log goes to
    stderr, which it shares with the proxy."""
    while await stream.readline():
        pass


def merge_stats(own: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Worker 0's stats with the counters of every worker added (calls, tokens, errors, missing logprobs, calls/s)
    and each worker's own snapshot under ``"workers"``; latency percentiles stay per worker (they do not add up)."""
    snapshots = [own, *(o for o in others if not isinstance(o.get("error"), str))]  # leave out workers that failed
    merged = dict(own)
    for key in ("calls", "completion_tokens"):
        merged[key] = sum(s.get(key, 0) for s in snapshots)
    merged["ready"] = all(s.get("ready") is True for s in (own, *others))  # a worker that did not answer is not
    merged["calls_per_s_last_60s"] = round(sum(s.get("calls_per_s_last_60s", 0.0) for s in snapshots), 3)
    for key in ("errors", "missing_logprobs"):  # counts by kind
        totals: Counter[str] = Counter()
        for s in snapshots:
            totals.update(s.get(key, {}))
        merged[key] = dict(totals)
    merged["workers"] = [{"worker": 0, **{k: v for k, v in own.items() if k != "workers"}}, *others]
    return merged

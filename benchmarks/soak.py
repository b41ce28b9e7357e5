"""Load and soak: many concurrent sessions against the fake engine for a long time, through one proxy; then the
shards are checked against the replayer's own log and the proxy's memory is fitted to a line.

Contract
--------
:func:`soak` runs ``sessions`` session slots for ``seconds`` (a slot starts a new seeded session when its session
ends), samples the mitmdump process's RSS every ``sample_s``, stops the proxy (flushing its records) and returns a
:class:`SoakResult`: calls, errors (any non-complete call: none is injected here, so the target is zero), the
shard check (:func:`benchmarks.replayer.verify`: lost / duplicated / misattributed calls), and the RSS slope in
MiB per minute over the second half of the run (after warm-up), with the RSS at start and end. Each session is
closed through the proxy's admin route when it ends, as ``tasks/collect.py`` does (that frees its prefix graph).

To tell a starved machine from a proxy fault the result also carries the load average (start, highest sampled,
end), the fake engine's own view (:class:`benchmarks.load_monitor.LoadMonitor`: event-loop lag, accept queue,
listen overflows; requests aborted by their client), the proxy's own admin stats at the end (``proxy``: calls,
errors by kind, overhead, and under ``loop`` its event loop's worst lag and garbage-collector pauses — every call
of the proxy shares that loop, so its lag is what its timers, the engine connect timeout among them, see), the
longest accept queue seen on the proxy's two listening sockets, how long the proxy took to stop and how many rows
it left in its write-ahead log (0: the store closed cleanly).

CLI (the long form): ``python benchmarks/soak.py --model-dir D [--sessions 384] [--seconds 600]`` prints the
result and writes ``benchmarks/results/soak.md``. The short form is ``tests/test_soak.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from benchmarks import fake_engine, tree  # noqa: E402
from benchmarks.load_monitor import accept_queue  # noqa: E402
from benchmarks.replayer import BaseUrl, Proxied, Verdict, recover, replay, summary, verify  # noqa: E402
from benchmarks.sessions import FORMATS, SessionScript, make_script  # noqa: E402


@dataclass(frozen=True)
class SoakResult:
    sessions: int
    seconds: float
    calls: int
    complete: int
    errors: dict[str, int]
    verdict: Verdict
    rss_start_mib: float
    rss_end_mib: float
    rss_slope_mib_per_min: float
    samples: int
    summary: dict[str, float]
    load: tuple[float, float, float]
    error_examples: tuple[str, ...] = ()  # a few failed calls' full answers, to see why
    closed_sessions: int = 0
    close_errors: int = 0
    load_1min: tuple[float, float, float] = (0.0, 0.0, 0.0)  # start, highest sampled, end
    engine: dict[str, Any] = field(default_factory=dict)  # the fake engine's /_fake/stats at the end
    proxy: dict[str, Any] = field(default_factory=dict)  # the proxy's admin stats at the end (its "loop" health)
    proxy_accept_queue_max: dict[str, int] = field(default_factory=dict)  # mitmproxy's and the internal server's
    stop_s: float = 0.0
    wal_rows_left: int = 0  # rows the stopped proxy left in its write-ahead log (recovered before the check)
    memory: dict[str, Any] = field(default_factory=dict)  # the proxy's admin memory report at the end, and a trim
    memory_series: tuple[dict[str, Any], ...] = ()  # RSS vs live structures vs allocator slack, every 30 s

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.errors and not self.close_errors


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute (0 with fewer than two points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


class _Sampler(threading.Thread):
    """RSS of ``pid``, the 1-minute load average and the accept queues of ``ports``, every ``every`` s."""

    def __init__(
        self, pid: int, every: float, ports: dict[str, int], admin_port: int = 0, memory_every: int = 6
    ) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.ports = pid, every, ports
        self.admin_port, self.memory_every = admin_port, memory_every
        self.memory: list[dict[str, Any]] = []  # the proxy's light memory report every memory_every samples
        self.points: list[tuple[float, float]] = []
        self.loads: list[float] = []
        self.queues = dict.fromkeys(ports, 0)
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.halt.is_set():
            self.points.append((time.monotonic() - t0, tree.rss_bytes(self.pid) / 2**20))
            self.loads.append(tree.loadavg()[0])
            for name, port in self.ports.items():
                self.queues[name] = max(self.queues[name], accept_queue(port))
            if self.admin_port and len(self.points) % self.memory_every == 1:
                self._sample_memory(time.monotonic() - t0)
            self.halt.wait(self.every)

    def _sample_memory(self, t: float) -> None:
        """RSS next to what is live (graphs, cached JSON) and what glibc holds free: growth of live data vs of
        allocator slack."""
        url = f"http://127.0.0.1:{self.admin_port}/_harnessrl/admin/memory?objects=0"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                rep = json.loads(r.read())
        except OSError:
            return
        gen = rep["structures"].get("generator") or {}
        malloc = rep.get("malloc") or {}
        self.memory.append(
            {
                "t_s": round(t),
                "rss_mib": rep["rss_mib"],
                "malloc_in_use_mib": malloc.get("in_use_mib"),
                "malloc_free_mib": malloc.get("free_held_mib"),
                "graph_sessions": gen.get("graph_sessions"),
                "graph_token_ids_m": round(gen.get("graph_token_ids", 0) / 1e6, 2),
                "json_fragment_mchars": round(gen.get("json_fragment_chars", 0) / 1e6, 1),
            }
        )


def proxy_admin_stats(admin_port: int) -> dict[str, Any]:
    """The proxy's ``/_harnessrl/admin/stats`` (calls, errors, overhead, event-loop lag and GC pauses)."""
    url = f"http://127.0.0.1:{admin_port}/_harnessrl/admin/stats"
    with urllib.request.urlopen(url, timeout=60) as r:
        return dict(json.loads(r.read()))


def proxy_memory(admin_port: int, top: int = 15) -> dict[str, Any]:
    """The proxy's ``/_harnessrl/admin/memory`` report, then what a ``malloc_trim`` gives back (RSS before/after):
    live data vs memory the C allocator holds free."""
    base = f"http://127.0.0.1:{admin_port}/_harnessrl/admin/memory"
    with urllib.request.urlopen(f"{base}?top={top}", timeout=300) as r:
        report = dict(json.loads(r.read()))
    with urllib.request.urlopen(urllib.request.Request(f"{base}/trim", method="POST"), timeout=60) as r:
        report["trim"] = json.loads(r.read())
    return report


def soak(
    model_dir: str | Path,
    sessions: int,
    seconds: float,
    work: Path,
    *,
    token_rate: float = 50.0,
    tokens: int = 64,
    seed: int = 7,
    sample_s: float = 5.0,
    scale: float = 1.0,
    tracemalloc_frames: int = 0,
    options: tuple[str, ...] = (),
    base_url: bool = False,
) -> SoakResult:
    engine = fake_engine.spawn(model_dir, launch.free_port(), token_rate=token_rate, tokens=tokens)
    try:
        env = {"PYTHONTRACEMALLOC": str(tracemalloc_frames)} if tracemalloc_frames else None
        (proxy,) = tree.start_proxies(engine.url, 1, work, model_dir, options, env=env)
        ports = {"mitmproxy": proxy.port, "internal": proxy.admin_port}
        sampler = _Sampler(proxy.process.pid, sample_s, ports, proxy.admin_port)
        sampler.start()

        def make(i: int) -> SessionScript:
            return make_script(seed, i, FORMATS[i % 4], scale=scale)

        target = BaseUrl((proxy,)) if base_url else Proxied((proxy,))
        try:
            log = asyncio.run(replay(target, concurrency=sessions, make=make, duration_s=seconds, close_sessions=True))
        finally:
            sampler.halt.set()
            sampler.join()
            engine_stats = engine.stats()
            proxy_stats = proxy_admin_stats(proxy.admin_port)
            memory = proxy_memory(proxy.admin_port)
            t_stop = time.monotonic()
            proxy.stop()
            stop_s = time.monotonic() - t_stop
    finally:
        engine.stop()
    wal_rows_left = recover([proxy.records])
    pts, loads = sampler.points, sampler.loads or [0.0]
    half = [p for p in pts if p[0] >= pts[-1][0] / 2] if pts else []
    return SoakResult(
        sessions=sessions,
        seconds=seconds,
        calls=len(log.calls),
        complete=len(log.completed()),
        errors=dict(log.errors()),
        verdict=verify(log, [proxy.records]),
        rss_start_mib=round(pts[0][1], 1) if pts else 0.0,
        rss_end_mib=round(pts[-1][1], 1) if pts else 0.0,
        rss_slope_mib_per_min=round(slope_per_min(half), 2),
        samples=len(pts),
        summary=summary(log),
        load=tree.loadavg(),
        error_examples=tuple({(c.error or "")[:400] for c in log.calls if not c.complete})[:3],
        closed_sessions=log.closed,
        close_errors=len(log.close_errors),
        load_1min=(loads[0], max(loads), loads[-1]),
        engine=engine_stats,
        proxy=proxy_stats,
        proxy_accept_queue_max=dict(sampler.queues),
        stop_s=round(stop_s, 2),
        wal_rows_left=wal_rows_left,
        memory=memory,
        memory_series=tuple(sampler.memory),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sessions", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--token-rate", type=float, default=50.0)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a proxy option (repeatable)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every text size of the sessions")
    ap.add_argument(
        "--tracemalloc", type=int, default=0, metavar="FRAMES", help="trace the proxy's allocations (slows it)"
    )
    ap.add_argument("--base-url", action="store_true", help="the sessions take the proxy's base URL, not mitmproxy")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="harnessrl-soak-") as tmp:
        result = soak(
            args.model_dir,
            args.sessions,
            args.seconds,
            Path(tmp),
            token_rate=args.token_rate,
            scale=args.scale,
            tracemalloc_frames=args.tracemalloc,
            options=tuple(args.set),
            base_url=args.base_url,
        )
    text = json.dumps(asdict(result) | {"ok": result.ok}, indent=1, default=str)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / "soak.md").write_text(
        f"# Soak\n\nMachine: {tree.machine_facts().markdown()}. Commit {tree.git_rev()}.\n\n"
        f"Command: `{cmd}`\n\n```json\n{text}\n```\n"
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())

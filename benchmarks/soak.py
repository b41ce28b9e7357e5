"""Load and soak: many concurrent sessions against the fake engine for a long time, through one proxy; then the
shards are checked against the replayer's own log and the proxy's memory is fitted to a line.

Contract
--------
:func:`soak` runs ``sessions`` session slots for ``seconds`` (a slot starts a new seeded session when its session
ends), samples the mitmdump process's RSS every ``sample_s``, stops the proxy (flushing its records) and returns a
:class:`SoakResult`: calls, errors (any non-complete call: none is injected here, so the target is zero), the
shard check (:func:`benchmarks.replayer.verify`: lost / duplicated / misattributed calls), and the RSS slope in
MiB per minute over the second half of the run (after warm-up), with the RSS at start and end.

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
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from benchmarks import fake_engine, tree  # noqa: E402
from benchmarks.replayer import Proxied, Verdict, replay, summary, verify  # noqa: E402
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

    @property
    def ok(self) -> bool:
        return self.verdict.ok and not self.errors


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
    def __init__(self, pid: int, every: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.points: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.halt.is_set():
            self.points.append((time.monotonic() - t0, tree.rss_bytes(self.pid) / 2**20))
            self.halt.wait(self.every)


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
) -> SoakResult:
    engine = fake_engine.spawn(model_dir, launch.free_port(), token_rate=token_rate, tokens=tokens)
    try:
        (proxy,) = tree.start_proxies(engine.url, 1, work, model_dir)
        sampler = _Sampler(proxy.process.pid, sample_s)
        sampler.start()

        def make(i: int) -> SessionScript:
            return make_script(seed, i, FORMATS[i % 4], scale=scale)

        try:
            log = asyncio.run(replay(Proxied((proxy,)), concurrency=sessions, make=make, duration_s=seconds))
        finally:
            sampler.halt.set()
            sampler.join()
            proxy.stop()
    finally:
        engine.stop()
    pts = sampler.points
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
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sessions", type=int, default=384)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--token-rate", type=float, default=50.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="harnessrl-soak-") as tmp:
        result = soak(args.model_dir, args.sessions, args.seconds, Path(tmp), token_rate=args.token_rate)
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

"""One port with and without tunnels handed to their session's process, against as many separate proxies.

``python benchmarks/handover_compare.py --model-dir M [--levels 192] [--procs 2] [--rounds 3] [--seconds 20]``

Per round and level, against the paced fake engine (benchmarks/fake_engine.py, as side_by_side.py's load levels):
the replayer straight to the engine (the round's direct baseline), then, in an order that reverses every round,
``--procs`` mitmdumps on one port with ``harnessrl_handover`` on (``one port``), the same with it off (``one port,
no handover``: a tunnel stays in the process the kernel picked, and its calls are forwarded to the owner), and
``--procs`` separate proxies with the sessions split over them by the client (``separate proxies``). Each target's
calls/s is taken as a share of its own round's direct run, and the page gives the median over rounds: one 20 s
sample of a level moves by a tenth between runs on a shared machine, more than the difference measured. Every
target's shards are checked against the replayer's log, and each process's calls are listed (the sessions' owners
are ``crc32(session) mod N``; the separate proxies get the sessions round-robin).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from benchmarks import fake_engine, tree  # noqa: E402
from benchmarks.replayer import Direct, Proxied, verify  # noqa: E402
from benchmarks.side_by_side import run_level  # noqa: E402

TARGETS = ("one port", "one port, no handover", "separate proxies")


@dataclass(frozen=True)
class Sample:
    round: int
    sessions: int
    target: str
    calls_per_s: float
    direct_calls_per_s: float
    cpu_ms_per_call: float
    per_process: tuple[int, ...] = ()
    errors: int = 0
    shards_ok: bool = True

    @property
    def share(self) -> float:
        return self.calls_per_s / self.direct_calls_per_s if self.direct_calls_per_s else float("nan")


def order(round_index: int) -> tuple[str, ...]:
    """The targets' order in a round: reversed every other round, so a drift of the machine's speed over a run
    falls on every target alike."""
    return TARGETS if round_index % 2 == 0 else TARGETS[::-1]


def summary(samples: Sequence[Sample]) -> list[str]:
    """A Markdown table: per level and target, the median share of direct and CPU per call over the rounds, and
    each round's share."""
    out = [
        "| sessions | target | % of direct, median | each round | CPU ms/call, median | calls/s, median | errors "
        "| shards check |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in sorted({s.sessions for s in samples}):
        for target in TARGETS:
            mine = sorted((s for s in samples if s.sessions == n and s.target == target), key=lambda s: s.round)
            if not mine:
                continue
            share = statistics.median(s.share for s in mine)
            rounds = " / ".join(f"{100 * s.share:.0f}" for s in mine)
            cpu = statistics.median(s.cpu_ms_per_call for s in mine)
            cps = statistics.median(s.calls_per_s for s in mine)
            ok = "ok" if all(s.shards_ok for s in mine) else "FAILED"
            out.append(
                f"| {n} | {target} | {100 * share:.0f}% | {rounds} | {cpu:.2f} | {cps:.1f} | "
                f"{sum(s.errors for s in mine)} | {ok} |"
            )
    return out


def own_calls(handle: launch.ProxyHandle) -> int:
    url = f"http://127.0.0.1:{handle.admin_port}/_harnessrl/admin/stats"
    return int(httpx.get(url, headers={"x-harnessrl-local": "1"}, timeout=30).json()["calls"])


def run(model_dir: str, levels: Sequence[int], procs: int, rounds: int, seconds: float, seed: int) -> list[Sample]:
    samples: list[Sample] = []
    with tempfile.TemporaryDirectory(prefix="harnessrl-handover-") as tmp:
        engine = fake_engine.spawn(model_dir, launch.free_port(), token_rate=100.0, tokens=64)
        try:
            for r in range(rounds):
                for n in levels:
                    direct, _ = run_level("direct", Direct(engine.url), n, seconds, seed)
                    for target in order(r):
                        shared = target != "separate proxies"
                        options = (f"harnessrl_handover={'false' if 'no handover' in target else 'true'}",)
                        where = Path(tmp) / f"r{r}-{n}-{TARGETS.index(target)}"
                        handles = tree.start_proxies(
                            engine.url, procs, where, model_dir, options=options, shared=shared
                        )
                        try:
                            row, log = run_level(target, Proxied(tuple(handles)), n, seconds, seed)
                            calls = tuple(own_calls(h) for h in handles)
                        finally:
                            for h in handles:
                                h.stop()
                        sample = Sample(
                            r, n, target, row.calls_per_s, direct.calls_per_s, row.cpu_s_per_call * 1e3, calls,
                            row.errors, verify(log, [h.records for h in handles]).ok,
                        )  # fmt: skip
                        print(
                            f"round {r} {n} sessions, {target}: {100 * sample.share:.0f}% of direct "
                            f"({sample.calls_per_s:.1f} / {direct.calls_per_s:.1f} calls/s), "
                            f"{sample.cpu_ms_per_call:.2f} ms CPU/call, calls by process {list(calls)}",
                            flush=True,
                        )
                        samples.append(sample)
        finally:
            engine.stop()
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--levels", type=int, nargs="+", default=[192])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.procs < 2:
        ap.error("--procs must be at least 2: one port is shared by several processes")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    samples = run(args.model_dir, args.levels, args.procs, args.rounds, args.seconds, args.seed)
    print(f"\n# One port with and without handover ({args.procs} processes, {tree.loadavg()} load at end)\n")
    print("\n".join(summary(samples)))
    return 0 if all(s.shards_ok for s in samples) else 1


if __name__ == "__main__":
    raise SystemExit(main())

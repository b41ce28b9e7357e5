"""Added latency per call through mitmproxy, source tree against source tree, in one run.

For each round and context size, each tree in turn (a fresh process importing that tree: its proxy is that tree's
``mitmdump -s addon/capture.py``) runs :func:`benchmarks.side_by_side.context_sweep` through HTTPS_PROXY against its
own fake engine: the same seeded sessions straight to the engine, then through the proxy; added = proxied - direct,
same session and call. Two engine speeds: ``instant`` (every token at once: the proxy's whole cost is on the
critical path) and ``paced`` (``--token-rate`` tokens/s, as a real engine streams: work the proxy does while the
engine samples is hidden). Prints one Markdown table (medians over the rounds of each tree's p50/p99).

Usage (proxy env)::

    git worktree add /tmp/base HEAD~3
    python benchmarks/context_compare.py --model-dir D --compare before=/tmp/base after=. [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def one(tree: Path, model_dir: str, contexts: list[int], calls: int, rate: float, seed: int) -> list[dict[str, Any]]:
    """The context sweep with ``tree``'s proxy (this process imports ``tree``: run it in a fresh process)."""
    sys.path.insert(0, str(tree))
    from addon import launch
    from benchmarks import fake_engine
    from benchmarks import tree as facts
    from benchmarks.replayer import Proxied
    from benchmarks.side_by_side import context_sweep

    if not Path(launch.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"addon.launch came from {launch.__file__}, not from {tree}")
    with tempfile.TemporaryDirectory(prefix="harnessrl-ctx-") as tmp:
        engine = fake_engine.spawn(model_dir, launch.free_port(), token_rate=rate, tokens=64)
        try:
            (proxy,) = facts.start_proxies(engine.url, 1, Path(tmp) / "p", model_dir)
            try:
                return [asdict(r) for r in context_sweep(engine.url, Proxied((proxy,)), contexts, calls, seed)]
            finally:
                proxy.stop()
        finally:
            engine.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--compare", nargs="+", default=[], metavar="LABEL=TREE")
    ap.add_argument("--contexts", type=int, nargs="+", default=[8_000, 32_000, 128_000])
    ap.add_argument("--calls", type=int, default=6, help="calls per session (the first is not steady state)")
    ap.add_argument("--token-rate", type=float, default=100.0, help="tokens/s of the paced engine")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--speeds", nargs="+", choices=["instant", "paced"], default=["instant", "paced"])
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # internal: one tree, JSON out
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.model_dir = str(Path(args.model_dir).resolve())  # the engines run in each tree's folder
    if args.one is not None:
        print(json.dumps(one(args.one, args.model_dir, args.contexts, args.calls, args.rate, args.seed)))
        return 0
    sys.path.insert(0, str(ROOT))  # this process measures nothing itself: it imports only this tree
    from benchmarks import tree as facts

    trees = facts.source_trees(args.compare, ap.error)

    speeds = [(name, rate) for name, rate in (("instant", 0.0), ("paced", args.token_rate)) if name in args.speeds]
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    print("# Added latency per call through mitmproxy: tree against tree\n")
    print(f"Machine: {facts.machine_facts().markdown()}. Load at start {facts.loadavg()}.\n")
    print("Command: `python benchmarks/context_compare.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`\n")
    for _ in range(args.rounds):
        for speed, rate in speeds:
            for label, tree in trees:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--model-dir", args.model_dir, "--one", str(tree)]
                cmd += ["--rate", str(rate), "--calls", str(args.calls), "--seed", str(args.seed), "--contexts"]
                done = subprocess.run(cmd + [str(c) for c in args.contexts], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{label} ({tree}) failed:\n{done.stderr[-3000:]}")
                for row in json.loads(done.stdout.strip().splitlines()[-1]):
                    runs[(speed, label, row["target_tokens"])].append(row)
    print("| engine | context | tree | prompt tokens | added p50 ms | added p99 ms | first call added p50 ms "
          "| direct p50 ms |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for speed, _ in speeds:
        for c in args.contexts:
            for label, _ in trees:
                rows = runs[(speed, label, c)]

                def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                    return statistics.median(r[key] for r in rows)

                cells = [med(k) for k in ("steady_p50_ms", "steady_p99_ms", "first_p50_ms", "direct_p50_ms")]
                row = f"| {speed} | {c} | {label} | {int(med('prompt_tokens_p50'))} | "
                print(row + " | ".join(f"{v:.1f}" for v in cells) + " |")
    print(f"\nLoad at end {facts.loadavg()}. Medians over {args.rounds} rounds; trees alternate within each round.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

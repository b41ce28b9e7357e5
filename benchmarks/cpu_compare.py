"""CPU per call and calls/s at one load level, source tree against source tree, in one run.

For each round, target and tree in turn (a fresh process importing that tree: its proxy is that tree's
``mitmdump -s addon/capture.py``), one proxy runs :func:`benchmarks.side_by_side.run_level`: ``--sessions``
concurrent seeded sessions (the four formats) for ``--seconds`` against its own fake engine at ``--token-rate``
tokens/s, through mitmproxy (``mitm``: HTTPS_PROXY) or its base URL (``base``). The proxy's CPU seconds over the
level divided by its completed calls is its CPU per call; the shards are checked against the replayer's log
(0 lost / duplicated / misattributed). Prints one Markdown table of medians over the rounds. What a change does to
a call's CPU shows here where a lone call's latency (``context_compare.py``) hides it under the run-to-run spread.

``--variants LABEL=OPTION[,OPTION...]`` runs each tree once per variant, its proxy started with those mitmproxy
options (``--set name=value``): what an option costs or saves per call, e.g. ``harnessrl_stream_interval`` (each
engine event a call streams is a chunk the proxy relays; through mitmproxy a relayed chunk is the dearer part).

Usage (proxy env)::

    git worktree add /tmp/base HEAD~3
    python benchmarks/cpu_compare.py --model-dir D --compare before=/tmp/base after=. [--sessions 32] [--rounds 3]
    python benchmarks/cpu_compare.py --model-dir D --compare this=. \\
        --variants i8=harnessrl_stream_interval=8 i16=harnessrl_stream_interval=16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("base", "mitm")


def one(
    tree: Path, model_dir: str, target: str, sessions: int, seconds: float, rate: float, options: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One level with ``tree``'s proxy (this process imports ``tree``: run it in a fresh process). The imports and
    start-up are context_compare's ``one`` again on purpose: a helper of this tree would be imported from ``tree``,
    where an older tree does not have it."""
    sys.path.insert(0, str(tree))
    from addon import launch
    from benchmarks import fake_engine
    from benchmarks import tree as facts
    from benchmarks.replayer import BaseUrl, Proxied, verify
    from benchmarks.side_by_side import run_level

    if not Path(launch.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"addon.launch came from {launch.__file__}, not from {tree}")
    with tempfile.TemporaryDirectory(prefix="harnessrl-cpu-") as tmp:
        engine = fake_engine.spawn(model_dir, launch.free_port(), token_rate=rate, tokens=64)
        try:
            (proxy,) = facts.start_proxies(engine.url, 1, Path(tmp) / "p", model_dir, options=options)
            try:
                way = BaseUrl((proxy,)) if target == "base" else Proxied((proxy,))
                row, log = run_level(target, way, sessions, seconds, seed=0)
            finally:
                proxy.stop()
            ok = verify(log, [proxy.records]).ok
        finally:
            engine.stop()
    return {"calls_per_s": row.calls_per_s, "cpu_ms": row.cpu_s_per_call * 1e3, "p50_ms": row.p50_ms,
            "p99_ms": row.p99_ms, "errors": row.errors, "calls": row.calls, "ok": ok}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--compare", nargs="+", default=[], metavar="LABEL=TREE")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0, help="per level")
    ap.add_argument("--token-rate", type=float, default=100.0, help="tokens/s of the fake engine (0: instant)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=[], metavar="LABEL=OPTION[,OPTION]", help="proxy options")
    ap.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # internal: one tree, JSON out
    ap.add_argument("--target", choices=TARGETS, default="mitm", help=argparse.SUPPRESS)
    ap.add_argument("--proxy-options", default="", help=argparse.SUPPRESS)  # internal: the variant's options
    args = ap.parse_args(argv)
    args.model_dir = str(Path(args.model_dir).resolve())  # the engines run in each tree's folder
    if args.one is not None:
        options = tuple(o for o in args.proxy_options.split(",") if o)
        result = one(args.one, args.model_dir, args.target, args.sessions, args.seconds, args.token_rate, options)
        print(json.dumps(result))
        return 0
    sys.path.insert(0, str(ROOT))  # this process measures nothing itself: it imports only this tree
    from benchmarks import tree as facts

    trees = facts.source_trees(args.compare, ap.error)
    variants = [_variant(v, ap.error) for v in args.variants] or [("", "")]
    runs_of = [(f"{label}/{name}" if name and len(trees) > 1 else name or label, tree, opts)
               for label, tree in trees for name, opts in variants]  # fmt: skip

    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    print("# CPU per call at one load level: tree against tree\n")
    print(f"Machine: {facts.machine_facts().markdown()}. Load at start {facts.loadavg()}.\n")
    print("Command: `python benchmarks/cpu_compare.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`\n")
    for r in range(args.rounds):
        for target in args.targets:
            for label, tree, opts in runs_of:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--model-dir", args.model_dir, "--one", str(tree)]
                cmd += ["--target", target, "--sessions", str(args.sessions), "--seconds", str(args.seconds)]
                cmd += ["--proxy-options", opts]
                done = subprocess.run(cmd + ["--token-rate", str(args.token_rate)], capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{label} ({tree}) failed:\n{done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs[(target, label)].append(result)
                print(f"<!-- round {r + 1} {target} {label}: {json.dumps(result)} -->", flush=True)
    print(f"\n{args.sessions} sessions, {args.seconds:g} s per level, fake engine at {args.token_rate:g} tokens/s.\n")
    print("| path | tree | CPU ms/call (each round) | CPU ms/call median | calls/s median | p50 ms | p99 ms | errors "
          "| shards check |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for target in args.targets:
        for label, _, _ in runs_of:
            rows = runs[(target, label)]

            def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                return statistics.median(r[key] for r in rows)

            each = " / ".join(f"{r['cpu_ms']:.2f}" for r in rows)
            check = "ok" if all(r["ok"] for r in rows) else "FAILED"
            errors = sum(r["errors"] for r in rows)
            print(f"| {target} | {label} | {each} | {med('cpu_ms'):.2f} | {med('calls_per_s'):.1f} | "
                  f"{med('p50_ms'):.0f} | {med('p99_ms'):.0f} | {errors} | {check} |")  # fmt: skip
    for name, opts in variants:
        if name:
            print(f"\nVariant {name}: `{' '.join('--set ' + o for o in opts.split(','))}`.")
    print(f"\nLoad at end {facts.loadavg()}. Trees (and variants) alternate within each round.")
    return 0


def _variant(text: str, error: Any) -> tuple[str, str]:
    """``LABEL=name=value[,name=value]`` -> (label, "name=value,..."), each option checked for its ``=``."""
    label, _, opts = text.partition("=")
    if not label or not opts or any("=" not in o for o in opts.split(",")):
        error(f"--variants {text!r}: expected LABEL=OPTION=VALUE[,OPTION=VALUE]")
    return label, opts


if __name__ == "__main__":
    sys.exit(main())

"""Side by side in one process tree: direct-to-engine, harnessrl with 1 and N mitmdump processes (and OpenEnv's
capture server, see :mod:`benchmarks.openenv_peer`), the same seeded sessions through each, against the fast fake
engine; plus a small end-to-end replay against the real vLLM engine. Writes a Markdown page + PNGs.

Figures (each measured side by side in this run, with the load average next to it):

* added latency per call (proxied minus direct, same session and call) at ~8k/32k/128k-token contexts: p50/p99 of
  the steady state (calls that extend their previous call) and the first call (a full render);
* calls/s, p50 latency, fraction of direct throughput at 32/96/192/384 concurrent sessions;
* CPU seconds per call and RSS per session of the mitmdump processes (``/proc``);
* calls/s per process: measured at saturation, and 1 / CPU seconds per call (what one busy core sustains);
* durability cost per call: the fsync'd record append, timed on this run's own rows in the same folder;
* end-to-end: the same small sessions through the proxy and straight to vLLM's chat route.

Usage (proxy env): ``python benchmarks/side_by_side.py --model-dir D [--seconds 30] [--procs 2]
[--levels 32 96 192 384] [--engine-url URL] [--openenv-python PY] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.records.schema import read_records, records_from_table  # noqa: E402
from addon.records.store import RecordStore  # noqa: E402
from benchmarks import fake_engine, tree  # noqa: E402
from benchmarks.context_sweep import ContextRow, context_sweeps, pct  # noqa: E402

# (context_compare.py imports it from here in every tree it compares, older trees included)
from benchmarks.context_sweep import context_sweep as context_sweep  # noqa: E402
from benchmarks.replayer import BaseUrl, Direct, Internal, Proxied, ReplayLog, Target, replay, verify  # noqa: E402
from benchmarks.sessions import FORMATS, SessionScript, make_script  # noqa: E402
from converters.canonical import WireFormat  # noqa: E402
from tasks.figures import BarSeries, bar_figure, png  # noqa: E402

# --------------------------------------------------------------------------------------------------- load levels


@dataclass(frozen=True)
class LevelRow:
    target: str
    sessions: int
    calls: int
    errors: int
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_s_per_call: float
    rss_mib_per_session: float
    load: float
    verdict_ok: bool | None
    error_kinds: str = ""  # the commonest failures, "status:message" (status 0: no HTTP answer)


def run_level(
    name: str,
    target: Target,
    sessions: int,
    seconds: float,
    seed: int,
    formats: Sequence[WireFormat] = FORMATS,
    pids: Sequence[int] = (),
) -> tuple[LevelRow, ReplayLog]:
    """``sessions`` slots for ``seconds``; CPU and RSS are those of the proxies (or of ``pids``)."""
    procs = list(pids) or ([h.process.pid for h in target.proxies] if isinstance(target, Proxied | BaseUrl) else [])
    cpu0 = sum(tree.cpu_seconds(p) for p in procs)
    rss0 = sum(tree.rss_bytes(p) for p in procs)

    def make(i: int) -> SessionScript:
        return make_script(seed, sessions * 1_000_000 + i, formats[i % len(formats)])

    log = asyncio.run(replay(target, concurrency=sessions, make=make, duration_s=seconds, timeout=300))
    done = log.completed()
    cpu = sum(tree.cpu_seconds(p) for p in procs) - cpu0
    rss = sum(tree.rss_bytes(p) for p in procs) - rss0
    lat = [c.total_s for c in done]
    row = LevelRow(
        name,
        sessions,
        len(done),
        len(log.calls) - len(done),
        len(done) / log.wall_s,
        pct(lat, 0.5) * 1e3,
        pct(lat, 0.99) * 1e3,
        cpu / max(1, len(done)) if procs else float("nan"),
        rss / 2**20 / max(1, log.sessions) if procs else float("nan"),
        tree.loadavg()[0],
        None,
        "; ".join(f"{n}x {k}" for k, n in log.errors().most_common(2)),
    )
    print(f"level {name} x{sessions}: {asdict(row)}", flush=True)
    return row, log


def load_levels(
    engine_url: str, levels: Sequence[int], procs: int, seconds: float, seed: int, model_dir: str, work: Path
) -> list[LevelRow]:
    rows: list[LevelRow] = []
    for n in levels:
        rows.append(run_level("direct", Direct(engine_url), n, seconds, seed)[0])
        # (mitmdump processes, base URL, generation workers per mitmdump, the processes sharing one port, tunnels
        # handed to their session's process: harnessrl_handover)
        variants = [(k, False, 1, False, True) for k in sorted({1, procs})]
        if procs > 1:
            variants += [(procs, False, 1, True, True), (procs, False, 1, True, False), (1, False, procs, False, True)]
        for k, base_url, workers, shared, handover in [*variants, (1, True, 1, False, True)]:
            options = (f"harnessrl_workers={workers}", f"harnessrl_handover={str(handover).lower()}")
            where = work / f"lvl-{n}-{k}-{base_url}-w{workers}-{'shared' if shared else 'own'}-{handover}"
            handles = tree.start_proxies(engine_url, k, where, model_dir, options=options, shared=shared)
            if base_url:
                name, target = "harnessrl base URL x1", BaseUrl(tuple(handles))
            elif shared:  # the replayer spreads sessions over the handles: every one names the same port
                name = f"harnessrl x{k} one port" + ("" if handover else ", no handover")
                target = Proxied(tuple(handles))
            else:
                name = f"harnessrl x{k}" + (f" workers{workers}" if workers > 1 else "")
                target = Proxied(tuple(handles))
            try:
                row, log = run_level(name, target, n, seconds, seed)
            finally:
                for h in handles:
                    h.stop()
            rows.append(replace(row, verdict_ok=verify(log, [h.records for h in handles]).ok))
    return rows


# --------------------------------------------------------------------------------------------------- durability, e2e


def durability_cost(records: Path, work: Path, rows: int = 200) -> tuple[float, float, int]:
    """p50/p99 ms of ``RecordStore.append`` (WAL write + fsync) for this run's own rows, in a folder beside them."""
    table = read_records(str(records))
    recs = records_from_table(table.slice(0, rows))
    folder = work / "durability"
    store = RecordStore.open(folder, "durability")
    times = []
    try:
        for i, r in enumerate(recs):
            t0 = time.perf_counter()
            store.append(replace(r, call_id=f"d{i}", run_id="durability"))
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
    return pct(times, 0.5) * 1e3, pct(times, 0.99) * 1e3, len(times)


def real_engine(engine_url: str, work: Path, seed: int) -> dict[str, Any]:
    """A few small sessions (the real engine is slow and shared) through harnessrl, and straight to vLLM's chat."""
    from addon.engine.client import EngineClient

    async def served() -> tuple[str, str]:
        async with EngineClient(engine_url) as e:
            m = (await e.models())[0]
            return m.id, m.root

    name, root = asyncio.run(served())
    scripts = [
        replace(make_script(seed, i, f, calls=3, scale=0.05), max_tokens=16, tools_off=True)
        for i, f in enumerate(FORMATS)
    ]
    direct_scripts = [replace(s, model=name) for s in scripts if s.format == "chat"]
    handles = tree.start_proxies(engine_url, 1, work / "e2e", root)
    try:
        proxied = asyncio.run(replay(Proxied(tuple(handles)), scripts, concurrency=1))
        direct = asyncio.run(replay(Direct(engine_url), direct_scripts, concurrency=1))
    finally:
        handles[0].stop()
    per_format = {f: pct([c.total_s for c in proxied.completed() if c.format == f], 0.5) * 1e3 for f in FORMATS}
    d = pct([c.total_s for c in direct.completed()], 0.5) * 1e3
    return {
        "direct_chat_p50_ms": d,
        "proxied_p50_ms": per_format,
        "chat_ratio": per_format["chat"] / d if d else float("nan"),
        "direct_errors": [c.error for c in direct.calls if not c.complete][:2],
        "proxied_errors": [c.error for c in proxied.calls if not c.complete][:2],
        "verdict": asdict(verify(proxied, [handles[0].records])),
    }


# --------------------------------------------------------------------------------------------------- the page

PEERS = (
    "skyrl-capture (published): 1.9–3.3 ms/call flat 8k–80k, ~75 calls/s per process, "
    "99/96/85/51% of direct at 32/96/192/384 sessions"
)


def fraction_table(levels: list[LevelRow]) -> list[str]:
    direct = {r.sessions: r.calls_per_s for r in levels if r.target == "direct"}
    out = [
        "| target | sessions | calls | errors | calls/s | % of direct | p50 ms | p99 ms | CPU s/call | RSS MiB/session "
        "| load | shards check | commonest errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in levels:
        frac = 100 * r.calls_per_s / direct[r.sessions] if direct.get(r.sessions) else float("nan")
        check = "" if r.verdict_ok is None else ("ok" if r.verdict_ok else "FAILED")
        out.append(
            f"| {r.target} | {r.sessions} | {r.calls} | {r.errors} | {r.calls_per_s:.1f} | {frac:.0f}% | "
            f"{r.p50_ms:.0f} | {r.p99_ms:.0f} | {r.cpu_s_per_call * 1e3:.1f} ms | {r.rss_mib_per_session:.2f} | "
            f"{r.load} | {check} | {r.error_kinds.replace('|', '/')} |"
        )
    return out


def _short(target: str) -> str:
    return "url" if "URL" in target else target.split()[-1]


def page_figures(results: dict[str, Any]) -> dict[str, Figure]:
    """``fraction_of_direct``: calls/s of each proxied target as % of direct, by concurrent sessions;
    ``added_latency``: steady-state added ms per call (p50, p99) by context, through mitmproxy (and the base URL)."""
    levels: list[LevelRow] = results["levels"]
    direct = {r.sessions: r.calls_per_s for r in levels if r.target == "direct"}
    sessions = sorted({r.sessions for r in levels})
    targets = list(dict.fromkeys(r.target for r in levels if r.target != "direct"))
    cps = {(r.target, r.sessions): r.calls_per_s for r in levels}
    fraction = [
        BarSeries(t, tuple(100 * cps[(t, n)] / direct[n] if (t, n) in cps and direct.get(n) else math.nan
                           for n in sessions))
        for t in targets
    ]  # fmt: skip
    rate = f" at {results['token_rate']:g} tokens/s" if results.get("token_rate") else ""
    tokens = f"fake engine, {results['tokens']} tokens per answer{rate}" if "tokens" in results else "fake engine"
    figures = {
        "fraction_of_direct": bar_figure(
            f"Throughput through harnessrl as % of direct-to-engine calls/s\nby concurrent sessions ({tokens})",
            [str(n) for n in sessions],
            fraction,
            ylabel="% of direct calls/s",
            xlabel="concurrent sessions",
            ymax=100,
            value_format="{:.0f}",
        )
    }
    sweeps = [("mitmproxy", results["contexts"])]
    if results.get("contexts_base_url"):
        sweeps.append(("base URL", results["contexts_base_url"]))
    contexts: list[ContextRow] = results["contexts"]
    colors = {("mitmproxy", "p50"): "#4C72B0", ("mitmproxy", "p99"): "#A1B9DE",
              ("base URL", "p50"): "#55A868", ("base URL", "p99"): "#A7D4B1"}  # fmt: skip
    latency = [
        BarSeries(f"{name} {q}", tuple(getattr(c, f"steady_{q}_ms") for c in rows), color=colors[(name, q)])
        for name, rows in sweeps
        for q in ("p50", "p99")
    ]
    figures["added_latency"] = bar_figure(
        "Added latency per call through harnessrl, by context\n"
        "proxied minus direct for the same call, steady-state calls (unpaced fake engine)",
        [f"{c.target_tokens // 1000}k" for c in contexts],
        latency,
        ylabel="added latency per call (ms)",
        xlabel="context (target prompt tokens)",
        value_format="{:.1f}",
    )
    return figures


def write_page(out: Path, cmd: str, facts: Any, results: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "# harnessrl side by side",
        "",
        f"Machine: {facts.markdown()}. Commit {tree.git_rev()}. Load average at start {results['load_start']}, "
        f"at end {tree.loadavg()}. Other jobs shared the machine: read ratios, not absolute numbers.",
        "",
        f"Command: `{cmd}`",
        "",
        f"Fake engine: {results['tokens']} tokens per answer at {results['token_rate'] or 'unpaced'} tokens/s.",
        "",
        "## Added latency per call by context (proxied minus direct, same session and call, 4 formats)",
        "",
        "One call at a time against the unpaced fake engine, interleaved: each session runs straight to the engine, "
        "then through mitmproxy and through the base URL (the order rotating), after one short warm-up session per "
        "format through each (not counted). First call: a session's first request (a full render).",
        "",
        "| context (target tokens) | prompt tokens p50 | steady p50 ms | steady p99 ms | first call p50 ms "
        "| direct p50 ms | calls |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in results["contexts"]:
        lines.append(
            f"| {c.target_tokens} | {c.prompt_tokens_p50} | {c.steady_p50_ms:.1f} | {c.steady_p99_ms:.1f} | "
            f"{c.first_p50_ms:.1f} | {c.direct_p50_ms:.1f} | {c.calls} |"
        )
    if results.get("contexts_base_url"):
        lines += [
            "",
            "Through the base-URL endpoint (`http://127.0.0.1:<port>/s/<session>/v1/...`, no mitmproxy):",
            "",
            "| context (target tokens) | prompt tokens p50 | steady p50 ms | steady p99 ms | first call p50 ms "
            "| direct p50 ms | calls |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in results["contexts_base_url"]:
            lines.append(
                f"| {c.target_tokens} | {c.prompt_tokens_p50} | {c.steady_p50_ms:.1f} | {c.steady_p99_ms:.1f} | "
                f"{c.first_p50_ms:.1f} | {c.direct_p50_ms:.1f} | {c.calls} |"
            )
    lines += ["", "## Throughput by concurrent sessions", "", *fraction_table(results["levels"]), ""]
    d = results["durability"]
    lines += [
        f"Durability cost per call (fsync'd WAL append of this run's rows): p50 {d[0]:.2f} ms, p99 {d[1]:.2f} ms "
        f"over {d[2]} rows.",
        "",
    ]
    for key in ("per_process", "e2e", "openenv"):
        if results.get(key) is not None:
            lines += [f"## {key}", "", "```json", json.dumps(results[key], indent=1, default=str), "```", ""]
    lines += ["## Peers", "", PEERS, ""]
    page = out / "side_by_side.md"
    page.write_text("\n".join(lines))
    for name, fig in page_figures(results).items():
        (out / f"{name}.png").write_bytes(png(fig))
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--seconds", type=float, default=30.0, help="per load level and target")
    ap.add_argument("--levels", type=int, nargs="+", default=[32, 96, 192, 384])
    ap.add_argument("--contexts", type=int, nargs="+", default=[8_000, 32_000, 128_000])
    ap.add_argument("--context-calls", type=int, default=6)
    ap.add_argument("--context-sessions", type=int, default=2, help="per format and context size (chat only: 4x)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--token-rate", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--engine-url", default="", help="a real vLLM engine for the end-to-end replay (optional)")
    ap.add_argument("--openenv-python", default="", help="python of a venv with openenv installed (optional)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--only", choices=["relay", "e2e", "workers"], default=None,
                    help="one stage, to its own page")  # fmt: skip
    args = ap.parse_args(argv)
    cmd = "python benchmarks/side_by_side.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.only:
        return only(args, cmd)
    results: dict[str, Any] = {"load_start": tree.loadavg(), "tokens": args.tokens, "token_rate": args.token_rate}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-") as tmp:
        work = Path(tmp)
        engine = fake_engine.spawn(args.model_dir, launch.free_port(), token_rate=args.token_rate, tokens=args.tokens)
        unpaced = fake_engine.spawn(args.model_dir, launch.free_port(), token_rate=0, tokens=args.tokens)
        try:
            (proxy,) = tree.start_proxies(unpaced.url, 1, work / "ctx", args.model_dir)
            try:
                sweeps = context_sweeps(
                    unpaced.url,
                    {"mitmproxy": Proxied((proxy,)), "base URL": BaseUrl((proxy,))},
                    args.contexts,
                    args.context_calls,
                    args.seed,
                    sessions=args.context_sessions,
                )
                results["contexts"], results["contexts_base_url"] = sweeps["mitmproxy"], sweeps["base URL"]
            finally:
                proxy.stop()
            results["durability"] = durability_cost(proxy.records, work)
            results["levels"] = load_levels(
                engine.url, args.levels, args.procs, args.seconds, args.seed, args.model_dir, work
            )
            results["per_process"] = per_process(results["levels"])
            if args.openenv_python:
                from benchmarks import openenv_peer

                results["openenv"] = openenv_peer.compare(args.openenv_python, engine.url, unpaced.url, args, work)
        finally:
            engine.stop()
            unpaced.stop()
        if args.engine_url:
            results["e2e"] = real_engine(args.engine_url, work, args.seed)
    page = write_page(args.out, cmd, tree.machine_facts(), results)
    print(page.read_text())
    return 0


def only(args: argparse.Namespace, cmd: str) -> int:
    """``--only relay``: added latency by context through mitmproxy and straight to the same proxy's internal
    server (mitmproxy's share of the cost); ``--only e2e``: the real-engine replay; ``--only workers``: the load
    levels alone (direct, one mitmdump, ``--procs`` mitmdumps, one mitmdump with ``--procs`` generation workers, the
    base URL), with their table. Each writes its own page."""
    out: dict[str, Any] = {"load_start": tree.loadavg()}
    table: list[str] = []
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-") as tmp:
        work = Path(tmp)
        if args.only == "workers":
            engine = fake_engine.spawn(
                args.model_dir, launch.free_port(), token_rate=args.token_rate, tokens=args.tokens
            )
            try:
                levels = load_levels(engine.url, args.levels, args.procs, args.seconds, args.seed, args.model_dir, work)
            finally:
                engine.stop()
            table = ["## Load levels", "", *fraction_table(levels), ""]
            out["levels"] = [asdict(r) for r in levels]
        elif args.only == "e2e":
            out["e2e"] = real_engine(args.engine_url, work, args.seed)
        else:
            unpaced = fake_engine.spawn(args.model_dir, launch.free_port(), token_rate=0, tokens=args.tokens)
            try:
                (proxy,) = tree.start_proxies(unpaced.url, 1, work / "relay", args.model_dir)
                try:
                    sweeps = context_sweeps(
                        unpaced.url,
                        {"through mitmproxy": Proxied((proxy,)), "internal server": Internal(proxy)},
                        args.contexts,
                        args.context_calls,
                        args.seed,
                        sessions=args.context_sessions,
                    )
                    out |= {name: [asdict(r) for r in rows] for name, rows in sweeps.items()}
                finally:
                    proxy.stop()
            finally:
                unpaced.stop()
    out["load_end"] = tree.loadavg()
    text = json.dumps(out, indent=1, default=str)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.only}.md").write_text(
        f"# {args.only}\n\nMachine: {tree.machine_facts().markdown()}. Commit {tree.git_rev()}.\n\n"
        f"Command: `{cmd}`\n\n" + "\n".join(table) + f"\n```json\n{text}\n```\n"
    )
    print(text)
    return 0


def per_process(levels: list[LevelRow]) -> dict[str, float]:
    one = [r for r in levels if r.target == "harnessrl x1"]
    best = max(one, key=lambda r: r.calls_per_s)
    cpu = statistics.median(r.cpu_s_per_call for r in one)
    return {
        "measured_calls_per_s_one_process_max": round(best.calls_per_s, 1),
        "at_sessions": best.sessions,
        "cpu_ms_per_call_median": round(cpu * 1e3, 2),
        "calls_per_s_per_busy_core": round(1 / cpu, 1) if cpu else float("nan"),
    }


if __name__ == "__main__":
    sys.exit(main())

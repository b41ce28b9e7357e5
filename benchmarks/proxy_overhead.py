"""Proxy overhead per call: the same requests sent directly to the engine and through mitmdump + the capture addon,
interleaved in one run, at 1 and 32 concurrent sessions.

Direct: the engine's /v1/completions with the token ids the proxy would render (same renderer, same seed, same
max_tokens). Proxied: an OpenAI Chat Completions call to https://api.openai.com through HTTPS_PROXY. The figure
that matters is the difference of the two latencies for the same work, reported as p50/p99 and as a ratio.

Usage (proxy env): python benchmarks/proxy_overhead.py --engine-url http://127.0.0.1:8000 [--calls 40] [--tokens 16]
The engine must serve the default model (``make serve``). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.engine.client import EngineClient, GenerationRequest  # noqa: E402
from addon.generation.render import PromptRenderer  # noqa: E402
from converters import dialect_for  # noqa: E402
from converters.base import Route  # noqa: E402

SEED = 1234


def body(i: int, tokens: int) -> dict:
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": f"Request {i}: name a colour."}],
        "max_tokens": tokens,
        "seed": SEED,
        "temperature": 1.0,
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def one_pair(i: int, tokens: int, renderer, engine: EngineClient, http: httpx.AsyncClient) -> tuple[float, float]:
    req = dialect_for("chat").parse_request(body(i, tokens), Route("chat", "/v1/chat/completions"))
    ids = renderer.render(req).prompt_ids
    t0 = time.perf_counter()
    await engine.generate(GenerationRequest(prompt_ids=tuple(ids), max_tokens=tokens, seed=SEED))
    direct = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = await http.post("https://api.openai.com/v1/chat/completions", json=body(i, tokens))
    proxied = time.perf_counter() - t0
    r.raise_for_status()
    return direct, proxied


async def run(handle, engine_url: str, sessions: int, calls: int, tokens: int, renderer) -> dict:
    per_session = max(1, calls // sessions)
    pairs: list[tuple[float, float]] = []

    async def session(s: int) -> None:
        async with httpx.AsyncClient(
            proxy=handle.url(f"bench-{sessions}-{s}"), verify=handle.ssl_context(), timeout=600
        ) as http:
            async with EngineClient(engine_url) as engine:
                for k in range(per_session):
                    pairs.append(await one_pair(s * 1000 + k, tokens, renderer, engine, http))

    t0 = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(sessions)))
    wall = time.perf_counter() - t0
    direct = [d for d, _ in pairs]
    proxied = [p for _, p in pairs]
    added = [p - d for d, p in pairs]
    return {
        "sessions": sessions,
        "calls": len(pairs),
        "direct_p50_ms": pct(direct, 0.5) * 1e3,
        "proxied_p50_ms": pct(proxied, 0.5) * 1e3,
        "added_p50_ms": pct(added, 0.5) * 1e3,
        "added_p99_ms": pct(added, 0.99) * 1e3,
        "ratio_p50": statistics.median(proxied) / max(1e-9, statistics.median(direct)),
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-url", required=True)
    ap.add_argument("--calls", type=int, default=40, help="calls per concurrency level (each sent twice)")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 32])
    args = ap.parse_args()

    async def model_dir() -> str:
        async with EngineClient(args.engine_url) as engine:
            return (await engine.models())[0].root

    renderer = PromptRenderer.from_pretrained(asyncio.run(model_dir()))
    with tempfile.TemporaryDirectory() as tmp:
        handle = launch.start(launch.ProxyConfig(args.engine_url, Path(tmp), options=(f"harnessrl_seed={SEED}",)))
        try:
            rows = [
                asyncio.run(run(handle, args.engine_url, n, args.calls, args.tokens, renderer)) for n in args.sessions
            ]
            stats = handle.admin("GET", "stats")
        finally:
            handle.stop()
    print(
        f"# proxy overhead ({platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, {args.tokens} tok/call)\n"
    )
    print("| sessions | calls | direct p50 ms | proxied p50 ms | added p50 ms | added p99 ms | proxied/direct p50 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['sessions']} | {r['calls']} | {r['direct_p50_ms']:.1f} | {r['proxied_p50_ms']:.1f} | "
            f"{r['added_p50_ms']:.1f} | {r['added_p99_ms']:.1f} | {r['ratio_p50']:.2f} |"
        )
    o = stats["overhead_ms"]
    print(
        f"\nproxy's own accounting: p50 {o['p50']} ms, p99 {o['p99']} ms "
        f"(before engine p50 {o['before_engine_p50']} ms, after engine p50 {o['after_engine_p50']} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

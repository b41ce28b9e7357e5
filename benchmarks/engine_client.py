"""The engine client's cost per streamed call: httpx against aiohttp, and :class:`~addon.engine.client.EngineClient`.

One process, one connection, calls one after another against the FAKE engine (``benchmarks/fake_engine.py``, every
token at once), so the figure is the client's own CPU per call (``getrusage`` of this process) plus the round trip.
Each round measures every client in turn on the same prompt; ratios between clients in one round are what to read.
This is why ``EngineClient.stream`` uses aiohttp (the control requests stay on httpx). ``EngineClient.stream``
formats the prompt's JSON list per call; "prompt JSON ready" is how the proxy calls it (the list made beforehand,
off the event loop, from the session's previous prompt).

Usage (proxy env, from the repository root)::

    PYTHONPATH=. python benchmarks/engine_client.py --model-dir D [--prompts 8000 131000] [--calls 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.engine.client import EngineClient, GenerationRequest  # noqa: E402
from addon.records.token_ids import FrozenIds, JsonIds  # noqa: E402
from benchmarks import fake_engine  # noqa: E402

HEADERS = {"content-type": "application/json"}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _httpx(url: str, body: bytes, n: int) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(n):
            async with client.stream("POST", "/v1/completions", content=body, headers=HEADERS) as resp:
                async for _part in resp.aiter_bytes():
                    pass


async def _aiohttp(url: str, body: bytes, n: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            async with session.post(url + "/v1/completions", data=body, headers=HEADERS) as resp:
                async for _part in resp.content.iter_any():
                    pass


async def _engine_client(url: str, req: GenerationRequest, n: int) -> None:
    async with EngineClient(url) as client:
        for _ in range(n):
            async for _chunk in client.stream(req):
                pass


async def _engine_client_ready(url: str, ids: JsonIds, max_tokens: int, n: int) -> None:
    """As the generator calls it: the prompt's ids packed and their JSON made beforehand (its planning thread does
    both, from the session's previous prompt), the request built per call on the loop."""
    async with EngineClient(url) as client:
        for _ in range(n):
            req = GenerationRequest(prompt_ids=FrozenIds.adopt(ids.ids), max_tokens=max_tokens, prompt_json=ids)
            async for _chunk in client.stream(req):
                pass


def measure(run: Callable[[int], Awaitable[None]], calls: int) -> tuple[float, float]:
    """Wall and CPU ms per call of ``calls`` calls (after 5 warm-up calls)."""
    asyncio.run(run(5))
    wall, cpu = time.perf_counter(), _cpu()
    asyncio.run(run(calls))
    return (time.perf_counter() - wall) / calls * 1e3, (_cpu() - cpu) / calls * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--prompts", type=int, nargs="+", default=[8_000, 131_000], help="prompt lengths in tokens")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    args = ap.parse_args(argv)
    engine = fake_engine.spawn(
        str(Path(args.model_dir).resolve()), launch.free_port(), token_rate=0.0, tokens=args.tokens
    )
    print("| prompt tokens | round | client | wall ms/call | CPU ms/call |\n|---|---|---|---|---|")
    try:
        for n in args.prompts:
            req = GenerationRequest(prompt_ids=tuple(range(100, 100 + n)), max_tokens=args.tokens)
            ready = JsonIds.of(req.prompt_ids)
            payload = {"model": "m", "prompt": list(req.prompt_ids), "max_tokens": args.tokens, "stream": True}
            body = json.dumps(payload | {"logprobs": 0, "return_token_ids": True}).encode()
            for r in range(args.rounds):
                clients: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
                    ("httpx stream", lambda k, b=body: _httpx(engine.url, b, k)),
                    ("aiohttp stream", lambda k, b=body: _aiohttp(engine.url, b, k)),
                    ("EngineClient.stream", lambda k, q=req: _engine_client(engine.url, q, k)),
                    (
                        "EngineClient.stream, prompt JSON ready",
                        lambda k, j=ready: _engine_client_ready(engine.url, j, args.tokens, k),
                    ),
                ]
                for name, run in clients:
                    wall, cpu = measure(run, args.calls)
                    print(f"| {n} | {r + 1} | {name} | {wall:.2f} | {cpu:.2f} |", flush=True)
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

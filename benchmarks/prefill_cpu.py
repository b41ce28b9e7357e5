"""Prefill time of the engine per prompt size, cold and prefix-cached, measured side by side in one run.

For each size N it sends token-id prompts to ``/v1/completions`` with ``max_tokens=1`` (so the time is prefill plus
one decode step) and times three requests:

* **cold**: a prompt of N fresh ids after ``/reset_prefix_cache`` (the engine's dev mode, on in ``trainer.engine``);
* **extend**: that prompt plus ``--extend`` new ids: a harness's next call, whose prompt extends the previous one;
* **sibling**: the same first N - ``--tail`` ids with a different tail of ``--tail`` ids: another rollout of the
  same group (same system prompt and tools, different task text).

The engine's own counters (``vllm:prefix_cache_hits_total`` / ``..._queries_total`` on ``/metrics``) give the share
of prompt tokens each request found cached. Prompts are random token ids: prefill cost does not depend on the text.

Run from either env against a running engine (``make serve``, or ``python -m trainer.engine serve``)::

    .venvs/proxy/bin/python benchmarks/prefill_cpu.py --engine-url http://127.0.0.1:8000 [--sizes 2048,8192,...]

It prints a Markdown table; it is a benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from dataclasses import dataclass

import httpx

VOCAB_LOW, VOCAB_HIGH = 100, 49000  # plain ids of SmolLM2's 49,152 (the first ones are special tokens)
METRIC = re.compile(r"^vllm:prefix_cache_(hits|queries)_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


@dataclass(frozen=True)
class Timed:
    seconds: float
    prompt_tokens: int
    cached_tokens: float  # from the engine's counters; NaN when it exports none


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


def counters(client: httpx.Client) -> tuple[float, float]:
    """(hits, queries) summed over the engine's prefix-cache counters; NaNs when /metrics has none."""
    found = {"hits": 0.0, "queries": 0.0}
    seen = False
    for kind, value in METRIC.findall(client.get("/metrics").text):
        found[kind] += float(value)
        seen = True
    nan = float("nan")
    return (found["hits"], found["queries"]) if seen else (nan, nan)


def complete(client: httpx.Client, model: str, prompt: list[int]) -> Timed:
    hits0, _ = counters(client)
    t0 = time.monotonic()
    r = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    seconds = time.monotonic() - t0
    r.raise_for_status()
    hits1, _ = counters(client)
    return Timed(seconds, len(prompt), hits1 - hits0)


def reset_cache(client: httpx.Client) -> None:
    r = client.post("/reset_prefix_cache")
    if r.status_code != 200:
        sys.exit(f"/reset_prefix_cache answered {r.status_code}: start the engine with VLLM_SERVER_DEV_MODE=1")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-url", default="http://127.0.0.1:8000")
    ap.add_argument("--sizes", default="2048,8192,16384,24576", help="prompt sizes in tokens, comma-separated")
    ap.add_argument("--extend", type=int, default=256, help="ids a harness's next call adds")
    ap.add_argument("--tail", type=int, default=512, help="ids in which two rollouts of a group differ")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per request, seconds")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) <= args.tail:
        sys.exit(f"every size must be larger than --tail ({args.tail}), got {sizes}")
    with httpx.Client(base_url=args.engine_url.rstrip("/"), timeout=args.timeout) as client:
        served = client.get("/v1/models").json()["data"][0]
        model, max_len = served["id"], served.get("max_model_len")
        if max_len and max(sizes) + args.extend >= max_len:
            sys.exit(f"the engine's context is {max_len} tokens; drop sizes above {max_len - args.extend - 1}")
        print(f"engine {args.engine_url}, model {model}, context {max_len}", file=sys.stderr)
        complete(client, model, ids(random.Random(-1), 64))  # warm-up: first-request costs are not prefill
        rows = []
        for n in sizes:
            rng = random.Random(n)
            prompt = ids(rng, n)
            reset_cache(client)
            cold = complete(client, model, prompt)
            extend = complete(client, model, prompt + ids(rng, args.extend))
            sibling = complete(client, model, prompt[: n - args.tail] + ids(rng, args.tail))
            rows.append((n, cold, extend, sibling))
            print(f"  {n} tokens: cold {cold.seconds:.1f} s, extend {extend.seconds:.2f} s, "
                  f"sibling {sibling.seconds:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    print(f"| prompt tokens | cold s | cold tok/s | next call (+{args.extend}) s | cached | cold / next | "
          f"sibling (new {args.tail}-token tail) s | cached | cold / sibling |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, cold, extend, sibling in rows:
        print(
            f"| {n} | {cold.seconds:.1f} | {n / cold.seconds:.0f} | {extend.seconds:.2f} | "
            f"{extend.cached_tokens / extend.prompt_tokens:.0%} | {cold.seconds / extend.seconds:.0f}x | "
            f"{sibling.seconds:.2f} | {sibling.cached_tokens / sibling.prompt_tokens:.0%} | "
            f"{cold.seconds / sibling.seconds:.0f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What mitmproxy's hook dispatch costs per flow hook: mitmdump's whole default chain against the chain the capture
script leaves (its idle addons dropped, ``addon/serving/lean_chain.py``).

One process, no network: a real ``DumpMaster`` (mitmdump's 35 default addons, ``flow_detail=0`` as
``addon.launch`` runs it) dispatches the four hooks of an HTTP flow (request headers, request, response headers,
response; each followed by mitmproxy's ``update``) through ``AddonManager.handle_lifecycle``, as the proxy does for
every call; then the same master after :func:`addon.capture.drop_idle_addons`. Rounds alternate the two chains;
read the ratio of one round.

Usage (proxy env, from the repository root)::

    python benchmarks/addon_chain.py [--flows 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mitmproxy.options import Options  # noqa: E402
from mitmproxy.proxy.layers.http import (  # noqa: E402
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow  # noqa: E402
from mitmproxy.tools.dump import DumpMaster  # noqa: E402

from addon.capture import drop_idle_addons  # noqa: E402

HOOKS = (HttpRequestHeadersHook, HttpRequestHook, HttpResponseHeadersHook, HttpResponseHook)


async def _per_flow_us(master: DumpMaster, flows: int) -> float:
    """Microseconds of dispatch for one flow's four hooks (after a warm-up)."""
    flow = tflow.tflow(resp=True)
    events = [hook(flow) for hook in HOOKS]
    for _ in range(50):
        for event in events:
            await master.addons.handle_lifecycle(event)
    t0 = time.perf_counter()
    for _ in range(flows):
        for event in events:
            await master.addons.handle_lifecycle(event)
    return (time.perf_counter() - t0) / flows * 1e6


async def run(flows: int, rounds: int) -> list[tuple[int, int, float, int, float]]:
    logging.getLogger("harnessrl.capture").setLevel(logging.WARNING)
    whole = DumpMaster(Options(), with_termlog=False)
    lean = DumpMaster(Options(), with_termlog=False)
    for master in (whole, lean):
        master.options.update(flow_detail=0)
    drop_idle_addons(lean.addons, lean.options)
    rows = []
    for r in range(rounds):
        a = await _per_flow_us(whole, flows)
        b = await _per_flow_us(lean, flows)
        rows.append((r + 1, len(whole.addons.chain), a, len(lean.addons.chain), b))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flows", type=int, default=2000, help="flows dispatched per chain and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    print("| round | whole chain: addons | us per flow (4 hooks) | lean chain: addons | us per flow | lean / whole |")
    print("|---|---|---|---|---|---|")
    for r, n_whole, whole, n_lean, lean in asyncio.run(run(args.flows, args.rounds)):
        print(f"| {r} | {n_whole} | {whole:.0f} | {n_lean} | {lean:.0f} | {lean / whole:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""mitmproxy's own floor: what a bare mitmdump adds to a call when it relays it to a local server, no harnessrl.

The same seeded sessions as ``side_by_side.py``'s context sweep (4 formats), straight to the FAKE engine's vendor
routes (direct), then through a ``mitmdump`` over TLS via ``HTTPS_PROXY`` whose only addon
(``benchmarks/addons/relay.py``) retargets every request to those same routes and streams the answer back: TLS,
HTTP parsing, one plain-HTTP hop and the relay of each chunk, which every call through harnessrl's mitmproxy path
pays too. Added = relayed - direct, same call; the rest of harnessrl's added latency is its own work.

Usage (proxy env, from the repository root)::

    PYTHONPATH=. python benchmarks/mitm_floor.py --model-dir D [--contexts 8000 32000 128000] [--calls 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.launch import MITMDUMP, ProxyHandle  # noqa: E402
from benchmarks import fake_engine  # noqa: E402
from benchmarks import tree as facts  # noqa: E402
from benchmarks.context_sweep import CHARS_PER_TOKEN, _paired, pct  # noqa: E402
from benchmarks.replayer import Direct, Proxied, replay  # noqa: E402
from benchmarks.sessions import FORMATS, context_script  # noqa: E402

RELAY = ROOT / "benchmarks" / "addons" / "relay.py"


def start_relay(engine_port: int, workdir: Path, timeout: float = 60.0) -> ProxyHandle:
    """A mitmdump whose only addon sends every request to the fake engine on ``engine_port``."""
    port, conf = launch.free_port(), workdir / "mitm"
    cmd = [str(MITMDUMP), "--mode", "regular", "--listen-host", "127.0.0.1", "--listen-port", str(port), "-q"]
    cmd += ["--set", f"confdir={conf}", "--set", "connection_strategy=lazy", "--set", "upstream_cert=false"]
    cmd += ["--set", "proxyauth=any", "-s", str(RELAY)]
    env = os.environ | {"RELAY_ENGINE_PORT": str(engine_port)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    handle = ProxyHandle(proc, port, 0, conf, workdir / "records", workdir / "log")
    deadline = time.monotonic() + timeout
    while not handle.ca.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            handle.stop()
            raise RuntimeError(f"the relay mitmdump did not start (exit {proc.poll()})")
        time.sleep(0.2)
    time.sleep(1.0)  # the CA file appears before the listener
    return handle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8_000, 32_000, 128_000])
    ap.add_argument("--calls", type=int, default=6, help="calls per session (the first is not steady state)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# mitmproxy's floor\n\nMachine: {facts.machine_facts().markdown()}. Load at start {facts.loadavg()}.\n")
    print("| context | round | added p50 ms | added p99 ms | direct p50 ms | calls |\n|---|---|---|---|---|---|")
    engine_port = launch.free_port()
    engine = fake_engine.spawn(str(Path(args.model_dir).resolve()), engine_port, token_rate=0.0, tokens=64)
    try:
        with tempfile.TemporaryDirectory(prefix="harnessrl-floor-") as tmp:
            relay = start_relay(engine_port, Path(tmp))
            try:
                for k, tokens in enumerate(args.contexts):
                    chars = int(tokens * CHARS_PER_TOKEN)
                    scripts = [context_script(args.seed, k, f, chars, args.calls) for f in FORMATS]
                    for r in range(args.rounds):
                        direct = asyncio.run(replay(Direct(engine.url), scripts, concurrency=1))
                        relayed = asyncio.run(replay(Proxied((relay,)), scripts, concurrency=1))
                        steady, _, d = _paired(direct, relayed)
                        print(
                            f"| {tokens} | {r + 1} | {pct(steady, 0.5) * 1e3:.1f} | {pct(steady, 0.99) * 1e3:.1f} "
                            f"| {pct(d, 0.5) * 1e3:.1f} | {len(steady)} |",
                            flush=True,
                        )
            finally:
                relay.stop()
    finally:
        engine.stop()
    print(f"\nLoad at end {facts.loadavg()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

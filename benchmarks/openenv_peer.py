"""OpenEnv's capture server (PyPI ``openenv``, ``openenv.core.harness.capture``) side by side with harnessrl, on
the traffic it can take: its chat-completions path, with the session as the API key.

Why only chat: it forwards every format to an OpenAI chat-completions upstream with ``return_token_ids`` (vLLM's
chat route), never to the token-ids completions API, so the fake engine answers that route too
(:mod:`benchmarks.fake_engine`); it keeps captures in memory (no durable log), so there is no shard check for it.

:func:`compare` runs, chat sessions only: added latency at each context (OpenEnv vs harnessrl, both against the
same direct baseline) and calls/s, p50, CPU and RSS at each load level, direct / harnessrl x1 / OpenEnv. OpenEnv runs
from its own venv (``--openenv-python``; ``make bench`` builds ``.venvs/openenv``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from addon import launch
from benchmarks import tree
from benchmarks.context_sweep import context_sweeps
from benchmarks.fake_engine import SERVED
from benchmarks.replayer import BaseUrl, Direct, Proxied
from benchmarks.side_by_side import run_level

ROOT = Path(__file__).resolve().parent.parent


def start(python: str, engine_url: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = launch.free_port()
    cmd = [python, "-m", "openenv.core.harness.capture.server", "--llm-url", f"{engine_url}/v1", "--model", SERVED]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--allow-unregistered", "--capture-level", "tokens"]
    out = log.open("ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"openenv capture server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise TimeoutError(f"openenv capture server not ready:\n{log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def compare(python: str, paced_url: str, unpaced_url: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"formats": "chat only", "contexts": [], "levels": []}
    proc, url = start(python, unpaced_url, work / "openenv-ctx.log")
    (proxy,) = tree.start_proxies(unpaced_url, 1, work / "openenv-ctx-harnessrl", args.model_dir)
    try:
        # interleaved (each session straight to the engine, then through the three in a rotating order), four chat
        # sessions per four-format one: as many calls as the four-format rows
        sweeps = context_sweeps(
            unpaced_url,
            {"openenv": Direct(url), "harnessrl x1": Proxied((proxy,)), "harnessrl base URL x1": BaseUrl((proxy,))},
            args.contexts,
            args.context_calls,
            args.seed,
            ("chat",),
            4 * args.context_sessions,
        )
        out["contexts"] = [{"target": name} | asdict(r) for name, rows in sweeps.items() for r in rows]
    finally:
        proxy.stop()
        stop(proc)
    for n in args.levels:
        row, _ = run_level("direct", Direct(paced_url), n, args.seconds, args.seed, ("chat",))
        out["levels"].append(asdict(row))
        proc, url = start(python, paced_url, work / f"openenv-{n}.log")
        try:
            row, log = run_level("openenv", Direct(url), n, args.seconds, args.seed, ("chat",), (proc.pid,))
            out["levels"].append(asdict(row) | {"first_error": next((c.error for c in log.calls if c.error), None)})
        finally:
            stop(proc)
        for name, kind in (("harnessrl x1", Proxied), ("harnessrl base URL x1", BaseUrl)):
            (proxy,) = tree.start_proxies(paced_url, 1, work / f"openenv-{n}-{kind.__name__}", args.model_dir)
            try:
                row, _ = run_level(name, kind((proxy,)), n, args.seconds, args.seed, ("chat",))
                out["levels"].append(asdict(row))
            finally:
                proxy.stop()
    return out

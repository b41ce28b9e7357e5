"""One generation worker of a multi-process proxy: ``python -m addon.serving.worker`` (started by
:class:`addon.serving.workers.WorkerPool`, never by hand).

Contract
--------
Arguments: ``--index K`` (>= 1), ``--run-id`` (worker 0's, so every record of the proxy carries one run id),
``--records-dir`` (this worker's own folder) and ``--options`` (a JSON object of the proxy's ``harnessrl_*`` option
values, parsed by the same :meth:`CaptureConfig.from_options` as in mitmproxy). It starts a
:class:`~addon.serving.runtime.Runtime` with its internal server on a free loopback port and without the base-URL
routes (the proxy's base URL is worker 0's), prints ``harnessrl-worker-port <port>`` on stdout, and serves until
SIGTERM/SIGINT or until its parent exits; then it stops the runtime (in-flight calls finish or are recorded as
incomplete, the store closes) and exits 0. A start-up failure logs the reason and exits 1. Logs go to stderr,
prefixed with the worker's index.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from addon.serving.config import OPTIONS, CaptureConfig
from addon.serving.runtime import Runtime
from addon.serving.workers import READY_PREFIX

log = logging.getLogger("harnessrl.worker")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--records-dir", type=Path, required=True)
    p.add_argument("--options", required=True, help="JSON object of harnessrl_* option values")
    ns = p.parse_args(argv)
    if ns.index < 1:
        p.error("--index must be >= 1 (worker 0 is the mitmproxy process)")
    return ns


def worker_config(options_json: str, run_id: str, records_dir: Path) -> CaptureConfig:
    """The proxy's configuration as this worker runs it: its own records folder and port, no base-URL routes and no
    TLS relay server (only the mitmproxy process relays: a worker's sessions come over the hop)."""
    values = {name: default for name, _, default, _ in OPTIONS} | json.loads(options_json)
    config = CaptureConfig.from_options(SimpleNamespace(**values))
    return dataclasses.replace(
        config, records_dir=records_dir, run_id=run_id, server_port=0, base_url=False, relay=False, workers=1
    )


def parent_gone(parent: int) -> bool:
    """Whether the process that started this worker is gone (re-parented to init or a subreaper)."""
    return os.getppid() != parent


async def serve(config: CaptureConfig, index: int) -> int:
    parent = os.getppid()
    try:
        runtime = await Runtime.start(config)
    except Exception as e:  # the pool reports the exit; the reason goes to the shared log
        log.error("harnessrl: worker %d cannot start: %s", index, e, exc_info=not isinstance(e, OSError | ValueError))
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"{READY_PREFIX}{runtime.port}", flush=True)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            if parent_gone(parent):
                log.warning("harnessrl: worker %d: the proxy is gone; stopping", index)
                break
    await runtime.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"[worker {ns.index}] %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = worker_config(ns.options, ns.run_id, ns.records_dir)
    except (ValueError, TypeError) as e:
        log.error("harnessrl: worker %d: bad options: %s", ns.index, e)
        return 2
    return asyncio.run(serve(config, ns.index))


if __name__ == "__main__":
    sys.exit(main())

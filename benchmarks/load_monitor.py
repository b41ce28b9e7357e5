"""A server's own view of its load, for the fake engine and the soak: how late its event loop wakes, the accept
queue of its listening socket and the kernel's listen-overflow counter, read from ``/proc`` (Linux), so a starved
engine can be told from a proxy fault. Sans-proxy: no harnessrl import."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web

LISTEN_BACKLOG = 4096  # vLLM's uvicorn listens with 2048; Linux's default somaxconn (4096) caps it


class LoadMonitor:
    """The engine's own view of its load, sampled on its event loop every ``every`` s: how late the loop wakes
    (a starved process), the longest accept queue on its listening socket, and the kernel's ListenOverflows
    counter (system wide: other processes' overflows count too) since the monitor started."""

    def __init__(self, port: int, every: float = 0.5) -> None:
        self.port, self.every = port, every
        self.loop_lag_max_s = 0.0
        self.accept_queue_max = 0
        self._overflows_at_start = listen_overflows()
        self._task: asyncio.Task | None = None

    async def start(self, _: web.Application) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, _: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.every)
            self.loop_lag_max_s = max(self.loop_lag_max_s, time.monotonic() - t0 - self.every)
            self.accept_queue_max = max(self.accept_queue_max, accept_queue(self.port))

    def snapshot(self) -> dict[str, Any]:
        return {
            "backlog": LISTEN_BACKLOG,
            "loop_lag_max_s": round(self.loop_lag_max_s, 3),
            "accept_queue_max": self.accept_queue_max,
            "listen_overflows_system": listen_overflows() - self._overflows_at_start,
        }


def accept_queue(port: int) -> int:
    """Connections waiting in the accept queue of the IPv4 socket listening on ``port`` (0 when unknown)."""
    want = f":{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1].endswith(want) and fields[3] == "0A":  # local address, state LISTEN
                    return int(fields[4].split(":")[1], 16)  # rx_queue of a listener: its accept queue
    except OSError:
        pass
    return 0


def listen_overflows() -> int:
    """The kernel's TcpExt ListenOverflows: connects dropped because an accept queue was full (0 when unknown)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return 0
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", 0))
    return 0

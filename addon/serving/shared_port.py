"""Several mitmdump processes behind one ``HTTPS_PROXY`` port (``harnessrl_shared_port``, ``harnessrl_peer_ports``).

Contract
--------
``python -m addon.launch --procs N`` (or :func:`addon.launch.start_shared`) starts N whole proxies (mitmproxy,
capture addon, generator, record store), each with its own internal port; every one of them also listens on the
one public port with ``SO_REUSEPORT`` (:func:`listen_shared`), so the kernel spreads the harnesses' connections over
the processes and one proxy uses every core for TLS and HTTP as well as for generation.

Sessions stay whole: a tunnel whose proxy credentials name a session another process owns is handed to that
process before TLS (``harnessrl_handover``, addon/serving/handover.py); any call that still lands elsewhere is sent
by the process that accepted it to the session's owner, ``worker_of(session, N)`` over the list of internal ports
(:class:`StaticPeers`), in process when it owns it, else over loopback to the owner's internal server. So a
session's prefix graph, call counter and records live in one process, and attribution is exact whichever process
the harness's connection landed on. Each process writes its own records folder (``<records>/worker-<k>`` for k > 0:
readers search folders recursively) and fsyncs before the last byte of a call reaches the client, as with one
process.

Admin: any process's admin port answers for all (it fans out to the others with ``x-harnessrl-local: 1``, which
makes the receiver answer for itself only: no fan-out loops); closing a session goes to its owner.

Failure: a peer whose internal port stops accepting connections is marked down within ``probe_every`` seconds; its
sessions then get the vendor's retryable 503 until it listens again (restart it on the same ports:
:func:`addon.launch.start_shared` keeps them in its handles). The kernel stops handing a dead process new
connections by itself.

Why ``SO_REUSEPORT`` through our own listener: mitmproxy binds its listen port without it and has no option for it;
so each process's mitmproxy listens on a private port and the capture addon opens the shared one (here with
:func:`listen_shared` when tunnels are not handed over; else handover.RoutingListener), handing every accepted
connection to mitmproxy's own server for that mode (``ServerInstance.handle_stream``, what mitmproxy's
listener calls), so TLS, proxy authentication and every hook work as on mitmproxy's port.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from addon.serving.aio import spawn
from addon.serving.workers import ask_admin, worker_of

log = logging.getLogger("harnessrl.shared_port")

LISTEN_BACKLOG = 4096
PROBE_EVERY_S = 1.0
PROBE_DOWN_EVERY_S = 0.2  # while a peer is down (or not up yet): its sessions wait for this to see it back

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def listen_shared(handler: StreamHandler, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` with ``SO_REUSEPORT`` (every process of the proxy binds it the same way)."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("harnessrl_shared_port needs SO_REUSEPORT (Linux, macOS, the BSDs); this platform has none")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except asyncio.CancelledError:  # the proxy shuts down: end quietly (Python 3.12.1's start_server callback
            writer.close()  # logs a traceback for every connection task that ends cancelled)

    try:
        return await asyncio.start_server(serve, host or None, port, reuse_port=True, backlog=LISTEN_BACKLOG)
    except OSError as e:  # another program holds the port without SO_REUSEPORT, or another user's process
        raise OSError(f"cannot listen on the shared port {host or '*'}:{port}: {e}") from e


class StaticPeers:
    """The other processes of a shared-port proxy, by their fixed internal ports (the admin fan-out and routing of
    :class:`~addon.serving.workers.WorkerPool`, for processes this one did not start).

    Indices are relative to this process: ``owner(session)`` is 0 for its own sessions, ``k`` for the process
    ``k`` places after it in ``ports``; ``port_of(k)`` is that process's port, ``None`` while it does not listen."""

    def __init__(self, ports: Sequence[int], own_port: int, probe_every: float = PROBE_EVERY_S) -> None:
        if own_port not in ports:
            raise ValueError(f"harnessrl_peer_ports {list(ports)} must include this process's harnessrl_server_port")
        self.ports = tuple(ports)
        self.index = self.ports.index(own_port)
        self.workers = len(self.ports)
        self.probe_every = probe_every
        self._up = [True] * self.workers  # optimistic until the first probe: the peers start alongside
        self._seen = [False] * self.workers  # answered a probe once (a peer still starting is not "down")
        self._probe: asyncio.Task | None = None
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=5.0), trust_env=False)

    def _absolute(self, relative: int) -> int:
        return (self.index + relative) % self.workers

    def owner(self, session: str) -> int:
        return (worker_of(session, self.workers) - self.index) % self.workers

    def port_of(self, index: int) -> int | None:
        k = self._absolute(index)
        return self.ports[k] if self._up[k] else None

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"worker": k, "port": port, "up": self._up[k], "this": k == self.index} for k, port in enumerate(self.ports)
        ]

    async def start(self) -> None:
        self._probe = spawn(self._watch(), "harnessrl-peer-probe")

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        await self._client.aclose()

    async def _watch(self) -> None:
        while True:
            for k, port in enumerate(self.ports):
                if k == self.index:
                    continue
                up = await _accepts(port)
                if up != self._up[k] and self._seen[k]:
                    log.warning("harnessrl: peer %d (port %d) is %s", k, port, "up again" if up else "down")
                self._up[k], self._seen[k] = up, self._seen[k] or up
            await asyncio.sleep(self.probe_every if all(self._up) else min(self.probe_every, PROBE_DOWN_EVERY_S))

    async def admin(self, method: str, path: str, body: Any = None, index: int | None = None) -> list[dict]:
        """``/_harnessrl/admin/<path>`` on peer ``index`` (relative; default: every other process), answered by it
        alone; a peer that cannot answer contributes ``{"worker": k, "error": ...}``."""
        targets = range(1, self.workers) if index is None else [index]
        absolute = [self._absolute(i) for i in targets]
        return list(
            await asyncio.gather(*(ask_admin(self._client, k, self.ports[k], method, path, body) for k in absolute))
        )


def parse_ports(text: str) -> tuple[int, ...]:
    """``"8101,8102"`` -> ``(8101, 8102)``; ``ValueError`` naming what is wrong."""
    ports = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise ValueError(f"harnessrl_peer_ports: {part!r} is not a port number")
        ports.append(int(part))
    return tuple(ports)


async def _accepts(port: int, timeout: float = 2.0) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True

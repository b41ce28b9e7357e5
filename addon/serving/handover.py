"""Shared-port tunnels handed to the process that owns their session, before anything past their CONNECT is read.

Contract
--------
With ``harnessrl_shared_port`` and ``harnessrl_handover`` (on by default; Linux), each process of a shared-port proxy
accepts the shared port's connections itself (:class:`RoutingListener`) and reads each connection's head: its
request line and fields up to the blank line (:func:`read_head`: at most ``MAX_HEAD_BYTES``, waiting at most
``HEAD_WAIT_S``; bytes that cannot begin a ``CONNECT``, such as a TLS hello, end the wait at once). A ``CONNECT``
whose ``Proxy-Authorization`` names a session (:func:`proxy_user`: the Basic user name, decoded as mitmproxy's
proxyauth decodes it) that another process owns goes to that process: the socket's descriptor and the bytes read so
far in one datagram (``SCM_RIGHTS``) on a Unix socket in Linux's abstract namespace named after the owner's internal
port (:class:`HandOver`). The owner feeds those bytes first into the stream it gives its own mitmproxy
(``ServerInstance.handle_stream``, as for a connection it accepted: :func:`open_stream`), so the
tunnel's proxy authentication, TLS and relay (addon/serving/relay.py) all happen in the session's owner.

Everything else stays in the process that accepted it and takes the path it took before (a call forwarded to its
owner's internal port; the vendor's 503 while the owner is down): a head that is not a ``CONNECT`` or names no
session, a session this process owns, an owner marked down or whose Unix socket is not bound (yet), an owner whose
queue stays full for ``SEND_WAIT_S``. Routing is placement only: any process answers any session, so a tunnel
in the wrong process costs time, never a record. A client that hangs up before sending anything is closed.

A received datagram is used only when it carries exactly one TCP stream socket from a process of this user (the
kernel's ``SCM_CREDENTIALS``); anything else is closed unread and counted as ``refused``.

Why: behind one port the kernel gives a connection to any process, so with N processes (N-1)/N of the tunnels landed
where their session is not answered. Their calls went through mitmproxy's HTTP layers and a loopback hop to the
owner instead of the relay (``benchmarks/results/round22.md``: 50-64% of direct at 192 sessions on one port against
70-71% for as many separate proxies). Reading the head here, rather than peeking at it (``MSG_PEEK``), is what keeps a
head that arrives in pieces from spinning the loop: unread bytes keep a socket readable.
"""

from __future__ import annotations

import array
import asyncio
import binascii
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from addon.serving.aio import spawn

log = logging.getLogger("harnessrl.handover")

MAX_HEAD_BYTES = 32 * 1024  # a CONNECT head past this is left to mitmproxy (and its 400) in the accepting process
HEAD_WAIT_S = 10.0  # a client silent this long after connecting is served where it landed (mitmproxy times it out)
READ_BYTES = 16 * 1024
STREAM_LIMIT = 2**16  # asyncio.start_server's default reader limit, which mitmproxy's listener gets too
LISTEN_BACKLOG = 4096
SEND_WAIT_S = 2.0  # at most this long for an owner's full queue to drain; then the tunnel is served where it landed
ACCEPT_RETRY_S = 0.1  # after an accept error (out of descriptors): wait rather than spin
_UCRED = struct.Struct("3i")  # pid, uid, gid

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def supported() -> bool:
    """Unix sockets in the abstract namespace with sender credentials: Linux."""
    return hasattr(socket, "SCM_CREDENTIALS") and hasattr(socket, "SO_REUSEPORT") and hasattr(socket, "AF_UNIX")


def address(port: int) -> bytes:
    """The Unix socket of the process whose internal port is ``port`` (a port is unique while bound, as is this)."""
    return b"\0harnessrl-handover-%d" % port


def proxy_user(head: bytes) -> str | None:
    """The user name of a whole ``CONNECT`` head's Basic ``Proxy-Authorization``, decoded as mitmproxy's proxyauth
    does (UTF-8 with replacement, up to the first colon); ``None`` for any other head or field."""
    if not head.startswith(b"CONNECT "):
        return None
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    values = []
    for line in head[:end].split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"proxy-authorization":
            values.append(value)
    if len(values) != 1:  # mitmproxy joins repeated fields with ", ", which it then refuses
        return None
    parts = values[0].split()
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    try:
        credentials = binascii.a2b_base64(parts[1]).decode("utf8", "replace")
    except binascii.Error:
        return None
    user, colon, _ = credentials.partition(":")
    return user if colon and user else None


async def read_head(
    sock: socket.socket, limit: int = MAX_HEAD_BYTES, wait: float = HEAD_WAIT_S, start: bytes = b""
) -> tuple[bytes, bool]:
    """The bytes of a non-blocking socket up to and including its first blank line (and whatever came in the same
    read), at most ``limit`` of them, for at most ``wait`` seconds, or only what the first reads gave once they
    cannot begin with ``start`` (a TLS hello, a plain-HTTP request: nothing to wait for); and whether the client
    closed its side first."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    try:
        async with asyncio.timeout(wait):
            while len(data) < limit:
                chunk = await loop.sock_recv(sock, min(READ_BYTES, limit - len(data)))
                if not chunk:
                    return bytes(data), True
                since = max(0, len(data) - 3)  # the blank line may straddle two reads
                data += chunk
                if data.find(b"\r\n\r\n", since) >= 0 or not start.startswith(data[: len(start)]):
                    break
    except TimeoutError:
        pass
    return bytes(data), False


async def open_stream(sock: socket.socket, first: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio streams over an accepted socket whose first ``first`` bytes were already read from it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    if first:
        reader.feed_data(first)  # before the transport exists: these come before anything it reads
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def serve(handler: StreamHandler, sock: socket.socket, first: bytes) -> None:
    """Run ``handler`` (mitmproxy's ``handle_stream``) on ``sock``; a proxy shutting down ends it quietly."""
    try:
        reader, writer = await open_stream(sock, first)
    except OSError as e:  # the client reset the connection meanwhile
        log.debug("harnessrl: connection gone before it was served: %s", e)
        sock.close()
        return
    try:
        await handler(reader, writer)
    except asyncio.CancelledError:
        writer.close()


@dataclass
class HandOverCounts:
    handed_out: int = 0  # tunnels sent to their owner
    handed_in: int = 0  # tunnels received from a peer
    kept: int = 0  # accepted here and served here (own session, not a CONNECT, no credentials, owner unreachable)
    send_failed: int = 0  # an owner that could not take one (not bound, queue full): served here instead
    queue_waits: int = 0  # sends that found the owner's queue full and waited for it
    refused: int = 0  # datagrams not used: not one TCP socket, another user's, truncated


class HandOver:
    """The datagram socket a process receives tunnels on, and sends them from (see the module docstring)."""

    def __init__(self, own_port: int, handler: StreamHandler) -> None:
        self.own_port = own_port
        self.handler = handler
        self.counts = HandOverCounts()
        self._in: socket.socket | None = None
        # one socket connected to each peer's address, and a lock per peer: waiting for a full queue to drain needs a
        # connected socket (poll then watches the peer's queue), and one writer callback per descriptor
        self._out: dict[int, socket.socket] = {}
        self._sending: dict[int, asyncio.Lock] = {}
        self._uid = os.getuid()

    def start(self) -> None:
        """Bind this process's address and receive on the event loop."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(address(self.own_port))
        except OSError as e:
            sock.close()
            raise OSError(
                f"harnessrl_handover: cannot bind the Unix socket of internal port {self.own_port}: {e}"
            ) from e
        sock.setblocking(False)
        self._in = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def close(self) -> None:
        if self._in is not None:
            asyncio.get_running_loop().remove_reader(self._in.fileno())
            self._in.close()
            self._in = None
        for out in self._out.values():
            out.close()
        self._out.clear()

    def snapshot(self) -> dict[str, int]:
        return asdict(self.counts)

    async def send(self, port: int, sock: socket.socket, first: bytes) -> bool:
        """Pass ``sock`` and the bytes already read from it to the process whose internal port is ``port``; on
        success this process's copy is closed. False (``sock`` untouched): serve it here. The owner's queue holds
        only ``net.unix.max_dgram_qlen`` datagrams (10 by default), which a burst of new connections fills while the
        owner is busy: a full queue is waited on for at most ``SEND_WAIT_S``."""
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [sock.fileno()]))]
        lock = self._sending.setdefault(port, asyncio.Lock())
        try:
            async with lock, asyncio.timeout(SEND_WAIT_S):
                out = self._connected(port)
                while True:
                    try:
                        out.sendmsg([first], rights)
                        break
                    except BlockingIOError:  # its queue is full: wait until the owner takes one
                        self.counts.queue_waits += 1
                        await _writable(out)
        except (OSError, TimeoutError) as e:  # ECONNREFUSED / ENOENT: not bound (any more); EMSGSIZE; timed out
            self.counts.send_failed += 1
            stale = self._out.pop(port, None)
            if stale is not None:
                stale.close()  # reconnect next time: the owner may be a new process on the same port
            log.debug("harnessrl: could not hand a tunnel to internal port %d (%r); serving it here", port, e)
            return False
        sock.close()
        self.counts.handed_out += 1
        return True

    def _connected(self, port: int) -> socket.socket:
        out = self._out.get(port)
        if out is None:
            out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                out.connect(address(port))
            except OSError:
                out.close()
                raise
            out.setblocking(False)
            self._out[port] = out
        return out

    def _readable(self) -> None:
        """Every queued datagram (level-triggered: each is consumed whole, so nothing readable is left behind)."""
        assert self._in is not None
        space = socket.CMSG_SPACE(array.array("i").itemsize * 4) + socket.CMSG_SPACE(_UCRED.size)
        while True:
            try:
                data, ancdata, flags, _ = self._in.recvmsg(MAX_HEAD_BYTES, space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("harnessrl: handover socket: %s", e)
                return
            sock = self._accept(data, ancdata, flags)
            if sock is not None:
                self.counts.handed_in += 1
                spawn(serve(self.handler, sock, data), "harnessrl-handed-in")

    def _accept(self, data: bytes, ancdata: list[tuple[int, int, bytes]], flags: int) -> socket.socket | None:
        fds: list[int] = []
        uid = None
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                ints = array.array("i")
                ints.frombytes(cdata[: len(cdata) - len(cdata) % ints.itemsize])
                fds.extend(ints)
            elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(cdata) >= _UCRED.size:
                uid = _UCRED.unpack_from(cdata)[1]
        truncated = flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC)
        sock = _tcp_socket(fds[0]) if len(fds) == 1 and uid == self._uid and not truncated and data else None
        if sock is None:
            self.counts.refused += 1
            log.warning(
                "harnessrl: refused a handover datagram (%d descriptors, uid %s, %d bytes)", len(fds), uid, len(data)
            )
            for fd in fds:
                os.close(fd)
            return None
        return sock


class RoutingListener:
    """The shared port, accepted by this process: each connection's head read, then the connection handed to its
    session's owner or served here (see the module docstring). ``route(user)``: the internal port of the process to
    hand a tunnel with that proxy user name to, ``None`` to serve it here."""

    def __init__(self, handler: StreamHandler, handover: HandOver, route: Callable[[str], int | None]) -> None:
        self.handler = handler
        self.handover = handover
        self.route = route
        self._sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task] = []

    async def start(self, host: str, port: int) -> None:
        self._sockets = bind_reuseport(host, port)
        self._accepting = [spawn(self._accept(s), "harnessrl-shared-accept") for s in self._sockets]

    def close(self) -> None:
        """No new connections (the kernel gives them to the other processes); those accepted go on."""
        for task in self._accepting:
            task.cancel()
        for sock in self._sockets:
            sock.close()
        self._accepting, self._sockets = [], []
        self.handover.close()

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listening)  # non-blocking, as the loop sets it
            except OSError as e:  # out of descriptors, or a connection reset while queued
                log.warning("harnessrl: accept on the shared port failed: %s", e)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            spawn(self._route(conn), "harnessrl-shared-connection")

    async def _route(self, conn: socket.socket) -> None:
        try:
            first, closed = await read_head(conn, start=b"CONNECT ")
        except OSError as e:  # reset before its head was in
            log.debug("harnessrl: connection gone before its head: %s", e)
            conn.close()
            return
        if closed and not first:
            conn.close()
            return
        user = proxy_user(first)
        port = self.route(user) if user is not None and not closed else None
        if port is not None and await self.handover.send(port, conn, first):
            return
        self.handover.counts.kept += 1
        await serve(self.handler, conn, first)


def bind_reuseport(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on ``host:port`` (every address it resolves to; ``""``: all interfaces) with
    ``SO_REUSEPORT``, as ``asyncio.start_server(reuse_port=True)`` binds them, but left for the caller to accept."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("harnessrl_shared_port needs SO_REUSEPORT (Linux, macOS, the BSDs); this platform has none")
    bound: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # the IPv4 socket takes IPv4
            sock.bind(addr)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
    except OSError as e:  # another program holds the port without SO_REUSEPORT, or another user's process
        for sock in bound:
            sock.close()
        raise OSError(f"cannot listen on the shared port {host or '*'}:{port}: {e}") from e
    return bound


async def _writable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:  # level-triggered: it may run again before the waiter removes it
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())


def _tcp_socket(fd: int) -> socket.socket | None:
    """A non-blocking socket object over a received TCP stream descriptor (it then owns it), or None (``fd`` is left
    open for the caller to close)."""
    try:
        sock = socket.socket(fileno=fd)  # reads the family and type from the descriptor; ENOTSOCK for anything else
    except OSError:
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()
        return None
    sock.setblocking(False)
    return sock

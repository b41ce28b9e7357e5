"""The TLS relay's HTTP/1.1 server: model calls from ``HTTPS_PROXY`` tunnels that mitmproxy decrypts but does not parse.

Contract
--------
With ``harnessrl_relay`` (on by default) the capture addon hands a CONNECT tunnel to an intercepted host, once its
client has sent proxy credentials naming a session this process answers, to a relay: mitmproxy terminates the
client's TLS (HTTP/1.1 by ALPN) and passes the plain bytes, unparsed and without firing hooks, to
:class:`RelayServer` on a loopback port of the same process. When mitmproxy opens a relay connection the addon
:meth:`~RelayServer.register` s its local port with the tunnel's session, and :meth:`~RelayServer.unregister` s it
when the connection closes.

The relay server reads each request of a connection once (h11, keep-alive, chunked or sized bodies, ``Expect:
100-continue``), folds repeated field lines as the addon does for a flow it retargets
(:func:`addon.serving.field_lines.fold_field_lines`), admits it with the tunnel's session as the proxy credentials
(:func:`addon.serving.admission.admit`) and answers as the base-URL endpoint does: a model call through
:meth:`~addon.serving.server.InternalServer.answer_call` (streamed as the engine samples, its record durable before
the last byte), anything else from :meth:`addon.serving.runtime.Runtime.answer_locally`. Errors keep the caller's
wire format: a refused or oversized call gets its vendor's error; bytes that are not HTTP/1.1 get a plain 400 and
the connection closes. A failure inside one connection is logged and closes that connection only.

Why: through mitmproxy's HTTP layers a call is parsed twice (mitmproxy's HTTP/1 layer, then the internal server
after a second loopback hop), becomes a flow whose hooks run through mitmproxy's addon chain four times, and every
streamed chunk of its answer is read, re-framed and written again by mitmproxy. Relayed, mitmproxy's part is TLS and
a byte copy each way (``benchmarks/results/round19.md``: ~2 ms less CPU a call at 32 sessions, ~1 ms less added
latency one call at a time). h11 rather than aiohttp: aiohttp's parser refuses repeated singleton fields (hermes'
two ``User-Agent`` lines) before any handler runs, and a relay cannot fold bytes it does not parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime

import h11

from addon.generation.sessions import SESSION_HEADER, SessionSource
from addon.serving.admission import Admitted, Arrival, LocalDecision, Refused, admit, refusal, too_large
from addon.serving.aio import spawn
from addon.serving.base_url import Reply
from addon.serving.field_lines import fold_field_lines
from addon.serving.server import INTERNAL_HEADERS, InternalServer
from converters.canonical import ConversionError

log = logging.getLogger("harnessrl.relay")

READ_BYTES = 256 * 1024  # one read of a relay connection; a large request body arrives in a few
MAX_HEAD_BYTES = 256 * 1024  # request line and fields (h11's default, 16 KiB, is under some harnesses' headers)
REQUEST_LINE_BYTES = 8192  # kept of a request's first read: its request line, for an error in its wire format
_REQUEST_LINE = re.compile(rb"([A-Z]{3,7}) (/[^ \r\n]*) HTTP/1\.[01]\r?\n")
LINGER_S = 30.0  # at most this long reading a refused body before closing (a slow client's 20 MB upload)
_NO_BODY = {"content-length", "transfer-encoding", "connection"}  # framing fields h11 sets itself


class RelayServer:
    """The loopback HTTP/1.1 server behind the TLS relay (see the module docstring)."""

    def __init__(
        self,
        server: InternalServer,
        sources: tuple[SessionSource, ...],
        max_body: int,
        answer_locally: Callable[[LocalDecision, bytes, Mapping[str, str]], Awaitable[Reply]],
    ) -> None:
        self.server = server
        self.sources = sources
        self.max_body = max_body
        self._answer_locally = answer_locally
        self._sessions: dict[int, tuple[object, str]] = {}  # relay connection's local port -> (its owner, session)
        self._listener: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.requests = 0  # requests read, all connections
        self.port = 0

    # ------------------------------------------------------------------------------------------- registration

    def register(self, port: int, owner: object, session: str) -> None:
        """The relay connection from local ``port`` (``owner``: mitmproxy's server connection) carries ``session``."""
        self._sessions[port] = (owner, session)

    def unregister(self, port: int, owner: object) -> None:
        """Forget ``port`` unless a newer connection from the same port registered it since."""
        entry = self._sessions.get(port)
        if entry is not None and entry[0] is owner:
            del self._sessions[port]

    def _protocol_error(self, seen: list[bytes], err: h11.RemoteProtocolError) -> tuple[int, bytes, dict[str, str]]:
        """The answer to bytes h11 refused: the vendor's 400 when their request line names a model route (two
        Content-Length values that disagree...), else a plain JSON one."""
        message = f"bad HTTP/1.1 request: {err}"
        line = _REQUEST_LINE.match(seen[0]) if seen else None
        if line is not None:
            arrival = Arrival(line[1].decode("ascii"), line[2].decode("latin-1"), {})
            verdict = admit(arrival, self.sources)
            if isinstance(verdict, Admitted):
                refused = refusal(verdict.call.route.format, ConversionError("invalid_request", message))
                return refused.status, refused.body, refused.headers
        return _plain(err.error_status_hint, message)

    def snapshot(self) -> dict[str, int]:
        """For the admin memory route: connections open, relay ports registered, requests read."""
        return {"connections": len(self._connections), "registered": len(self._sessions), "requests": self.requests}

    # ------------------------------------------------------------------------------------------- life cycle

    async def start(self, host: str = "127.0.0.1") -> int:
        self._listener = await asyncio.start_server(self._connection, host, 0, limit=READ_BYTES)
        self.port = int(self._listener.sockets[0].getsockname()[1])
        return self.port

    async def close_listener(self) -> None:
        """Take no new connection (those open go on). Not ``wait_closed``: since Python 3.12 it also waits for every
        open connection, and a harness's kept-alive connection may stay open for as long as the harness runs."""
        if self._listener is not None:
            self._listener.close()

    async def stop(self) -> None:
        """Close every connection still open (the runtime first lets the internal server give the calls in flight
        their grace period: a relayed call is one of its calls)."""
        await self.close_listener()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)
        if self._listener is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._listener.wait_closed(), 5)
            self._listener = None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        peer = writer.get_extra_info("peername")
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            while await self._exchange(conn, reader, writer, peer[1] if peer else 0):
                conn.start_next_cycle()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client (through mitmproxy) went away; a call in flight was recorded as incomplete
        except Exception:  # the proxy never dies on a request: this connection ends, the others go on
            log.exception("harnessrl: relay connection from port %s failed", peer[1] if peer else "?")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    # ------------------------------------------------------------------------------------------- one request

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        port: int) -> bool:  # fmt: skip
        """Read and answer one request; False when the connection is to close."""
        seen: list[bytes] = []  # the request's first bytes, for an error in its wire format if h11 refuses them
        try:
            event = await _next_event(conn, reader, writer, seen)
            if not isinstance(event, h11.Request):
                return False  # closed between requests
            self.requests += 1
            raw = list(event.headers.raw_items())
            entry = self._sessions.get(port)
            try:
                fields, framing = fold_field_lines(raw), None
            except ConversionError as err:
                fields, framing = tuple(raw), err
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in fields}
            length = headers.get("content-length")
            arrival = Arrival(
                method=event.method.decode("ascii"),
                target=event.target.decode("latin-1"),
                headers={k: v for k, v in headers.items() if k not in INTERNAL_HEADERS},
                body_length=int(length) if length and length.strip().isdigit() else None,
                proxyauth_user=entry[1] if entry is not None else None,
                header_session=headers.get(SESSION_HEADER),
            )
            verdict = admit(arrival, self.sources, self.max_body)
            if framing is not None:  # the bytes after these fields cannot be told apart from the next request
                refused = refusal(verdict.call.route.format, framing) if isinstance(verdict, Admitted) else None
                await _send_whole(conn, writer, *_plain_or(refused, 400, framing.message), close=True)
                return False
            if isinstance(verdict, Refused) and arrival.body_length is not None and arrival.body_length > self.max_body:
                await _send_whole(conn, writer, verdict.status, verdict.body, verdict.headers, close=True)
                await _discard_body(conn, reader, writer)
                return False
            body = await _read_body(conn, reader, writer, self.max_body)
        except h11.RemoteProtocolError as err:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # not HTTP/1.1 as h11 reads it: say so, then close
                answer = self._protocol_error(seen, err)
                await _send_whole(conn, writer, *answer, close=True)
            return False
        if body is None:  # over harnessrl_max_body
            refused = too_large(verdict.call, self.max_body) if isinstance(verdict, Admitted) else None
            await _send_whole(conn, writer, *_plain_or(refused, 413, "request body too large"), close=True)
            await _discard_body(conn, reader, writer)
            return False
        if isinstance(verdict, Refused):
            await _send_whole(conn, writer, verdict.status, verdict.body, verdict.headers)
        elif isinstance(verdict, Admitted):
            sink = _Sink(conn, writer)
            received = datetime.now(UTC)
            watch = spawn(_hang_up_watch(conn, reader, asyncio.current_task()), "relay hang-up watch")
            try:
                answered = await self.server.answer_call(verdict.call, verdict.session, arrival.headers, body, sink,
                                                         received=received)  # fmt: skip
            finally:
                watch.cancel()
                await asyncio.wait([watch])  # its read ended before this connection's next one starts
            if not answered:
                await _send_whole(conn, writer, *_plain(500, "internal proxy error"))
            elif not sink.ended:
                return False  # an unexpected failure after the answer started: the client sees the stream cut
        else:
            reply = await self._answer_locally(verdict.decision, body, arrival.headers)
            await _send_whole(conn, writer, reply.status, reply.body, reply.headers, head=event.method == b"HEAD")
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE


class _Sink:
    """The Generator's ResponseSink over an h11 connection: one write per call of ``write`` or ``end``, the head
    going out with the first. Each write is a read, a TLS record and an event of mitmproxy's on the client's side,
    so the head (the Generator starts an answer just before its first bytes) and the last chunk with the body's end
    are not writes of their own."""

    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        self._conn = conn
        self._writer = writer
        self._head = b""
        self.started = False
        self.ended = False

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        fields = [(k, v) for k, v in headers.items() if k.lower() not in _NO_BODY]
        self._head = self._conn.send(h11.Response(status_code=status, headers=fields)) or b""
        self.started = True

    async def write(self, data: bytes) -> None:
        if data:
            self._writer.write(self._head + (self._conn.send(h11.Data(data=data)) or b""))
            self._head = b""
            await self._writer.drain()

    async def end(self, data: bytes = b"") -> None:
        body = (self._conn.send(h11.Data(data=data)) or b"") if data else b""
        self._writer.write(self._head + body + (self._conn.send(h11.EndOfMessage()) or b""))
        self._head = b""
        self.ended = True
        await self._writer.drain()


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      seen: list[bytes] | None = None) -> object:  # fmt: skip
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        data = await reader.read(READ_BYTES)  # b"": the client closed
        if seen is not None and not seen:
            seen.append(data[:REQUEST_LINE_BYTES])
        conn.receive_data(data)


async def _hang_up_watch(conn: h11.Connection, reader: asyncio.StreamReader, call: asyncio.Task | None) -> None:
    """While a call is answered: the client's end of the connection (mitmproxy closes it when the client goes) cancels
    the call's task, as aiohttp's handler cancellation does behind the hop, so a call waiting on the engine (a long
    prefill, no byte written yet) stops and is recorded incomplete at once. Bytes that arrive meanwhile (a pipelined
    request) are kept for h11."""
    while data := await reader.read(READ_BYTES):
        conn.receive_data(data)
    if call is not None:
        call.cancel()


async def _read_body(conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     limit: int) -> bytes | None:  # fmt: skip
    """The request's body; None once it passes ``limit`` bytes (the rest is left unread)."""
    parts: list[bytes] = []
    size = 0
    while True:
        event = await _next_event(conn, reader, writer)
        if isinstance(event, h11.EndOfMessage):
            return b"".join(parts)
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                return None
            parts.append(bytes(event.data))
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionResetError("the client closed the connection in the middle of a request body")


async def _discard_body(conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read the rest of a refused body, unkept, before the connection closes: closed while the client still sends,
    the socket would reset and the client could lose the answer already sent (a lingering close, bounded)."""
    with contextlib.suppress(h11.RemoteProtocolError, ConnectionError, TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while not isinstance(await _next_event(conn, reader, writer), h11.EndOfMessage | h11.ConnectionClosed):
                pass


def _plain(status: int, message: str) -> tuple[int, bytes, dict[str, str]]:
    """A JSON error for what has no wire format yet (not HTTP, or not a model route)."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
    return status, body, {"content-type": "application/json"}


def _plain_or(refused: Refused | None, status: int, message: str) -> tuple[int, bytes, dict[str, str]]:
    return (refused.status, refused.body, refused.headers) if refused is not None else _plain(status, message)


async def _send_whole(conn: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes,
                      headers: Mapping[str, str], close: bool = False, head: bool = False) -> None:  # fmt: skip
    fields = [(k, v) for k, v in headers.items() if k.lower() not in _NO_BODY]
    fields.append(("content-length", str(len(body))))
    if close:
        fields.append(("connection", "close"))
    data = conn.send(h11.Response(status_code=status, headers=fields))
    if body and not head:
        data += conn.send(h11.Data(data=body))
    writer.write(data + conn.send(h11.EndOfMessage()))
    await writer.drain()


__all__ = ["RelayServer"]

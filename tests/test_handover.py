"""addon/serving/handover.py: shared-port tunnels passed to the process that owns their session.

Real sockets throughout, in one process: two :class:`HandOver` s stand for two proxy processes (each has its own
abstract Unix address, named after a port nobody else uses), the handler stands for mitmproxy's ``handle_stream``
and answers with what it read. Checked: the proxy user a ``CONNECT`` head names (mirroring mitmproxy's proxyauth);
heads read whole when they arrive in pieces, with the blank line split over reads; a hundred connections with heads
in pieces all handed over and answered with their own bytes, in order, from the peer; an owner that is not bound
leaves the tunnel served where it landed; a datagram without exactly one TCP socket is refused and its descriptors
closed; a client that hangs up before its head is closed; the listener's port is shared with SO_REUSEPORT and a port
held without it is a clear error. Two real mitmdumps handing tunnels over: tests/test_shared_port.py.
"""

from __future__ import annotations

import array
import asyncio
import base64
import os
import socket
import uuid

import pytest

from addon.serving import handover
from addon.serving.handover import HandOver, RoutingListener, bind_reuseport, proxy_user, read_head

pytestmark = pytest.mark.skipif(not handover.supported(), reason="handover needs Linux's abstract Unix sockets")


def connect_head(user: str | None, password: str = "token", extra: str = "") -> bytes:
    fields = "Host: api.openai.com:443\r\n"
    if user is not None:
        fields += f"Proxy-Authorization: Basic {base64.b64encode(f'{user}:{password}'.encode()).decode()}\r\n"
    return f"CONNECT api.openai.com:443 HTTP/1.1\r\n{fields}{extra}\r\n".encode()


def test_the_proxy_user_of_a_connect_head_is_read_as_mitmproxy_reads_it() -> None:
    assert proxy_user(connect_head("sess-1")) == "sess-1"
    assert proxy_user(connect_head("sess:with-colon-in-password", "p")) == "sess"  # the user ends at the first colon
    assert proxy_user(connect_head("ünï")) == "ünï"
    lower = connect_head("s2").replace(b"Proxy-Authorization: Basic", b"proxy-authorization:   basic")
    assert proxy_user(lower) == "s2"
    assert proxy_user(connect_head(None)) is None
    assert proxy_user(connect_head("s3")[:-2]) is None  # the head is not whole yet
    assert proxy_user(connect_head("s4").replace(b"CONNECT", b"GET", 1)) is None
    twice = connect_head("s5", extra=f"Proxy-Authorization: Basic {base64.b64encode(b'x:y').decode()}\r\n")
    assert proxy_user(twice) is None  # mitmproxy refuses two
    no_colon = b"CONNECT a:443 HTTP/1.1\r\nProxy-Authorization: Basic " + base64.b64encode(b"nocolon") + b"\r\n\r\n"
    assert proxy_user(no_colon) is None
    assert proxy_user(b"CONNECT a:443 HTTP/1.1\r\nProxy-Authorization: Basic !!!\r\n\r\n") is None
    assert proxy_user(b"CONNECT a:443 HTTP/1.1\r\nProxy-Authorization: Bearer abc\r\n\r\n") is None
    assert proxy_user(connect_head("")) is None


async def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(client, accepted server side), both non-blocking."""
    listening = socket.create_server(("127.0.0.1", 0))
    listening.setblocking(False)
    client = socket.socket()
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(client, listening.getsockname())
    server, _ = await loop.sock_accept(listening)
    listening.close()
    return client, server


async def send_in_pieces(sock: socket.socket, data: bytes, size: int, pause: float = 0.002) -> None:
    loop = asyncio.get_running_loop()
    for i in range(0, len(data), size):
        await loop.sock_sendall(sock, data[i : i + size])
        await asyncio.sleep(pause)


@pytest.mark.parametrize("piece", [1, 7, 40, 10_000])
def test_a_head_is_read_whole_whatever_pieces_it_comes_in(piece: int) -> None:
    async def main() -> None:
        client, server = await tcp_pair()
        head = connect_head("s")
        sending = asyncio.ensure_future(send_in_pieces(client, head, piece))
        got, closed = await read_head(server, wait=5)
        await sending
        assert got == head and not closed
        client.close()
        server.close()

    asyncio.run(main())


def test_a_head_ends_at_the_blank_line_read_with_what_came_along_and_stops_at_eof_limit_or_wait() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        client, server = await tcp_pair()
        await loop.sock_sendall(client, connect_head("s") + b"\x16\x03\x01")  # a client that sends its hello early
        got, closed = await read_head(server, wait=5)
        assert got == connect_head("s") + b"\x16\x03\x01" and not closed
        client.close()
        assert await read_head(server, wait=5) == (b"", True)
        server.close()

        client, server = await tcp_pair()
        await loop.sock_sendall(client, b"CONNECT a:443 HTTP/1.1\r\n")  # and then nothing
        got, closed = await read_head(server, wait=0.2)
        assert got == b"CONNECT a:443 HTTP/1.1\r\n" and not closed
        await loop.sock_sendall(client, b"X" * 5000)
        got, closed = await read_head(server, limit=1000, wait=5)
        assert len(got) == 1000 and not closed
        client.close()
        server.close()

        for early in (b"\x16\x03\x01\x02\x00\x01", b"GET http://a/ HTTP/1.1\r\n", b"CONNEXION"):
            client, server = await tcp_pair()  # bytes that cannot begin a CONNECT: nothing to wait for
            await loop.sock_sendall(client, early)
            assert await read_head(server, wait=30, start=b"CONNECT ") == (early, False)
            client.close()
            server.close()

    asyncio.run(main())


def echo_handler(seen: list[tuple[str, int]], name: str):
    """A stand-in for mitmproxy's handle_stream: reads the head and 5 more bytes, answers ``name`` and them."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        more = await reader.readexactly(5)
        seen.append((name, writer.get_extra_info("peername")[1]))
        writer.write(f"{name} ".encode() + head + more)
        await writer.drain()
        writer.close()

    return handle


def fresh_port() -> int:
    """A number no other test process binds a handover address for (the address is named after it)."""
    return 20_000 + uuid.uuid4().int % 40_000


async def two_processes(route_to_b: bool = True):
    seen: list[tuple[str, int]] = []
    a = HandOver(fresh_port(), echo_handler(seen, "a"))
    b = HandOver(fresh_port(), echo_handler(seen, "b"))
    a.start()
    b.start()
    listener = RoutingListener(a.handler, a, lambda user: b.own_port if user.startswith("b-") else None)
    await listener.start("127.0.0.1", 0)
    port = listener._sockets[0].getsockname()[1]
    return seen, a, b, listener, port


async def call(port: int, head: bytes, piece: int) -> tuple[bytes, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    for i in range(0, len(head), piece):
        writer.write(head[i : i + piece])
        await writer.drain()
        await asyncio.sleep(0.001)
    writer.write(b"HELLO")
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer, sock.getsockname()[1]


def test_a_hundred_tunnels_with_heads_in_pieces_reach_their_owner_whole() -> None:
    async def main() -> None:
        seen, a, b, listener, port = await two_processes()
        heads = [connect_head(f"{'b' if i % 2 else 'a'}-{i}") for i in range(100)]
        answers = await asyncio.gather(*(call(port, h, 1 + i % 13) for i, h in enumerate(heads)))
        for i, (h, (answer, client_port)) in enumerate(zip(heads, answers, strict=True)):
            owner = "b" if i % 2 else "a"
            assert answer == f"{owner} ".encode() + h + b"HELLO"
            assert (owner, client_port) in seen  # the peer's socket is the client's connection itself
        assert a.snapshot() | {"queue_waits": 0} == {
            "handed_out": 50,
            "handed_in": 0,
            "kept": 50,
            "send_failed": 0,
            "refused": 0,
            "queue_waits": 0,
        }
        assert b.snapshot()["handed_in"] == 50
        listener.close()
        b.close()

    asyncio.run(main())


def test_a_burst_past_the_owner_s_queue_waits_for_it_to_drain() -> None:
    """Linux queues 10 datagrams per Unix socket (net.unix.max_dgram_qlen): forty tunnels at once while the owner
    reads nothing are all handed over once it reads again."""

    async def main() -> None:
        seen, a, b, listener, port = await two_processes()
        loop = asyncio.get_running_loop()
        loop.remove_reader(b._in.fileno())  # the owner's loop is busy elsewhere
        loop.call_later(0.5, loop.add_reader, b._in.fileno(), b._readable)
        heads = [connect_head(f"b-{i}") for i in range(40)]
        answers = await asyncio.gather(*(call(port, h, 50) for h in heads))
        assert [answer for answer, _ in answers] == [b"b " + h + b"HELLO" for h in heads]
        assert a.snapshot()["handed_out"] == 40 and a.snapshot()["send_failed"] == 0
        assert a.snapshot()["queue_waits"] >= 1  # the queue did fill
        listener.close()
        b.close()

    asyncio.run(main())


def test_an_owner_not_listening_leaves_the_tunnel_where_it_landed() -> None:
    async def main() -> None:
        seen, a, b, listener, port = await two_processes()
        b.close()
        answer, _ = await call(port, connect_head("b-1"), 9)
        assert answer.startswith(b"a CONNECT")
        assert a.snapshot()["send_failed"] == 1 and a.snapshot()["kept"] == 1
        listener.close()

    asyncio.run(main())


def test_heads_that_name_no_session_are_served_where_they_landed() -> None:
    async def main() -> None:
        seen, a, b, listener, port = await two_processes()
        plain = b"GET http://b-1/ HTTP/1.1\r\nHost: b-1\r\n\r\n"
        for head in (connect_head(None), plain):
            answer, _ = await call(port, head, 5)
            assert answer.startswith(b"a ")
        assert a.snapshot()["handed_out"] == 0 and a.snapshot()["kept"] == 2
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # hangs up before sending anything
        writer.close()
        await asyncio.sleep(0.2)
        assert a.snapshot()["kept"] == 2 and not [s for s in seen if s[0] == "b"]
        listener.close()
        b.close()

    asyncio.run(main())


def test_a_datagram_without_exactly_one_tcp_socket_is_refused_and_its_descriptors_closed() -> None:
    async def main() -> None:
        seen, a, b, listener, _ = await two_processes()
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        r, w = os.pipe()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        before = len(os.listdir("/proc/self/fd"))
        for fds in ([r], [udp.fileno()], []):
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            sender.sendmsg([connect_head("b-1")], rights, 0, handover.address(b.own_port))
        await asyncio.sleep(0.2)
        assert b.snapshot()["refused"] == 3 and b.snapshot()["handed_in"] == 0 and not seen
        assert len(os.listdir("/proc/self/fd")) == before  # the copies the kernel made for b are closed
        os.close(r)
        os.close(w)
        udp.close()
        sender.close()
        listener.close()
        b.close()

    asyncio.run(main())


def test_the_listener_shares_its_port_and_a_port_held_without_reuseport_is_a_clear_error() -> None:
    first = bind_reuseport("127.0.0.1", 0)
    port = first[0].getsockname()[1]
    second = bind_reuseport("127.0.0.1", port)
    assert second[0].getsockname()[1] == port
    for s in first + second:
        s.close()
    held = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(OSError, match="cannot listen on the shared port 127.0.0.1:"):
        bind_reuseport("127.0.0.1", held.getsockname()[1])
    held.close()

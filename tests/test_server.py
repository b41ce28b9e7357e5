"""addon/serving/server.py: naming the caller from its User-Agent, and the internal server's lifecycle with the real
runtime
(generator, record store, tokenizer) against the FAKE engine of benchmarks/fake_engine.py served in process:
a client that gives up stops its call, shutdown does not wait a minute for a call hung on the engine, closing a
session frees its prefix graph, and the listen backlog takes a burst of connects (the HTTP routes are driven end
to end through mitmproxy in test_capture)."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from mitmproxy.options import Options

from addon.records.schema import read_records
from addon.records.wal import list_segments
from addon.serving.config import CaptureConfig, add_options
from addon.serving.runtime import Runtime
from addon.serving.server import (
    CALL_PATH,
    HEADER_CALL_ID,
    HEADER_HANDOFF,
    HEADER_PATH,
    HEADER_SESSION,
    LISTEN_BACKLOG,
    harness_from_user_agent,
)
from benchmarks.fake_engine import FakeEngine, Faults
from tests.runtime_world import start_runtime


@pytest.mark.parametrize(
    ("ua", "expected"),
    [
        ("claude-cli/2.1.197 (external, sdk-cli)", ("claude-code", "2.1.197")),
        ("GeminiCLI-tui/0.61.0/gemini-3.5-pro (linux; x64)", ("gemini-cli", "0.61.0")),
        ("codex_exec/0.171.0 (Debian 12; x86_64) xterm", ("codex", "0.171.0")),
        ("QwenCode/0.15.10 (linux; x64)", ("qwen-code", "0.15.10")),
        ("opencode/1.18.33 ai-sdk/provider-utils/3.0.1", ("opencode", "1.18.33")),
        ("Anthropic/JS 0.91.1", ("anthropic-js-sdk", "0.91.1")),  # Pi sends only its SDK's agent
        ("OpenAI/Python 2.24.0", ("openai-python-sdk", "2.24.0")),
        ("kilo-code/latest", ("kilo", None)),
        ("curl/8.5.0", ("curl", None)),
        ("", ("unknown", None)),
    ],
)
def test_harness_from_user_agent(ua: str, expected: tuple[str, str | None]) -> None:
    assert harness_from_user_agent(ua) == expected


# ------------------------------------------------------------------------------------------------ lifecycle


class World:
    def __init__(self, engine: FakeEngine, runtime: Runtime, records: Path) -> None:
        self.engine, self.runtime, self.records = engine, runtime, records

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.runtime.port}{CALL_PATH}"

    async def call(self, session: str, messages: list[dict], *, timeout: float = 30.0) -> httpx.Response:
        body = {"model": "m", "messages": messages, "stream": True, "max_tokens": 64, "tools": TOOLS}
        headers = {HEADER_PATH: "/v1/chat/completions", HEADER_SESSION: session, "content-type": "application/json"}
        async with httpx.AsyncClient(timeout=timeout) as client:
            return await client.post(self.url, content=json.dumps(body).encode(), headers=headers)


@pytest.fixture
async def world(smollm2_tokenizer_dir: Path, tmp_path: Path) -> AsyncIterator[World]:
    engine, server, runtime = await start_runtime(smollm2_tokenizer_dir, tmp_path / "records", tokens=24)
    try:
        yield World(engine, runtime, tmp_path / "records")
    finally:
        await asyncio.wait_for(runtime.stop(), 30)
        await server.close()


async def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


USER = [{"role": "user", "content": "List the files."}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {arg: {"type": "string"}}}},
    }
    for name, arg in (("read_file", "path"), ("bash", "command"))  # what the fake engine's answers call
]


async def test_a_client_that_gives_up_stops_its_call_waiting_on_the_engine(world: World) -> None:
    """Regression: aiohttp does not cancel a handler when its client disconnects unless asked to, so a call waiting
    on a hung engine held its engine request until the 600 s engine timeout."""
    world.engine.faults = Faults(hang=True, calls=1)
    with pytest.raises(httpx.ReadTimeout):
        await world.call("gave-up", USER, timeout=1.0)
    await wait_for(lambda: world.engine.aborted == 1, 5.0, "the engine request to be released")
    assert world.engine.active == 0
    await asyncio.wait_for(world.runtime.stop(), 30)
    rows = read_records([str(world.records)], columns=["session_id", "error", "incomplete"]).to_pylist()
    assert rows == [{"session_id": "gave-up", "error": "client_disconnected", "incomplete": True}]


async def test_a_body_handed_over_in_memory_is_answered_and_recorded_as_if_it_crossed_the_hop(world: World) -> None:
    """The capture addon leaves the body of its own process's calls with ``hand_off`` and sends none over loopback."""
    server = world.runtime.server
    assert server is not None
    body = json.dumps({"model": "m", "messages": USER, "stream": True, "max_tokens": 64, "tools": TOOLS}).encode()
    server.hand_off("call-handed", body)
    headers = {HEADER_PATH: "/v1/chat/completions", HEADER_SESSION: "handed", HEADER_CALL_ID: "call-handed",
               HEADER_HANDOFF: "1", "content-type": "application/json"}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as client:
        answered = await client.post(world.url, content=b"", headers=headers)
        assert answered.status_code == 200 and b"data: [DONE]" in answered.content
        assert server.handoffs_waiting == 0
        lost = await client.post(world.url, content=b"", headers=headers)  # taken once: a second one has no body
    assert lost.status_code == 500 and "body lost" in lost.text
    server.hand_off("never-sent", b"{}")
    assert server.drop_handoff("never-sent") and not server.drop_handoff("never-sent") and not server.handoffs_waiting
    await asyncio.wait_for(world.runtime.stop(), 30)
    rows = read_records([str(world.records)], columns=["session_id", "call_id", "incomplete", "wire_format"])
    assert rows.to_pylist() == [
        {"session_id": "handed", "call_id": "call-handed", "incomplete": False, "wire_format": "chat"}
    ]


async def test_shutdown_cancels_a_call_hung_on_the_engine_and_closes_the_store(world: World) -> None:
    """Regression: the internal runner waited aiohttp's default 60 s for in-flight handlers, so a proxy stopped
    with a call hung on the engine was killed before its record store closed (rows left in the write-ahead log)."""
    ok = await world.call("done", USER)
    assert ok.status_code == 200 and b"[DONE]" in ok.content
    world.engine.faults = Faults(hang=True, calls=1)
    hung = asyncio.ensure_future(world.call("hung", USER, timeout=120.0))
    await wait_for(lambda: world.engine.active == 1, 10.0, "the call to reach the engine")
    assert world.runtime.server is not None
    grace = world.runtime.server.shutdown_grace_s
    t0 = time.monotonic()
    await asyncio.wait_for(world.runtime.stop(), 30)
    assert time.monotonic() - t0 < 2 * grace + 3  # not aiohttp's 60 s, nor the launcher's 20 s before its kill
    with pytest.raises(httpx.HTTPError):
        await hung
    assert list_segments(world.records / "wal") == []  # the store closed: every row is in a shard
    rows = read_records([str(world.records)], columns=["session_id", "incomplete"]).to_pylist()
    assert sorted((r["session_id"], r["incomplete"]) for r in rows) == [("done", False), ("hung", True)]


def _assistant_turn(sse: bytes) -> dict:
    """The chat assistant message a client rebuilds from the proxy's stream (text and tool calls)."""
    text, calls = "", {}
    for line in sse.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice.get("delta", {})
            text += delta.get("content") or ""
            for c in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    c["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] = c.get("id") or slot["id"]
                fn = c.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    return {"role": "assistant", "content": text or None, "tool_calls": [calls[i] for i in sorted(calls)]}


async def test_closing_a_session_frees_its_prefix_graph_and_the_session_can_go_on(world: World) -> None:
    first = await world.call("s1", USER)
    turn = _assistant_turn(first.content)
    assert turn["tool_calls"], turn
    history = USER + [turn, {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": "a.py"}]
    second = await world.call("s1", history)
    assert second.status_code == 200
    generator = world.runtime.generator
    assert generator is not None and len(generator.graphs) == 1
    assert generator.graphs.tokens_held > 0  # the second call's prompt and both calls' sampled ids
    async with httpx.AsyncClient() as client:
        closed = await client.post(f"http://127.0.0.1:{world.runtime.port}/_harnessrl/admin/sessions/s1/close")
    assert closed.json() == {"session": "s1", "known": True, "flushed": True}
    assert len(generator.graphs) == 0  # freed at once, not after an hour idle
    assert generator.graphs.tokens_held == 0
    again = await world.call("s1", history)  # a closed session that sends again is served, rendered in full
    assert again.status_code == 200 and b"[DONE]" in again.content
    await asyncio.wait_for(world.runtime.stop(), 30)
    columns = ["call_index", "parent_call_id", "prompt_reused_tokens", "prompt_ids"]
    rows = sorted(read_records([str(world.records)], columns=columns).to_pylist(), key=lambda r: r["call_index"])
    assert [r["call_index"] for r in rows] == [0, 1, 2]
    assert rows[1]["prompt_reused_tokens"] > 0  # spliced onto the first call while the graph was held
    assert rows[2]["parent_call_id"] is None and rows[2]["prompt_reused_tokens"] == 0  # a new graph: full render
    assert len(rows[2]["prompt_ids"]) > len(rows[0]["prompt_ids"])  # the whole history, rendered


async def test_the_listen_backlog_takes_a_burst_of_connects_while_the_loop_is_busy(world: World) -> None:
    """mitmproxy opens a connection here per client connection; while the event loop is busy the kernel queues the
    handshakes, and past aiohttp's default backlog of 128 it drops them (the connect then waits for retransmits)."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    burst = min(300, somaxconn, LISTEN_BACKLOG)
    socks: list[socket.socket] = []
    try:
        for _ in range(burst):  # blocking connects: the event loop cannot accept meanwhile, as when it is busy
            s = socket.socket()
            s.settimeout(0.5)
            s.connect(("127.0.0.1", world.runtime.port))
            socks.append(s)
    except OSError as e:
        pytest.fail(f"connect {len(socks) + 1} of {burst} failed while the loop was busy: {e!r}")
    finally:
        for s in socks:
            s.close()
    assert len(socks) == burst


async def test_the_stats_route_reports_event_loop_lag_and_collector_pauses(world: World) -> None:
    """Every call of the process shares one event loop; the soak reads how late it ran (a lag of seconds turns into
    the engine client's 5 s connect timeouts) from the stats route."""
    port = world.runtime.port
    await asyncio.sleep(0.3)  # the monitor has taken a sample or two
    time.sleep(0.6)  # block the loop, as a burst of work on it would  # noqa: ASYNC251
    gc.collect()  # a full collection, timed through gc.callbacks
    await asyncio.sleep(0.3)
    async with httpx.AsyncClient() as client:
        loop = (await client.get(f"http://127.0.0.1:{port}/_harnessrl/admin/stats")).json()["loop"]
    assert 0.4 < loop["lag_max_s"] < 5.0, loop
    assert loop["lag_p99_last_60s"] == loop["lag_max_s"]  # the blocked sample is the worst of the last minute
    assert loop["gc_max_s"][2] > 0.0 and loop["gc_total_s"] + 0.01 >= loop["gc_max_s"][2]


async def test_the_memory_route_reports_the_runtime_structures_and_the_allocator(world: World) -> None:
    """Where the memory goes: the soak reads this report at its end (live structures vs memory the allocators hold)."""
    first = await world.call("m1", USER)
    turn = _assistant_turn(first.content)
    history = USER + [turn, {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"], "content": "a.py"}]
    assert (await world.call("m1", history)).status_code == 200
    base = f"http://127.0.0.1:{world.runtime.port}/_harnessrl/admin/memory"
    async with httpx.AsyncClient(timeout=60) as client:
        report = (await client.get(base, params={"top": 5})).json()
        bad = await client.get(base, params={"top": "many"})
        light = (await client.get(base, params={"objects": "0"})).json()
        trimmed = (await client.post(f"{base}/trim")).json()
    live = report["structures"]["generator"]
    assert live["graph_sessions"] == 1 and live["graph_nodes"] == 2
    assert live["graph_token_ids"] == world.runtime.generator.graphs.tokens_held > 0
    assert live["json_fragments"] > 0 and live["json_fragment_chars"] > 0
    assert report["structures"]["sessions"] == 1 and report["structures"]["store_buffered_rows"] == 2
    assert report["structures"]["trims"] == {"count": 0, "returned_mib": 0.0}  # the first is due after 30 s
    assert report["rss_mib"] > 10 and report["python"]["allocated_blocks"] > 0
    assert len(report["python"]["gc_objects_by_type"]) == 5
    assert report["mappings"]["file"]["rss_mib"] > 0  # shared libraries at least
    assert report["malloc"] is None or report["malloc"]["in_use_mib"] > 0  # glibc only
    assert report["tracemalloc"] is None  # not traced unless PYTHONTRACEMALLOC is set
    assert bad.status_code == 400
    assert set(light) == {"rss_mib", "malloc", "structures"} and light["structures"]["generator"] == live
    assert trimmed["rss_after_mib"] > 0 and trimmed["rss_before_mib"] > 0


def test_tuning_options_are_parsed_and_checked() -> None:
    options = Options()
    add_options(options)
    config = CaptureConfig.from_options(options)
    assert (config.tuning.gc_young, config.tuning.malloc_arenas, config.tuning.trim_every) == (5_000, 2, 30.0)
    options.update(harnessrl_gc_young=0, harnessrl_trim_every=5)
    assert CaptureConfig.from_options(options).tuning.trim_every == 5.0
    options.update(harnessrl_malloc_arenas=-1)
    with pytest.raises(ValueError, match="harnessrl_malloc_arenas"):
        CaptureConfig.from_options(options)


def test_the_stream_interval_defaults_to_eight_and_must_be_positive() -> None:
    options = Options()
    add_options(options)
    assert CaptureConfig.from_options(options).stream_interval == 8
    options.update(harnessrl_stream_interval=1)
    assert CaptureConfig.from_options(options).stream_interval == 1
    options.update(harnessrl_stream_interval=0)
    with pytest.raises(ValueError, match="harnessrl_stream_interval must be positive"):
        CaptureConfig.from_options(options)


def test_every_option_can_be_set_on_the_command_line(tmp_path: Path) -> None:
    """mitmproxy parses ``--set`` values by the option's declared type and knows no float: a float option made
    mitmdump exit at start-up as soon as it was set."""
    from mitmproxy.utils import typecheck

    from addon.serving.config import OPTIONS

    for name, typ, default, _ in OPTIONS:
        typecheck.check_option_type(name, default, typ)
        options = Options()
        add_options(options)
        value = str(default).lower() if typ is bool else str(default)
        options.set(f"{name}={value}")
        assert getattr(options, name) == default

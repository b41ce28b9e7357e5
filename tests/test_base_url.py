"""addon/serving/base_url.py: the internal server as a base URL, without mitmproxy — the official SDKs pointed at it
with a
session prefix, every route kind (model call streamed and not, count-tokens, model listing, local answers), the
session from the prefix or the header, oversized bodies refused in the caller's format, and (a documented limitation)
repeated singleton headers refused by aiohttp before the endpoint runs. The runtime is the real one (generator,
record store, tokenizer) against the FAKE engine of benchmarks/fake_engine.py, served in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from aiohttp.test_utils import TestServer

from addon.records.schema import read_records
from addon.serving.runtime import Runtime
from tests.runtime_world import start_runtime


class Base:
    def __init__(self, runtime: Runtime, records: Path) -> None:
        self.runtime, self.records = runtime, records

    def url(self, session: str | None = None) -> str:
        prefix = f"/s/{session}" if session else ""
        return f"http://127.0.0.1:{self.runtime.port}{prefix}"

    async def rows(self) -> list[dict]:
        await asyncio.wait_for(self.runtime.stop(), 30)
        columns = ["session_id", "wire_format", "call_index", "completion_ids"]
        return read_records([str(self.records)], columns=columns).to_pylist()


async def start(tokenizer_dir: Path, tmp_path: Path, **extra: object) -> tuple[Base, TestServer]:
    _, server, runtime = await start_runtime(
        tokenizer_dir, tmp_path / "records", tokens=12, harnessrl_max_body=200_000, **extra
    )
    return Base(runtime, tmp_path / "records"), server


@pytest.fixture
async def base(smollm2_tokenizer_dir: Path, tmp_path: Path) -> AsyncIterator[Base]:
    b, server = await start(smollm2_tokenizer_dir, tmp_path)
    try:
        yield b
    finally:
        await asyncio.wait_for(b.runtime.stop(), 30)
        await server.close()


async def test_the_official_sdks_talk_to_it_with_a_session_prefix(base: Base) -> None:
    oai = openai.AsyncOpenAI(base_url=base.url("chat-1") + "/v1", api_key="k", max_retries=0)
    done = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    assert done.choices[0].message.content is not None and done.usage is not None
    assert done.usage.completion_tokens == 8
    chunks = [
        c
        async for c in await oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    ]
    assert chunks and chunks[-1].choices[0].finish_reason == "length"
    models = await oai.models.list()
    assert [m.id for m in models.data] == [base.runtime.served_model]

    claude = anthropic.AsyncAnthropic(base_url=base.url("msg-1"), api_key="k", max_retries=0)
    message = await claude.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert message.usage.output_tokens == 8 and message.stop_reason == "max_tokens"
    counted = await claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": "Hi"}])
    assert counted.input_tokens > 0

    rows = await base.rows()
    got = sorted((r["session_id"], r["wire_format"], r["call_index"]) for r in rows)
    assert got == [("chat-1", "chat", 0), ("chat-1", "chat", 1), ("msg-1", "anthropic", 0)]
    assert all(len(r["completion_ids"]) == 8 for r in rows)


async def test_the_session_header_names_the_session_and_other_paths_get_local_answers(base: Base) -> None:
    async with httpx.AsyncClient(base_url=base.url(), timeout=60) as http:
        r = await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"x-harnessrl-session": "by-header"},
        )
        assert r.status_code == 200, r.text
        telemetry = await http.post("/api/event_logging/batch", json={"events": []})
        unknown = await http.get("/v1/nothing/here")
        stats = await http.get("/_harnessrl/admin/stats")  # the server's own routes still win
    assert telemetry.status_code == 200 and telemetry.json() == {}
    assert unknown.status_code == 404 and "error" in unknown.json()
    assert stats.json()["calls"] == 1
    assert [r["session_id"] for r in await base.rows()] == ["by-header"]


async def test_an_oversized_body_gets_a_413_in_the_callers_format_and_nothing_is_recorded(base: Base) -> None:
    big = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 300_000}]}
    async with httpx.AsyncClient(base_url=base.url("big"), timeout=60) as http:
        r = await http.post("/v1/messages", json=big)
        chunked = await http.post(
            "/v1/messages",
            content=_parts(),
            headers={"content-type": "application/json"},
        )
    for resp in (r, chunked):
        assert resp.status_code == 413, resp.text
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "request_too_large"
    assert await base.rows() == []


async def _parts() -> AsyncIterator[bytes]:  # no content-length: sent chunked
    for part in (b'{"messages": "', b"x" * 300_000, b'"}'):
        yield part


async def test_off_leaves_only_the_internal_routes(smollm2_tokenizer_dir: Path, tmp_path: Path) -> None:
    b, server = await start(smollm2_tokenizer_dir, tmp_path, harnessrl_base_url=False)
    try:
        async with httpx.AsyncClient(base_url=b.url("s"), timeout=60) as http:
            r = await http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 404
    finally:
        await asyncio.wait_for(b.runtime.stop(), 30)
        await server.close()


async def test_repeated_user_agent_lines_are_refused_by_aiohttp_before_any_handler(base: Base) -> None:
    """The documented limitation (docs/capture.md, *Repeated header lines*): a client talking to aiohttp directly
    cannot repeat a singleton header, and nothing of ours runs to fold it. Should aiohttp start accepting them, this
    fails: drop the note then."""
    body = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}'
    head = [
        b"POST /s/dup/v1/messages HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        b"User-Agent: Anthropic/Python 0.69.0",
        b"user-agent: claude-code/2.0.14",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
    ]
    reader, writer = await asyncio.open_connection("127.0.0.1", base.runtime.port)
    writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.split(b" ", 2)[1] == b"400" and b"Duplicate 'User-Agent' header found" in answer
    assert await base.rows() == []  # refused before the endpoint: no call, no record

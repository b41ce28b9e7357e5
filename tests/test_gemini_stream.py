"""Gemini responses judged by the google-genai SDK: bodies, SSE and JSON-array streams, errors.

Every stream is delivered to the SDK at odd byte boundaries (``chunkings``), through the SDK's own httpx client
(``HttpOptions.client_args={"transport": ...}``), sync and async; the accumulated stream must equal the
non-streaming body the SDK parsed. The JSON-array stream (``streamGenerateContent`` without ``alt=sse``, which the
Python SDK never requests) is checked with ``json.loads`` on the whole and with an incremental parser.
"""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types
from hypothesis import given, settings
from hypothesis import strategies as st

from converters import dialect_for
from converters.base import Route, StreamEncoder
from converters.canonical import (
    Completion,
    ConversionError,
    ErrorKind,
    Finish,
    FinishReason,
    ReasoningDelta,
    StreamEvent,
    StreamStart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
    completion_events,
)
from converters.gemini_stream import GeminiStreamEncoder, StreamState, final_state, step, usage_metadata
from tests.streaming import chunkings, streaming_transport

DIALECT = dialect_for("gemini")
SSE_ROUTE = Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=True)
ARRAY_ROUTE = Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=False)

COMPLETIONS = {
    "text": Completion("resp-text", "gem-test", text="Héllo, wörld — ✓ done.", usage=Usage(12, 7)),
    "reasoning": Completion(
        "resp-think", "gem-test", text="The answer is 4.", reasoning="2+2… is 4 🤔", usage=Usage(30, 25, 4, 18)
    ),
    "one_call": Completion(
        "resp-call",
        "gem-test",
        reasoning="I should read it.",
        tool_calls=(ToolCall("call_1", "read_file", '{"absolute_path":"/tmp/ä.txt"}'),),
        finish_reason="tool_calls",
        usage=Usage(40, 15, 0, 5),
    ),
    "several_calls": Completion(
        "resp-calls",
        "gem-test",
        text="Running both.",
        tool_calls=(
            ToolCall("call_a", "glob", '{"pattern":"**/*.py","limit":3}'),
            ToolCall("call_b", "run_shell_command", '{"command":"ls -la","nested":{"x":[1,2,{"y":null}]}}'),
            ToolCall("call_c", "list_directory", "{}"),
        ),
        finish_reason="tool_calls",
        usage=Usage(50, 30),
    ),
    "max_tokens": Completion("resp-len", "gem-test", text="cut of", finish_reason="length", usage=Usage(5, 3)),
}


def make_client(transport: httpx.MockTransport) -> genai.Client:
    options = types.HttpOptions(
        base_url="http://gemini.test",
        api_version="v1beta",
        client_args={"transport": transport},
        async_client_args={"transport": transport},
    )
    return genai.Client(api_key="test-key", http_options=options)


def stream_bytes(completion: Completion, route: Route = SSE_ROUTE) -> bytes:
    encoder = DIALECT.stream_encoder(route)
    return b"".join(encoder.feed(e) for e in completion_events(completion))


@dataclass(frozen=True)
class Seen:
    """What the SDK made of a response, reduced to what must agree between stream and body."""

    text: str
    thoughts: str
    calls: tuple[tuple[str | None, str | None, str], ...]
    finish: Any
    usage: dict[str, Any] | None
    response_id: str | None
    model_version: str | None


def _calls(parts: list[types.Part]) -> list[tuple[str | None, str | None, str]]:
    return [
        (p.function_call.id, p.function_call.name, json.dumps(p.function_call.args, sort_keys=True))
        for p in parts
        if p.function_call is not None
    ]


def candidate(response: types.GenerateContentResponse) -> types.Candidate:
    assert response.candidates is not None and len(response.candidates) == 1
    return response.candidates[0]


def parts_of(response: types.GenerateContentResponse) -> list[types.Part]:
    content = candidate(response).content
    return (content.parts if content else None) or []


def seen_from(responses: list[types.GenerateContentResponse]) -> Seen:
    """Accumulate SDK response objects (one for a body, many for a stream) the way a client would."""
    text, thoughts, calls = "", "", []
    finish, usage, rid, version = None, None, None, None
    for r in responses:
        cand = candidate(r)
        parts = (cand.content.parts if cand.content else None) or []
        text += "".join(p.text for p in parts if p.text and not p.thought)
        thoughts += "".join(p.text for p in parts if p.text and p.thought)
        calls += _calls(parts)
        finish = cand.finish_reason or finish
        usage = r.usage_metadata.model_dump(exclude_none=True) if r.usage_metadata else usage
        rid, version = r.response_id, r.model_version
    return Seen(text, thoughts, tuple(calls), finish, usage, rid, version)


def expected(completion: Completion) -> Seen:
    calls = tuple((c.id, c.name, json.dumps(json.loads(c.arguments), sort_keys=True)) for c in completion.tool_calls)
    finish = {"length": types.FinishReason.MAX_TOKENS}.get(completion.finish_reason, types.FinishReason.STOP)
    u = completion.usage
    usage = {
        "prompt_token_count": u.prompt_tokens,
        "candidates_token_count": u.completion_tokens - u.reasoning_tokens,
        "total_token_count": u.prompt_tokens + u.completion_tokens,
    }
    usage |= {"thoughts_token_count": u.reasoning_tokens} if u.reasoning_tokens else {}
    usage |= {"cached_content_token_count": u.cached_tokens} if u.cached_tokens else {}
    return Seen(completion.text, completion.reasoning, calls, finish, usage, completion.id, completion.model)


def _record_url(urls: list[str]) -> Callable[[httpx.Request], None]:
    return lambda request: urls.append(str(request.url))


def sdk_body(completion: Completion) -> Seen:
    body = json.dumps(DIALECT.render_completion(completion)).encode()
    client = make_client(streaming_transport([body], "application/json; charset=UTF-8"))
    return seen_from([client.models.generate_content(model="gem-test", contents="hi")])


# --------------------------------------------------------------------------------------------------- SDK judge


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_sdk_parses_body(name: str) -> None:
    completion = COMPLETIONS[name]
    assert sdk_body(completion) == expected(completion)


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_sdk_stream_accumulates_to_body(name: str) -> None:
    completion = COMPLETIONS[name]
    data = stream_bytes(completion)
    body = sdk_body(completion)
    for how, chunks in chunkings(data):
        seen_urls: list[str] = []
        transport = streaming_transport(chunks, "text/event-stream", on_request=_record_url(seen_urls))
        client = make_client(transport)
        responses = list(client.models.generate_content_stream(model="gem-test", contents="hi"))
        assert seen_from(responses) == body == expected(completion), how
        assert seen_urls == ["http://gemini.test/v1beta/models/gem-test:streamGenerateContent?alt=sse"]


@pytest.mark.parametrize("name", ["reasoning", "several_calls"])
def test_sdk_async_stream_accumulates_to_body(name: str) -> None:
    completion = COMPLETIONS[name]

    async def collect(chunks: list[bytes]) -> list[types.GenerateContentResponse]:
        client = make_client(streaming_transport(chunks, "text/event-stream"))
        stream = await client.aio.models.generate_content_stream(model="gem-test", contents="hi")
        return [r async for r in stream]

    for how, chunks in chunkings(stream_bytes(completion)):
        assert seen_from(asyncio.run(collect(chunks))) == expected(completion), how


def test_stream_chunks_carry_only_new_parts_and_last_carries_finish() -> None:
    data = stream_bytes(COMPLETIONS["several_calls"])
    client = make_client(streaming_transport([data], "text/event-stream"))
    responses = list(client.models.generate_content_stream(model="gem-test", contents="hi"))
    assert [len(parts_of(r)) for r in responses] == [1, 1, 1, 1, 0]
    assert [candidate(r).finish_reason for r in responses[:-1]] == [None] * 4
    assert [r.usage_metadata for r in responses[:-1]] == [None] * 4
    assert candidate(responses[-1]).finish_reason == types.FinishReason.STOP


# --------------------------------------------------------------------------------------------------- JSON array


def incremental_array_objects(chunks: list[bytes]) -> Iterator[dict[str, Any]]:
    """A streaming reader of the JSON-array stream: yields each element as soon as its bytes are complete."""
    decoder, text, pos, pending = json.JSONDecoder(), "", 0, b""
    opened = closed = False
    for chunk in chunks:
        pending += chunk
        try:
            text += pending.decode("utf-8")
            pending = b""
        except UnicodeDecodeError:
            continue  # mid-UTF-8: wait for the rest of the character
        while True:
            while pos < len(text) and text[pos] in " \r\n\t,":
                pos += 1
            if pos == len(text):
                break
            if not opened:
                assert text[pos] == "["
                opened, pos = True, pos + 1
                continue
            if text[pos] == "]":
                closed, pos = True, pos + 1
                continue
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # incomplete element
            pos = end
            yield obj
    assert opened and closed and pos == len(text) and not pending


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_json_array_stream_is_one_document_and_parses_incrementally(name: str) -> None:
    completion = COMPLETIONS[name]
    data = stream_bytes(completion, ARRAY_ROUTE)
    whole = json.loads(data)
    sse_objects = [json.loads(line[6:]) for line in stream_bytes(completion).decode().split("\n") if line]
    assert whole == sse_objects  # same objects, two framings
    for how, chunks in chunkings(data):
        assert list(incremental_array_objects(chunks)) == whole, how
    responses = [types.GenerateContentResponse.model_validate(o) for o in whole]
    assert seen_from(responses) == expected(completion)


def test_json_array_emits_each_object_as_soon_as_it_exists() -> None:
    encoder = GeminiStreamEncoder(sse=False)
    assert encoder.content_type.startswith("application/json")
    assert encoder.feed(StreamStart("r", "m", 0, 3)) == b"["
    first = encoder.feed(TextDelta("a"))
    assert first.startswith(b"{") and json.loads(first)["candidates"][0]["content"]["parts"] == [{"text": "a"}]
    assert encoder.feed(TextDelta("b")).startswith(b",\r\n{")
    last = encoder.feed(Finish("stop", Usage(3, 2)))
    assert last.startswith(b",\r\n{") and last.endswith(b"}]")


@st.composite
def completions(draw: st.DrawFn) -> Completion:
    text = st.text(max_size=30)
    calls = st.lists(
        st.builds(ToolCall, st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=8), st.just('{"k":[1,"ü"]}')),
        max_size=3,
    )
    usage = st.builds(Usage, st.integers(0, 9999), st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99))
    reason = st.sampled_from(list(typing.get_args(FinishReason)))
    return Completion(draw(text), draw(text), draw(text), draw(text), tuple(draw(calls)), draw(reason), draw(usage))


def _merged_parts(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for obj in objects:
        for part in obj["candidates"][0]["content"]["parts"]:
            if parts and set(part) <= {"text", "thought"} and set(parts[-1]) <= {"text", "thought"}:
                if parts[-1].get("thought") == part.get("thought"):
                    parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
                    continue
            parts.append(part)
    return parts


@settings(max_examples=60, deadline=None)
@given(completions())
def test_any_stream_folds_into_the_body(completion: Completion) -> None:
    body = DIALECT.render_completion(completion)
    objects = json.loads(stream_bytes(completion, ARRAY_ROUTE))
    assert objects == [json.loads(line[6:]) for line in stream_bytes(completion).decode().split("\n") if line]
    assert _merged_parts(objects) == body["candidates"][0]["content"]["parts"]
    last = objects[-1]
    assert last["candidates"][0]["finishReason"] == body["candidates"][0]["finishReason"]
    assert last["usageMetadata"] == body["usageMetadata"]
    assert all("finishReason" not in o["candidates"][0] and "usageMetadata" not in o for o in objects[:-1])


# --------------------------------------------------------------------------------------------------- encoder


def feed_all(encoder: StreamEncoder, events: list[StreamEvent]) -> list[bytes]:
    return [encoder.feed(e) for e in events]


def test_text_and_thoughts_are_sent_at_once_tool_calls_when_ended() -> None:
    encoder = GeminiStreamEncoder(sse=True)
    assert encoder.content_type == "text/event-stream"
    out = feed_all(
        encoder,
        [
            StreamStart("r", "m", 0, 4),
            ReasoningDelta("hm"),
            TextDelta("x"),
            TextDelta(""),
            ToolCallStarted(0, "c0", "edit"),
            ToolCallDelta(0, '{"pa'),
            ToolCallDelta(0, 'th":"a"}'),
            ToolCallEnded(0),
        ],
    )
    assert out[0] == b"" and out[3] == b"" and out[4:7] == [b"", b"", b""]
    parts = [json.loads(b[6:])["candidates"][0]["content"]["parts"] for b in (out[1], out[2], out[7])]
    assert parts == [
        [{"text": "hm", "thought": True}],
        [{"text": "x"}],
        [{"functionCall": {"id": "c0", "name": "edit", "args": {"path": "a"}}}],
    ]
    assert all(b.endswith(b"\n\n") for b in out if b)


def test_state_accumulates_merged_parts_for_the_body() -> None:
    events: list[StreamEvent] = [StreamStart("r", "m", 0), ReasoningDelta("a"), ReasoningDelta("b"), TextDelta("c")]
    events += [TextDelta("d"), Finish("stop", Usage(1, 4))]
    state = StreamState()
    for e in events:
        state, _ = step(state, e)
    assert state.parts == ({"text": "ab", "thought": True}, {"text": "cd"})
    assert state.phase == "finished" and state.finish == "stop"


def test_open_tool_call_is_flushed_by_finish() -> None:
    encoder = GeminiStreamEncoder(sse=True)
    out = feed_all(encoder, [StreamStart("r", "m", 0), ToolCallStarted(0, "c", "f"), ToolCallDelta(0, '{"a":1}')])
    assert out == [b"", b"", b""]
    last = json.loads(encoder.feed(Finish("length", Usage(1, 9)))[6:])
    candidate = last["candidates"][0]
    assert candidate["content"]["parts"] == [{"functionCall": {"id": "c", "name": "f", "args": {"a": 1}}}]
    assert candidate["finishReason"] == "MAX_TOKENS"


def test_malformed_arguments_reach_the_harness_as_raw_text() -> None:
    completion = Completion("r", "m", tool_calls=(ToolCall("c", "f", '{"a": tru'),), finish_reason="tool_calls")
    call = DIALECT.render_completion(completion)["candidates"][0]["content"]["parts"][0]["functionCall"]
    assert call == {"id": "c", "name": "f", "args": {"_raw_arguments": '{"a": tru'}}


@pytest.mark.parametrize(
    "events",
    [
        [TextDelta("x")],
        [StreamStart("r", "m", 0), StreamStart("r", "m", 0)],
        [StreamStart("r", "m", 0), ToolCallDelta(0, "{}")],
        [StreamStart("r", "m", 0), ToolCallEnded(0)],
        [StreamStart("r", "m", 0), ToolCallStarted(0, "a", "f"), ToolCallStarted(0, "b", "g")],
        [StreamStart("r", "m", 0), Finish("stop", Usage()), TextDelta("late")],
    ],
)
def test_impossible_event_orders_raise(events: list[StreamEvent]) -> None:
    encoder = GeminiStreamEncoder()
    with pytest.raises(ValueError):
        feed_all(encoder, events)


def test_usage_metadata_separates_thoughts_from_candidates() -> None:
    assert usage_metadata(Usage(100, 40, 30, 25)) == {
        "promptTokenCount": 100,
        "candidatesTokenCount": 15,
        "totalTokenCount": 140,
        "cachedContentTokenCount": 30,
        "thoughtsTokenCount": 25,
    }


@pytest.mark.parametrize(
    ("reason", "wire"),
    [("stop", "STOP"), ("length", "MAX_TOKENS"), ("tool_calls", "STOP"), ("content_filter", "SAFETY"),
     ("error", "OTHER")],
)  # fmt: skip
def test_finish_reasons(reason: Any, wire: str) -> None:
    body = DIALECT.render_completion(Completion("r", "m", text="t", finish_reason=reason))
    assert body["candidates"][0]["finishReason"] == wire


def test_body_is_the_folded_stream_state() -> None:
    completion = COMPLETIONS["several_calls"]
    state = final_state(completion)
    body = DIALECT.render_completion(completion)
    assert body["candidates"][0]["content"]["parts"] == list(state.parts)
    assert body["usageMetadata"] == usage_metadata(completion.usage)
    assert (body["responseId"], body["modelVersion"]) == ("resp-calls", "gem-test")


# --------------------------------------------------------------------------------------------------- errors

ERROR_CASES: list[tuple[ErrorKind, int, str, type[errors.APIError]]] = [
    ("invalid_request", 400, "INVALID_ARGUMENT", errors.ClientError),
    ("context_length", 400, "INVALID_ARGUMENT", errors.ClientError),
    ("authentication", 401, "UNAUTHENTICATED", errors.ClientError),
    ("permission", 403, "PERMISSION_DENIED", errors.ClientError),
    ("not_found", 404, "NOT_FOUND", errors.ClientError),
    ("too_large", 413, "INVALID_ARGUMENT", errors.ClientError),
    ("rate_limited", 429, "RESOURCE_EXHAUSTED", errors.ClientError),
    ("internal", 500, "INTERNAL", errors.ServerError),
    ("unavailable", 503, "UNAVAILABLE", errors.ServerError),
    ("overloaded", 503, "UNAVAILABLE", errors.ServerError),
    ("timeout", 504, "DEADLINE_EXCEEDED", errors.ServerError),
]


def _raises(call: Callable[[], object], cls: type[errors.APIError]) -> errors.APIError:
    with pytest.raises(cls) as info:
        call()
    return info.value


@pytest.mark.parametrize(("kind", "status", "name", "cls"), ERROR_CASES)
def test_sdk_raises_for_error_bodies(kind: ErrorKind, status: int, name: str, cls: type[errors.APIError]) -> None:
    wire = DIALECT.render_error(ConversionError(kind, "it went wrong", retry_after=2.2))
    assert wire.status == status
    assert ("retry-after" in wire.headers) == (status in (429, 503))
    client = make_client(streaming_transport([wire.body], wire.headers["content-type"], status, dict(wire.headers)))
    err = _raises(lambda: client.models.generate_content(model="m", contents="hi"), cls)
    assert (err.code, err.status) == (status, name)
    assert err.message is not None and "it went wrong" in err.message


def test_retry_info_and_field_violations() -> None:
    wire = DIALECT.render_error(ConversionError("rate_limited", "slow", retry_after=2.2))
    assert wire.headers["retry-after"] == "3"
    details = json.loads(wire.body)["error"]["details"]
    assert details == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}]
    bad = json.loads(DIALECT.render_error(ConversionError("invalid_request", "no", param="contents")).body)
    assert bad["error"]["details"][0]["fieldViolations"] == [{"field": "contents", "description": "no"}]
    ctx = json.loads(DIALECT.render_error(ConversionError("context_length", "prompt is 9000 tokens")).body)
    assert ctx["error"]["message"].startswith("The input token count exceeds the maximum number of tokens")


def _consume(client: genai.Client, received: list[str | None]) -> None:
    for r in client.models.generate_content_stream(model="m", contents="hi"):
        received.append(r.text)


@pytest.mark.parametrize(("kind", "status", "name", "cls"), [ERROR_CASES[0], ERROR_CASES[8]])
def test_sdk_stream_raises_on_in_stream_error(
    kind: ErrorKind, status: int, name: str, cls: type[errors.APIError]
) -> None:
    encoder = DIALECT.stream_encoder(SSE_ROUTE)
    data = b"".join(feed_all(encoder, [StreamStart("r", "m", 0), TextDelta("partial ü")]))
    data += encoder.error(ConversionError(kind, "engine failed"))
    assert encoder.error(ConversionError(kind, "again")) == b""  # the stream has ended
    for how, chunks in chunkings(data):
        client = make_client(streaming_transport(chunks, "text/event-stream"))
        received: list[str | None] = []
        err = _raises(partial(_consume, client, received), cls)
        assert (err.code, err.status, received) == (status, name, ["partial ü"]), how


@pytest.mark.parametrize("started", [False, True])
def test_json_array_error_keeps_the_document_well_formed(started: bool) -> None:
    encoder = GeminiStreamEncoder(sse=False)
    data = b"".join(feed_all(encoder, [StreamStart("r", "m", 0), TextDelta("a")])) if started else b""
    data += encoder.error(ConversionError("unavailable", "gone"))
    objects = json.loads(data)
    assert objects[-1]["error"] == {
        "code": 503,
        "message": "gone",
        "status": "UNAVAILABLE",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}],
    }
    assert len(objects) == (2 if started else 1)
    with pytest.raises(ValueError):
        encoder.feed(TextDelta("after the error"))

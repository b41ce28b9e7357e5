"""Anthropic responses judged by the official ``anthropic`` SDK: bodies, streams, errors, the encoder's order rules.

The SDK (2.16) talks through ``httpx2``, so the transport here is an ``httpx2.MockTransport`` delivering the
body in the chunks ``tests.streaming.chunkings`` produces (whole, bytewise, mid-UTF-8, random).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import anthropic
import httpx2
import pytest

from converters import dialect_for
from converters.anthropic_stream import AnthropicStreamEncoder, message_json, render_message, thinking_signature
from converters.base import Route
from converters.canonical import (
    Completion,
    ConversionError,
    ErrorKind,
    Finish,
    ReasoningDelta,
    StreamStart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
    completion_events,
)
from tests.streaming import chunkings

DIALECT = dialect_for("anthropic")
ROUTE = Route("anthropic", "/v1/messages")
ASK: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}

COMPLETIONS = {
    "text": Completion("msg_text", "m", text="Hello, wörld ✓ 🚀", usage=Usage(12, 7)),
    "reasoning+text": Completion(
        "msg_think", "m", text="Answer: 4", reasoning="2+2 … is 4", usage=Usage(30, 9, reasoning_tokens=5)
    ),
    "one tool": Completion(
        "msg_tool",
        "m",
        tool_calls=(ToolCall("toolu_01", "Bash", '{"command":"ls -la","description":"lïst"}'),),
        finish_reason="tool_calls",
        usage=Usage(100, 20, cached_tokens=64),
    ),
    "several tools": Completion(
        "msg_tools",
        "m",
        text="Running both.",
        reasoning="need two",
        tool_calls=(
            ToolCall("toolu_a", "Read", '{"file_path":"/tmp/ä.txt"}'),
            ToolCall("toolu_b", "Grep", '{"pattern":"x","opts":{"n":true,"k":[1,2]}}'),
            ToolCall("toolu_c", "TodoList", ""),
        ),
        finish_reason="tool_calls",
        usage=Usage(50, 30),
    ),
    "length": Completion("msg_len", "m", text="cut", finish_reason="length", usage=Usage(5, 64)),
}


def transport(chunks: Sequence[bytes], content_type: str, status: int = 200, headers: dict[str, str] | None = None):
    class Body(httpx2.SyncByteStream, httpx2.AsyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield from chunks

        async def __aiter__(self):  # type: ignore[override]
            for c in chunks:
                yield c

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"content-type": content_type, **(headers or {})}, stream=Body())

    return httpx2.MockTransport(handler)


def client(chunks: Sequence[bytes], content_type: str = "text/event-stream", **kw: Any) -> anthropic.Anthropic:
    http = httpx2.Client(transport=transport(chunks, content_type, **kw))
    return anthropic.Anthropic(api_key="k", base_url="http://proxy.test", http_client=http, max_retries=0)


def stream_bytes(completion: Completion) -> bytes:
    encoder = DIALECT.stream_encoder(ROUTE)
    return b"".join(encoder.feed(e) for e in completion_events(completion))


def body_bytes(completion: Completion) -> bytes:
    return json.dumps(DIALECT.render_completion(completion)).encode()


def comparable(message: Any) -> dict[str, Any]:
    """The SDK message as a dict, minus the stream helper's parse-only extras."""
    out = message.to_dict()
    for block in out["content"]:
        block.pop("parsed_output", None)
    return out


# ----------------------------------------------------------------------------------------------- bodies


@pytest.mark.parametrize("name", COMPLETIONS)
def test_sdk_parses_the_non_streaming_body(name: str) -> None:
    completion = COMPLETIONS[name]
    message = client([body_bytes(completion)], "application/json").messages.create(**ASK)
    assert message.id == completion.id and message.model == "m" and message.role == "assistant"
    thinking = [b for b in message.content if b.type == "thinking"]
    assert [b.thinking for b in thinking] == ([completion.reasoning] if completion.reasoning else [])
    assert all(b.signature == thinking_signature(b.thinking) for b in thinking)
    assert "".join(b.text for b in message.content if b.type == "text") == completion.text
    calls = [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]
    assert calls == [(c.id, c.name, json.loads(c.arguments or "{}")) for c in completion.tool_calls]
    expected_stop = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
    assert message.stop_reason == expected_stop[completion.finish_reason]
    usage = completion.usage
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == usage.prompt_tokens
    assert message.usage.cache_read_input_tokens == usage.cached_tokens
    assert message.usage.output_tokens == usage.completion_tokens
    if usage.reasoning_tokens:
        assert message.usage.output_tokens_details.thinking_tokens == usage.reasoning_tokens


def test_block_order_is_reasoning_text_tools() -> None:
    body = render_message(COMPLETIONS["several tools"])
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "tool_use", "tool_use"]
    assert body["content"][4]["input"] == {}  # a call with no arguments is an empty object, not a string


def test_tool_arguments_that_are_not_an_object_are_an_engine_error() -> None:
    for bad in ('{"a":', "[1,2]"):
        bad_call = Completion("m1", "m", tool_calls=(ToolCall("t", "f", bad),), finish_reason="tool_calls")
        with pytest.raises(ConversionError) as info:
            DIALECT.render_completion(bad_call)
        assert info.value.status == 500


# ----------------------------------------------------------------------------------------------- streams


@pytest.mark.parametrize("name", COMPLETIONS)
def test_stream_helper_final_message_equals_the_body_at_odd_boundaries(name: str) -> None:
    completion = COMPLETIONS[name]
    expected = comparable(client([body_bytes(completion)], "application/json").messages.create(**ASK))
    data = stream_bytes(completion)
    for how, chunks in chunkings(data):
        with client(chunks).messages.stream(**ASK) as stream:
            final = stream.get_final_message()
        assert comparable(final) == expected, how
        with client(chunks).beta.messages.stream(**ASK) as beta_stream:
            beta_final = beta_stream.get_final_message()
        assert comparable(beta_final)["content"] == expected["content"], how


@pytest.mark.parametrize("name", ["reasoning+text", "several tools"])
def test_raw_sdk_stream_follows_the_event_grammar(name: str) -> None:
    events = list(client(stream_bytes(COMPLETIONS[name]).splitlines(keepends=True)).messages.create(**ASK, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    open_index = None
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert open_index is None
            open_index = e.index
        elif e.type == "content_block_delta":
            assert e.index == open_index
        else:
            assert e.type == "content_block_stop" and e.index == open_index
            open_index = None
    signatures = [e.delta for e in events if e.type == "content_block_delta" and e.delta.type == "signature_delta"]
    assert [s.signature for s in signatures] == [thinking_signature(COMPLETIONS[name].reasoning)]


def test_async_stream_helper_matches_too() -> None:
    completion = COMPLETIONS["several tools"]
    expected = DIALECT.render_completion(completion)

    async def run() -> Any:
        http = httpx2.AsyncClient(
            transport=transport(list(chunkings(stream_bytes(completion)))[1][1], "text/event-stream")
        )
        sdk = anthropic.AsyncAnthropic(api_key="k", base_url="http://proxy.test", http_client=http, max_retries=0)
        async with sdk.messages.stream(**ASK) as stream:
            return await stream.get_final_message()

    final = asyncio.run(run())
    assert [b.type for b in final.content] == [b["type"] for b in expected["content"]]
    assert final.content[3].input == {"pattern": "x", "opts": {"n": True, "k": [1, 2]}}


def test_each_event_is_emitted_as_soon_as_it_is_fed() -> None:
    enc = AnthropicStreamEncoder()
    assert enc.feed(StreamStart("msg_1", "m", 0, prompt_tokens=3)).startswith(b"event: message_start\n")
    assert enc.feed(TextDelta("")) == b""  # nothing to say yet: no empty block is opened
    first = enc.feed(TextDelta("He"))
    assert first.count(b"event: content_block_start") == 1 and b'"text":"He"' in first
    assert enc.feed(TextDelta("llo")).count(b"event: content_block_delta") == 1
    switch = enc.feed(ReasoningDelta("hm"))  # a new kind closes the text block and opens a thinking block
    assert switch.index(b"content_block_stop") < switch.index(b"content_block_start") < switch.index(b"hm")
    tool = enc.feed(ToolCallStarted(0, "toolu_1", "Bash"))
    assert b"signature_delta" in tool and b'"name":"Bash"' in tool
    assert b"input_json_delta" in enc.feed(ToolCallDelta(0, '{"a":'))
    assert enc.feed(ToolCallEnded(0)) == b'event: content_block_stop\ndata: {"type":"content_block_stop","index":2}\n\n'
    end = enc.feed(Finish("tool_calls", Usage(3, 4)))
    assert end.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n') and b'"tool_use"' in end


def test_impossible_event_orders_raise() -> None:
    with pytest.raises(ValueError):
        AnthropicStreamEncoder().feed(TextDelta("x"))
    enc = AnthropicStreamEncoder()
    enc.feed(StreamStart("m1", "m", 0))
    with pytest.raises(ValueError):
        enc.feed(StreamStart("m1", "m", 0))
    enc.feed(ToolCallStarted(0, "a", "f"))
    enc.feed(ToolCallStarted(1, "b", "g"))
    with pytest.raises(ValueError):  # interleaved arguments cannot be expressed block by block
        enc.feed(ToolCallDelta(0, "{}"))
    enc.feed(Finish("tool_calls", Usage()))
    with pytest.raises(ValueError):
        enc.feed(TextDelta("late"))


# ----------------------------------------------------------------------------------------------- errors

ERROR_CASES: list[tuple[ErrorKind, int, type[anthropic.APIStatusError], str]] = [
    ("invalid_request", 400, anthropic.BadRequestError, "invalid_request_error"),
    ("authentication", 401, anthropic.AuthenticationError, "authentication_error"),
    ("permission", 403, anthropic.PermissionDeniedError, "permission_error"),
    ("not_found", 404, anthropic.NotFoundError, "not_found_error"),
    ("too_large", 413, anthropic.ContentTooLargeError, "request_too_large"),
    ("rate_limited", 429, anthropic.RateLimitError, "rate_limit_error"),
    ("internal", 500, anthropic.InternalServerError, "api_error"),
    ("unavailable", 503, anthropic.InternalServerError, "api_error"),
    ("overloaded", 529, anthropic.OverloadedError, "overloaded_error"),
    ("timeout", 504, anthropic.InternalServerError, "timeout_error"),
]


@pytest.mark.parametrize(("kind", "status", "exc", "wire_type"), ERROR_CASES)
def test_sdk_raises_its_own_exception_for_each_error(
    kind: ErrorKind, status: int, exc: type[anthropic.APIStatusError], wire_type: str
) -> None:
    err = ConversionError(kind, f"it went wrong ({kind})", retry_after=1.2 if status in (429, 529) else None)
    wire = DIALECT.render_error(err)
    assert wire.status == status
    sdk = client([wire.body], "application/json", status=wire.status, headers=dict(wire.headers))
    with pytest.raises(exc) as info:
        sdk.messages.create(**ASK)
    assert info.value.status_code == status
    assert info.value.body == {"type": "error", "error": {"type": wire_type, "message": f"it went wrong ({kind})"}}
    # retryable kinds always carry a delay (1 s unless the error gives one), the others none (one rule, all formats)
    expected = {429: "2", 529: "2", 503: "1"}.get(status)
    assert info.value.response.headers.get("retry-after") == expected


def test_context_length_uses_anthropic_wording() -> None:
    err = ConversionError("context_length", "prompt has 9000 tokens; the model allows 8192")
    wire = DIALECT.render_error(err)
    body = json.loads(wire.body)
    assert wire.status == 400
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 9000 tokens > 8192 maximum",
    }
    no_numbers = json.loads(DIALECT.render_error(ConversionError("context_length", "too long")).body)
    assert no_numbers["error"]["message"] == "prompt is too long: too long"


def test_in_stream_error_makes_the_sdk_raise_and_ends_the_stream() -> None:
    enc = DIALECT.stream_encoder(ROUTE)
    data = enc.feed(StreamStart("m1", "m", 0, 5)) + enc.feed(TextDelta("partial ü"))
    data += enc.error(ConversionError("overloaded", "engine is overloaded", retry_after=3))
    assert data.endswith(b"\n\n") and b"event: error\n" in data
    with pytest.raises(ValueError):
        enc.feed(TextDelta("more"))
    for how, chunks in chunkings(data):
        seen: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as info:
            for event in client(chunks).messages.create(**ASK, stream=True):
                seen.append(event.type)
        assert seen == ["message_start", "content_block_start", "content_block_delta"], how
        assert info.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "engine is overloaded"},
        }


def test_long_streams_cost_linear_time() -> None:
    """100k deltas: linear accumulation takes about a second; re-concatenating the text each time takes minutes."""
    enc = AnthropicStreamEncoder()
    began = time.perf_counter()
    enc.feed(StreamStart("msg_long", "m", 0, 1))
    for _ in range(50_000):
        enc.feed(ReasoningDelta("tok "))
    switch = b""
    for i in range(50_000):
        out = enc.feed(TextDelta("tök "))
        switch = out if i == 0 else switch
    enc.feed(TextDelta("end"))
    enc.feed(Finish("stop", Usage(1, 100_000)))
    assert time.perf_counter() - began < 8
    assert enc.state is not None and thinking_signature("tok " * 50_000).encode() in switch
    assert message_json(enc.state)["content"][1]["text"] == "tök " * 50_000 + "end"

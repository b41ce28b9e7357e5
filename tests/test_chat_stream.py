"""Chat Completions responses, judged by the official ``openai`` SDK.

Every completion (text, reasoning + text, one tool call, several tool calls) is rendered as a non-streaming
body and as a stream; the SDK must parse both, with the stream fed at odd byte boundaries, and its stream
helper's final completion must equal the non-streaming result. Errors must surface as the SDK's own exception
classes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from converters import chat, dialect_for
from converters.base import Route
from converters.canonical import (
    Completion,
    ConversionError,
    ErrorKind,
    Finish,
    ModelRequest,
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
from converters.chat_stream import ChatStreamEncoder
from tests.streaming import chunkings, streaming_transport

DIALECT = chat.DIALECT  # typed as ChatDialect: its stream_encoder takes the request
ROUTE = Route("chat", "/v1/chat/completions")
MESSAGES: list[Any] = [{"role": "user", "content": "list files"}]
USAGE = Usage(prompt_tokens=31, completion_tokens=17, cached_tokens=8, reasoning_tokens=5)

COMPLETIONS = {
    "text": Completion("chatcmpl-text", "fake-model", text="Hello, wörld ✓ 你好", usage=USAGE, created=1700000000),
    "reasoning": Completion(
        "chatcmpl-reason",
        "fake-model",
        text="It is 4.",
        reasoning="2+2… is 4 🤔",
        usage=USAGE,
        created=1700000001,
    ),
    "one_tool": Completion(
        "chatcmpl-tool",
        "fake-model",
        text="Let me look.",
        tool_calls=(ToolCall("call_a1", "bash", '{"command": "ls -la ~/données"}'),),
        finish_reason="tool_calls",
        usage=USAGE,
        created=1700000002,
    ),
    "several_tools": Completion(
        "chatcmpl-tools",
        "fake-model",
        reasoning="two reads",
        tool_calls=(
            ToolCall("call_b1", "read_file", '{"path": "a.py"}'),
            ToolCall("call_b2", "read_file", '{"path": "ü.py"}'),
            ToolCall("call_b3", "noop", ""),
        ),
        finish_reason="tool_calls",
        usage=USAGE,
        created=1700000003,
    ),
}


def client(chunks: list[bytes], content_type: str, status: int = 200, headers: dict[str, str] | None = None):
    transport = streaming_transport(chunks, content_type, status, headers)
    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://proxy.test/v1",
        max_retries=0,
        # The SDK is typed for its vendored httpx2 but accepts an httpx client, which MockTransport needs.
        http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]
    )


def stream_bytes(completion: Completion, include_usage: bool = True) -> bytes:
    request = ModelRequest("chat", completion.model, (), stream=True, include_usage=include_usage)
    encoder = DIALECT.stream_encoder(ROUTE, request)
    return b"".join(encoder.feed(e) for e in completion_events(completion))


def body_bytes(completion: Completion) -> bytes:
    return json.dumps(DIALECT.render_completion(completion)).encode()


def normalized(completion: Any) -> dict[str, Any]:
    """The SDK object as a dict, minus what only the stream helper adds (tool call ``index``, ``parsed``)."""
    data = completion.model_dump(exclude_none=True)
    for choice in data["choices"]:
        for call in choice["message"].get("tool_calls", []):
            call.pop("index", None)
            call.get("function", {}).pop("parsed_arguments", None)
        choice["message"].pop("parsed", None)
    return data


def expected_message(c: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    if c.text:
        message["content"] = c.text
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    if c.tool_calls:
        message["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in c.tool_calls
        ]
    return message


# ---------------------------------------------------------------------------------------------- non-streaming


@pytest.mark.parametrize("name", COMPLETIONS)
def test_sdk_parses_body(name: str) -> None:
    c = COMPLETIONS[name]
    result = client([body_bytes(c)], "application/json").chat.completions.create(model=c.model, messages=MESSAGES)
    assert result.id == c.id and result.model == c.model and result.created == c.created
    assert result.object == "chat.completion"
    choice = result.choices[0]
    assert choice.finish_reason == c.finish_reason
    assert choice.message.content == (c.text or None)
    assert getattr(choice.message, "reasoning_content", None) == (c.reasoning or None)
    assert [(t.id, t.function.name, t.function.arguments) for t in choice.message.tool_calls or []] == [
        (t.id, t.name, t.arguments) for t in c.tool_calls
    ]
    assert normalized(result)["choices"][0]["message"] == expected_message(c)
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (
        31,
        17,
        48,
    )
    assert result.usage.prompt_tokens_details and result.usage.prompt_tokens_details.cached_tokens == 8
    assert result.usage.completion_tokens_details and result.usage.completion_tokens_details.reasoning_tokens == 5


def test_custom_tool_call_in_body() -> None:
    c = Completion("chatcmpl-c", "m", tool_calls=(ToolCall("call_c", "exec", "print('hi')\n", "custom"),))
    result = client([body_bytes(c)], "application/json").chat.completions.create(model="m", messages=MESSAGES)
    call = (result.choices[0].message.tool_calls or [])[0]
    assert isinstance(call, openai.types.chat.ChatCompletionMessageCustomToolCall)
    assert (call.id, call.custom.name, call.custom.input) == ("call_c", "exec", "print('hi')\n")


def test_error_finish_reason_renders_as_stop() -> None:
    body = DIALECT.render_completion(Completion("x", "m", text="partial", finish_reason="error"))
    assert body["choices"][0]["finish_reason"] == "stop"


# -------------------------------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("name", COMPLETIONS)
def test_stream_helper_equals_body(name: str) -> None:
    c = COMPLETIONS[name]
    expected = normalized(
        client([body_bytes(c)], "application/json").chat.completions.create(model="m", messages=MESSAGES)
    )
    data = stream_bytes(c)
    for how, chunks in chunkings(data):
        with client(chunks, "text/event-stream").chat.completions.stream(model="m", messages=MESSAGES) as stream:
            deltas = [e.delta for e in stream if e.type == "content.delta"]
            final = stream.get_final_completion()
        assert normalized(final) == expected, how
        assert "".join(deltas) == c.text, how


@pytest.mark.parametrize("name", COMPLETIONS)
def test_raw_stream_chunks(name: str) -> None:
    c = COMPLETIONS[name]
    for how, chunks in chunkings(stream_bytes(c)):
        sdk = client(chunks, "text/event-stream")
        items = list(sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        assert items[0].choices[0].delta.role == "assistant", how
        assert all(i.object == "chat.completion.chunk" and i.id == c.id for i in items)
        text = "".join(i.choices[0].delta.content or "" for i in items if i.choices)
        reasoning = "".join(getattr(i.choices[0].delta, "reasoning_content", None) or "" for i in items if i.choices)
        assert (text, reasoning) == (c.text, c.reasoning), how
        finishes = [i.choices[0].finish_reason for i in items if i.choices and i.choices[0].finish_reason]
        assert finishes == [c.finish_reason]
        assert items[-1].choices == [] and items[-1].usage and items[-1].usage.total_tokens == 48


def test_stream_without_include_usage_has_no_usage_chunk() -> None:
    data = stream_bytes(COMPLETIONS["one_tool"], include_usage=False)
    assert data.endswith(b"data: [DONE]\n\n")
    for how, chunks in chunkings(data):
        items = list(
            client(chunks, "text/event-stream").chat.completions.create(model="m", messages=MESSAGES, stream=True)
        )
        assert all(i.choices for i in items) and all(i.usage is None for i in items), how
    assert ChatStreamEncoder().include_usage is False  # the default when no request is at hand


def test_tool_call_deltas_carry_id_and_name_first_then_arguments() -> None:
    encoder = DIALECT.stream_encoder(ROUTE)
    encoder.feed(StreamStart("chatcmpl-1", "m", 1))
    head = encoder.feed(ToolCallStarted(0, "call_1", "bash"))
    pieces = [encoder.feed(ToolCallDelta(0, p)) for p in ('{"comm', 'and": "l', 's"}')]
    assert json.loads(head[len(b"data: ") :])["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": ""}}
    ]
    args = [json.loads(p[len(b"data: ") :])["choices"][0]["delta"]["tool_calls"][0] for p in pieces]
    assert args == [{"index": 0, "function": {"arguments": a}} for a in ('{"comm', 'and": "l', 's"}')]
    assert encoder.feed(ToolCallEnded(0)) == b""


def test_each_event_is_emitted_as_soon_as_fed() -> None:
    """Real incremental streaming: the bytes for an event come back from that event's feed, not at the end."""
    encoder = DIALECT.stream_encoder(ROUTE)
    assert b'"role":"assistant"' in encoder.feed(StreamStart("chatcmpl-1", "m", 1))
    assert b'"reasoning_content":"hm"' in encoder.feed(ReasoningDelta("hm"))
    assert b'"content":"Hel"' in encoder.feed(TextDelta("Hel"))
    assert b'"content":"lo"' in encoder.feed(TextDelta("lo"))
    assert encoder.feed(TextDelta("")) == b""
    last = encoder.feed(Finish("stop", USAGE))
    assert b'"finish_reason":"stop"' in last and last.endswith(b"data: [DONE]\n\n")


def test_custom_tool_call_streams() -> None:
    """The SDK's stream helper cannot accumulate custom calls, so read the raw chunks it yields."""
    c = Completion("chatcmpl-c", "m", tool_calls=(ToolCall("call_c", "exec", "print('é')", "custom"),))
    for how, chunks in chunkings(stream_bytes(c)):
        sdk = client(chunks, "text/event-stream")
        items = list(sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True))
        calls = [t for i in items if i.choices for t in i.choices[0].delta.tool_calls or []]
        assert calls[0].type == "custom" and calls[0].id == "call_c", how
        assert calls[0].model_extra and calls[0].model_extra["custom"]["name"] == "exec"
        assert "".join(t.model_extra["custom"]["input"] for t in calls if t.model_extra) == "print('é')"


@pytest.mark.parametrize(
    "events",
    [
        [TextDelta("x")],
        [StreamStart("a", "m", 0), StreamStart("a", "m", 0)],
        [StreamStart("a", "m", 0), ToolCallDelta(0, "{}")],
        [StreamStart("a", "m", 0), ToolCallStarted(1, "c", "f")],
        [StreamStart("a", "m", 0), ToolCallStarted(0, "c", "f"), ToolCallEnded(0), ToolCallDelta(0, "x")],
        [StreamStart("a", "m", 0), Finish("stop", Usage()), TextDelta("late")],
    ],
)
def test_impossible_event_order_raises(events: list[Any]) -> None:
    encoder = DIALECT.stream_encoder(ROUTE)
    with pytest.raises(ValueError):
        for e in events:
            encoder.feed(e)


async def test_async_stream_helper() -> None:
    c = COMPLETIONS["several_tools"]
    transport = streaming_transport(list(dict(chunkings(stream_bytes(c)))["mid-utf8"]), "text/event-stream")
    sdk = openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://proxy.test/v1",
        http_client=httpx.AsyncClient(transport=transport),  # type: ignore[arg-type]
    )
    async with sdk.chat.completions.stream(model="m", messages=MESSAGES) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    assert [t.id for t in final.choices[0].message.tool_calls or []] == ["call_b1", "call_b2", "call_b3"]
    assert final.usage is not None and final.usage.completion_tokens == 17


# ----------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kind", "status", "exc"),
    [
        ("invalid_request", 400, openai.BadRequestError),
        ("authentication", 401, openai.AuthenticationError),
        ("permission", 403, openai.PermissionDeniedError),
        ("not_found", 404, openai.NotFoundError),
        ("too_large", 413, openai.APIStatusError),
        ("context_length", 400, openai.BadRequestError),
        ("rate_limited", 429, openai.RateLimitError),
        ("internal", 500, openai.InternalServerError),
        ("unavailable", 503, openai.InternalServerError),
        ("overloaded", 503, openai.InternalServerError),
        ("timeout", 504, openai.InternalServerError),
    ],
)
def test_sdk_raises_its_own_error_class(kind: ErrorKind, status: int, exc: type[openai.APIStatusError]) -> None:
    response = DIALECT.render_error(ConversionError(kind, "something went wrong", param="messages"))
    assert response.status == status
    sdk = client([response.body], "application/json", status, dict(response.headers))
    with pytest.raises(exc) as info:
        sdk.chat.completions.create(model="m", messages=MESSAGES)
    assert info.value.status_code == status
    assert isinstance(info.value.body, dict) and set(info.value.body) == {"message", "type", "param", "code"}
    assert info.value.body["param"] == "messages"


def test_context_length_error_uses_openai_wording_and_code() -> None:
    response = DIALECT.render_error(ConversionError("context_length", "prompt is 9000 tokens, limit 8192"))
    error = json.loads(response.body)["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert "maximum context length" in error["message"] and "9000 tokens" in error["message"]
    already = DIALECT.render_error(ConversionError("context_length", "This model's maximum context length is 8192."))
    assert json.loads(already.body)["error"]["message"] == "This model's maximum context length is 8192."


def test_retryable_errors_carry_retry_after() -> None:
    default = DIALECT.render_error(ConversionError("rate_limited", "slow down"))
    assert default.headers["retry-after"] == "1" and default.headers["retry-after-ms"] == "1000"
    given = DIALECT.render_error(ConversionError("unavailable", "engine down", retry_after=2.5))
    assert given.headers["retry-after"] == "3" and given.headers["retry-after-ms"] == "2500"
    assert "retry-after" not in DIALECT.render_error(ConversionError("invalid_request", "bad")).headers


def test_sdk_retries_after_retry_after() -> None:
    """The SDK honours our retry-after: a 429 then a body gives the body on the second try."""
    error = DIALECT.render_error(ConversionError("rate_limited", "slow down", retry_after=0.01))
    answers = [
        httpx.Response(error.status, headers=dict(error.headers), content=error.body),
        httpx.Response(200, headers={"content-type": "application/json"}, content=body_bytes(COMPLETIONS["text"])),
    ]
    sdk = openai.OpenAI(
        api_key="k",
        base_url="http://proxy.test/v1",
        max_retries=1,
        http_client=httpx.Client(transport=httpx.MockTransport(lambda request: answers.pop(0))),  # type: ignore[arg-type]
    )
    assert sdk.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "Hello, wörld ✓ 你好"


def test_in_stream_error_makes_sdk_raise() -> None:
    encoder = DIALECT.stream_encoder(ROUTE)
    data = encoder.feed(StreamStart("chatcmpl-e", "m", 1)) + encoder.feed(TextDelta("par"))
    data += encoder.error(ConversionError("internal", "engine crashed"))
    assert data.endswith(
        b'data: {"error":{"message":"engine crashed","type":"server_error","param":null,"code":null}}\n\n'
    )
    for _how, chunks in chunkings(data):
        with pytest.raises(openai.APIError, match="engine crashed"):
            with client(chunks, "text/event-stream").chat.completions.stream(model="m", messages=MESSAGES) as s:
                for _ in s:
                    pass
    with pytest.raises(ValueError):
        encoder.feed(TextDelta("after the error"))


def test_registered_dialect() -> None:
    assert dialect_for("chat") is DIALECT
    assert DIALECT.stream_encoder(ROUTE).content_type.startswith("text/event-stream")

"""Tests for converters.responses_stream, judged by the official ``openai`` SDK.

Every completion is rendered twice, as the non-streaming body and as the SSE stream, and the SDK must parse both:
``responses.create`` (plain and ``stream=True``) and the ``responses.stream`` helper, whose
``get_final_response()`` must equal the non-streaming result. Streams are fed at odd byte boundaries
(``chunkings``). Errors must raise the SDK's own exception classes, in-stream errors must surface as errors.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from converters import dialect_for
from converters.base import Route
from converters.canonical import (
    ERROR_STATUS,
    Completion,
    ConversionError,
    ErrorKind,
    Finish,
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
from converters.responses_stream import ResponsesStreamEncoder, render_error, render_response
from tests.streaming import chunkings, streaming_transport

ROUTE = Route("responses", "/v1/responses")
USAGE = Usage(prompt_tokens=120, completion_tokens=37, cached_tokens=64, reasoning_tokens=11)

COMPLETIONS = {
    "text": Completion(id="c1", model="m", text="Hello, wörld — ✓ done.", usage=USAGE, created=1700000000),
    "reasoning+text": Completion(
        id="resp_c2", model="m", reasoning="Let me think… über", text="The answer is 4.", usage=USAGE, created=5
    ),
    "one tool": Completion(
        id="c3",
        model="m",
        tool_calls=(ToolCall("call_a", "exec_command", '{"cmd": "ls -la ü"}'),),
        finish_reason="tool_calls",
        usage=USAGE,
    ),
    "several tools": Completion(
        id="c4",
        model="m",
        reasoning="two calls",
        text="Running both.",
        tool_calls=(
            ToolCall("call_a", "read", '{"path": "a.txt"}'),
            ToolCall("call_b", "read", '{"path": "b.txt"}'),
            ToolCall("call_c", "exec", "console.log('hé')", kind="custom"),
        ),
        finish_reason="tool_calls",
        usage=USAGE,
    ),
    "length": Completion(id="c5", model="m", text="cut sho", finish_reason="length", usage=USAGE),
}


def client_for(
    chunks: list[bytes], content_type: str, status: int = 200, headers: dict[str, str] | None = None
) -> openai.OpenAI:
    transport = streaming_transport(chunks, content_type, status=status, headers=headers)
    # The SDK types http_client as httpx2.Client but accepts a plain httpx.Client at runtime.
    http_client: Any = httpx.Client(transport=transport)
    return openai.OpenAI(api_key="sk-test", base_url="http://proxy.test/v1", max_retries=0, http_client=http_client)


def stream_bytes(completion: Completion) -> bytes:
    enc = ResponsesStreamEncoder()
    return b"".join(enc.feed(e) for e in completion_events(completion))


def summary(resp: Any) -> dict[str, Any]:
    """What the judge compares: text, reasoning, calls with ids/names/args, status, usage."""
    calls = [
        (o.type, o.call_id, o.name, getattr(o, "arguments", None) or getattr(o, "input", None))
        for o in resp.output
        if o.type in ("function_call", "custom_tool_call")
    ]
    reasoning = ["".join(s.text for s in o.summary) for o in resp.output if o.type == "reasoning"]
    details = resp.incomplete_details.reason if resp.incomplete_details else None
    return {
        "text": resp.output_text,
        "reasoning": reasoning,
        "calls": calls,
        "status": resp.status,
        "incomplete": details,
        "usage": resp.usage.to_dict(),
    }


def without_parsed(obj: Any) -> Any:
    """The stream helper returns ParsedResponse, which adds ``parsed``/``parsed_arguments`` keys (always None)."""
    if isinstance(obj, dict):
        return {k: without_parsed(v) for k, v in obj.items() if k not in ("parsed", "parsed_arguments")}
    if isinstance(obj, list):
        return [without_parsed(v) for v in obj]
    return obj


def expected_summary(c: Completion) -> dict[str, Any]:
    return {
        "text": c.text,
        "reasoning": [c.reasoning] if c.reasoning else [],
        "calls": [
            ("function_call" if t.kind == "function" else "custom_tool_call", t.id, t.name, t.arguments)
            for t in c.tool_calls
        ],
        "status": "incomplete" if c.finish_reason == "length" else "completed",
        "incomplete": "max_output_tokens" if c.finish_reason == "length" else None,
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
            "output_tokens": 37,
            "output_tokens_details": {"reasoning_tokens": 11},
            "total_tokens": 157,
        },
    }


# --------------------------------------------------------------------------------------------------- SDK judge


@pytest.mark.parametrize("name", list(COMPLETIONS))
def test_sdk_parses_body_and_stream_alike(name: str) -> None:
    completion = COMPLETIONS[name]
    body = json.dumps(dialect_for("responses").render_completion(completion)).encode()
    plain = client_for([body], "application/json").responses.create(model="m", input="hi")
    assert summary(plain) == expected_summary(completion)
    data = stream_bytes(completion)
    for split, chunks in chunkings(data):
        events = list(client_for(chunks, "text/event-stream").responses.create(model="m", input="hi", stream=True))
        assert [e.sequence_number for e in events] == list(range(len(events))), split
        final = events[-1]
        assert final.type == "response.completed", split
        assert final.response.to_dict() == plain.to_dict(), split
        with client_for(chunks, "text/event-stream").responses.stream(model="m", input="hi") as stream:
            helper = stream.get_final_response()
        assert without_parsed(helper.to_dict()) == plain.to_dict(), split
        assert summary(helper) == summary(plain), split


def test_sdk_stream_deltas_rebuild_text_and_arguments() -> None:
    completion = COMPLETIONS["several tools"]
    chunks = next(c for n, c in chunkings(stream_bytes(completion)) if n == "bytewise")
    text, custom, reasoning = "", "", ""
    args: dict[int, str] = {}
    with client_for(chunks, "text/event-stream").responses.stream(model="m", input="hi") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
                assert event.snapshot == text  # the helper's own accumulation
            elif event.type == "response.function_call_arguments.delta":
                args[event.output_index] = args.get(event.output_index, "") + event.delta
            elif event.type == "response.custom_tool_call_input.delta":
                custom += event.delta
            elif event.type == "response.reasoning_summary_text.delta":
                reasoning += event.delta
    assert text == "Running both."
    assert sorted(args.values()) == ['{"path": "a.txt"}', '{"path": "b.txt"}']
    assert custom == "console.log('hé')"
    assert reasoning == "two calls"


async def test_async_sdk_stream_helper() -> None:
    completion = COMPLETIONS["reasoning+text"]
    for split, chunks in chunkings(stream_bytes(completion)):
        http_client: Any = httpx.AsyncClient(transport=streaming_transport(chunks, "text/event-stream"))
        client = openai.AsyncOpenAI(
            api_key="k", base_url="http://proxy.test/v1", max_retries=0, http_client=http_client
        )
        async with client.responses.stream(model="m", input="hi") as stream:
            final = await stream.get_final_response()
        assert summary(final) == expected_summary(completion), split


# --------------------------------------------------------------------------------------------------- wire grammar


def parse_sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in data.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_event_grammar_and_sequence_numbers() -> None:
    events = parse_sse(stream_bytes(COMPLETIONS["several tools"]))
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names = [n.removeprefix("response.") for n, _ in events]
    assert names[:2] == ["created", "in_progress"]
    assert names[2:8] == [
        "output_item.added",
        "reasoning_summary_part.added",
        "reasoning_summary_text.delta",
        "reasoning_summary_text.done",
        "reasoning_summary_part.done",
        "output_item.done",
    ]
    assert names[8:14] == [
        "output_item.added",
        "content_part.added",
        "output_text.delta",
        "output_text.done",
        "content_part.done",
        "output_item.done",
    ]
    assert names[14:18] == [
        "output_item.added",
        "function_call_arguments.delta",
        "function_call_arguments.done",
        "output_item.done",
    ]
    assert names[-5:] == [
        "output_item.added",
        "custom_tool_call_input.delta",
        "custom_tool_call_input.done",
        "output_item.done",
        "completed",
    ]
    completed = events[-1][1]["response"]
    assert [o["type"] for o in completed["output"]] == ["reasoning", "message", "function_call"] * 1 + [
        "function_call",
        "custom_tool_call",
    ]
    assert completed["usage"]["total_tokens"] == 157


def test_each_event_is_emitted_as_soon_as_fed() -> None:
    enc = ResponsesStreamEncoder()
    start = enc.feed(StreamStart("x", "m", 1, prompt_tokens=3))
    assert [n for n, _ in parse_sse(start)] == ["response.created", "response.in_progress"]
    first = parse_sse(enc.feed(TextDelta("Hel")))
    assert [n for n, _ in first][-1] == "response.output_text.delta" and first[-1][1]["delta"] == "Hel"
    assert [n for n, _ in parse_sse(enc.feed(TextDelta("lo")))] == ["response.output_text.delta"]
    assert enc.feed(TextDelta("")) == b""
    started = parse_sse(enc.feed(ToolCallStarted(0, "call_1", "f")))
    assert [n for n, _ in started] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert started[-1][1]["item"] == {
        "type": "function_call",
        "id": "fc_x_1",
        "call_id": "call_1",
        "name": "f",
        "arguments": "",
        "status": "in_progress",
    }
    assert parse_sse(enc.feed(ToolCallDelta(0, '{"a"')))[0][1]["delta"] == '{"a"'
    done = parse_sse(enc.feed(ToolCallEnded(0)))
    assert done[0][1]["arguments"] == '{"a"'
    end = parse_sse(enc.feed(Finish("tool_calls", Usage(3, 4))))
    assert end[-1][1]["response"]["status"] == "completed"
    assert end[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello"


def test_parallel_open_tool_calls_route_by_index() -> None:
    enc = ResponsesStreamEncoder()
    enc.feed(StreamStart("p", "m", 1))
    enc.feed(ToolCallStarted(0, "a", "f"))
    enc.feed(ToolCallStarted(1, "b", "g"))
    assert parse_sse(enc.feed(ToolCallDelta(1, "{}")))[0][1]["output_index"] == 1
    enc.feed(ToolCallDelta(0, '{"x":1}'))
    out = parse_sse(enc.feed(Finish("tool_calls", Usage())))
    final = out[-1][1]["response"]["output"]
    assert [(o["call_id"], o["arguments"]) for o in final] == [("a", '{"x":1}'), ("b", "{}")]


def test_length_marks_open_item_incomplete() -> None:
    body = render_response(COMPLETIONS["length"])
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize(
    "events",
    [
        [TextDelta("x")],
        [StreamStart("a", "m", 0), StreamStart("a", "m", 0)],
        [StreamStart("a", "m", 0), ToolCallDelta(0, "{}")],
        [StreamStart("a", "m", 0), ToolCallEnded(3)],
        [StreamStart("a", "m", 0), ToolCallStarted(0, "i", "f"), ToolCallStarted(0, "i", "f")],
        [StreamStart("a", "m", 0), Finish("stop", Usage()), TextDelta("late")],
        [StreamStart("a", "m", 0), ToolCallStarted(0, "i", "f"), ToolCallEnded(0), ToolCallDelta(0, "x")],
    ],
)
def test_impossible_order_raises(events: list[Any]) -> None:
    enc = ResponsesStreamEncoder()
    with pytest.raises(ValueError):
        for e in events:
            enc.feed(e)


def test_body_equals_stream_final_response() -> None:
    for completion in COMPLETIONS.values():
        completed = parse_sse(stream_bytes(completion))[-1][1]["response"]
        assert completed == render_response(completion)


def test_reasoning_then_text_then_reasoning_opens_new_items() -> None:
    enc = ResponsesStreamEncoder()
    events: list[StreamEvent] = [
        StreamStart("r", "m", 0),
        ReasoningDelta("a"),
        TextDelta("b"),
        ReasoningDelta("c"),
        Finish("stop", Usage()),
    ]
    data = b"".join(enc.feed(e) for e in events)
    output = parse_sse(data)[-1][1]["response"]["output"]
    assert [(o["type"], o["id"]) for o in output] == [
        ("reasoning", "rs_r_0"),
        ("message", "msg_r_1"),
        ("reasoning", "rs_r_2"),
    ]


# --------------------------------------------------------------------------------------------------- errors

SDK_ERRORS: dict[ErrorKind, type[openai.APIStatusError]] = {
    "invalid_request": openai.BadRequestError,
    "authentication": openai.AuthenticationError,
    "permission": openai.PermissionDeniedError,
    "not_found": openai.NotFoundError,
    "too_large": openai.APIStatusError,
    "context_length": openai.BadRequestError,
    "rate_limited": openai.RateLimitError,
    "internal": openai.InternalServerError,
    "unavailable": openai.InternalServerError,
    "overloaded": openai.InternalServerError,
    "timeout": openai.InternalServerError,
}


@pytest.mark.parametrize("kind", list(SDK_ERRORS))
def test_error_bodies_raise_the_sdk_exception(kind: ErrorKind) -> None:
    err = ConversionError(kind, "something went wrong", param="input" if kind == "invalid_request" else None)
    wire = render_error(err)
    expected_status = 503 if kind == "overloaded" else ERROR_STATUS[kind]
    assert wire.status == expected_status
    client = client_for([wire.body], "application/json", status=wire.status, headers=dict(wire.headers))
    with pytest.raises(SDK_ERRORS[kind]) as info:
        client.responses.create(model="m", input="hi")
    assert info.value.status_code == expected_status
    body = json.loads(wire.body)["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert "something went wrong" in body["message"]
    if expected_status in (429, 503):
        assert wire.headers["retry-after"] == "1" and wire.headers["retry-after-ms"] == "1000"
    else:
        assert "retry-after" not in wire.headers


def test_context_length_uses_vendor_wording_and_code() -> None:
    wire = render_error(ConversionError("context_length", "prompt is 9000 tokens, limit 8192"))
    body = json.loads(wire.body)["error"]
    assert body["code"] == "context_length_exceeded" and body["param"] == "input"
    assert body["message"].startswith("Your input exceeds the context window of this model.")
    assert "9000" in body["message"]


def test_retry_after_is_rounded_up_and_exact_in_ms() -> None:
    wire = render_error(ConversionError("rate_limited", "slow down", retry_after=2.5))
    assert wire.status == 429
    assert wire.headers["retry-after"] == "3" and wire.headers["retry-after-ms"] == "2500"
    assert "Please try again in 2.5s." in json.loads(wire.body)["error"]["message"]


def test_in_stream_error_makes_the_sdk_raise() -> None:
    enc = ResponsesStreamEncoder()
    data = enc.feed(StreamStart("e", "m", 0)) + enc.feed(TextDelta("partial"))
    data += enc.error(ConversionError("overloaded", "engine busy"))
    events = parse_sse(data)
    assert [n for n, _ in events][-2:] == ["response.failed", "error"]
    failed = events[-2][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_is_overloaded"
    assert events[-1][1]["code"] == "server_is_overloaded" and "engine busy" in events[-1][1]["message"]
    for _, chunks in chunkings(data):
        seen = []
        with pytest.raises(openai.APIError, match="engine busy"):
            for event in client_for(chunks, "text/event-stream").responses.create(model="m", input="x", stream=True):
                seen.append(event.type)
        assert seen[-1] == "response.failed"
    with pytest.raises(ValueError):
        enc.feed(TextDelta("after error"))


def test_error_before_start_is_a_lone_error_event() -> None:
    enc = ResponsesStreamEncoder()
    events = parse_sse(enc.error(ConversionError("context_length", "too long")))
    assert [n for n, _ in events] == ["error"]
    assert events[0][1]["sequence_number"] == 0 and events[0][1]["code"] == "context_length_exceeded"


def test_error_finish_fails_the_response() -> None:
    enc = ResponsesStreamEncoder()
    events: list[StreamEvent] = [StreamStart("f", "m", 0), TextDelta("x"), Finish("error", Usage(1, 1))]
    data = b"".join(enc.feed(e) for e in events)
    assert parse_sse(data)[-1][0] == "response.failed"
    with client_for([data], "text/event-stream").responses.stream(model="m", input="x") as stream:
        with pytest.raises(RuntimeError, match="response.completed"):
            stream.get_final_response()
    with pytest.raises(ValueError):
        enc.error(ConversionError("internal", "late"))


def test_dialect_wiring() -> None:
    dialect = dialect_for("responses")
    enc = dialect.stream_encoder(ROUTE)
    assert isinstance(enc, ResponsesStreamEncoder) and enc.content_type.startswith("text/event-stream")
    request = dialect.parse_request({"model": "m", "input": "hi", "stream": True}, ROUTE)
    with_request = dialect.stream_encoder(ROUTE, request)
    completion = COMPLETIONS["text"]
    data = b"".join(with_request.feed(e) for e in completion_events(completion))
    assert data == stream_bytes(completion)  # the request changes nothing in this format
    assert dialect.render_error(ConversionError("not_found", "no such model")).status == 404

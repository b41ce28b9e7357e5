"""OpenAI Chat Completions responses: the streaming encoder, the non-streaming body (from one state), errors.

Contract
--------
:class:`ChatStreamEncoder` is a sans-IO transducer: each canonical :data:`~converters.canonical.StreamEvent`
fed to it returns, at once, the exact ``text/event-stream`` bytes OpenAI would send for it
(``chat.completion.chunk`` objects, then ``data: [DONE]``). :func:`render_completion_body` feeds
:func:`~converters.canonical.completion_events` through the same :class:`ChatStreamState` and renders the
``chat.completion`` object once, so the stream and the body can never disagree.

Grammar emitted (one SSE ``data:`` line each, no ``event:`` names)::

    chunk  delta {role: "assistant"}                                   on StreamStart
    chunk  delta {reasoning_content: "..."}                            per ReasoningDelta
    chunk  delta {content: "..."}                                      per TextDelta
    chunk  delta {tool_calls: [{index, id, type, function: {name, arguments: ""}}]}   on ToolCallStarted
    chunk  delta {tool_calls: [{index, function: {arguments: "..."}}]}                per ToolCallDelta
    chunk  delta {}, finish_reason                                     on Finish
    chunk  choices [], usage                                           on Finish, only if include_usage
    [DONE]

Custom tools use ``type: "custom"`` and ``custom: {name, input}`` in place of ``function: {name, arguments}``.
``ToolCallEnded`` emits nothing: the wire format has no end marker for a call.

Organisation: state dataclasses; :func:`apply_event` (the reducer, which also returns the chunks to send); pure
builders for chunks, messages and usage; the body renderer; the error shape (``{"error": {message, type, param,
code}}``, also sent in-stream as a bare data line); the encoder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, assert_never

from converters.base import StreamEncoder, dumps, sse
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
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
    WireResponse,
    completion_events,
)

# Chat has no "error" finish reason; an errored completion that still gets a body reports a plain stop.
_FINISH: dict[FinishReason, str] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "content_filter": "content_filter",
    "error": "stop",
}

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Chunk:
    """One chunk's only choice: its ``delta`` and, on the last one, the ``finish_reason``."""

    delta: Mapping[str, Any]
    finish_reason: str | None = None


@dataclass
class CallState:
    """One tool call as accumulated so far. ``arguments`` is kept in pieces to avoid quadratic joins."""

    id: str
    name: str
    kind: Literal["function", "custom"]
    arguments: list[str] = field(default_factory=list)
    ended: bool = False


@dataclass
class ChatStreamState:
    """Everything a chat response says, accumulated event by event. ``phase`` orders the events."""

    phase: Literal["new", "open", "finished"] = "new"
    id: str = ""
    model: str = ""
    created: int = 0
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[CallState] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)


# ---------------------------------------------------------------------------------------------------- reducer


def apply_event(state: ChatStreamState, event: StreamEvent) -> list[Chunk]:
    """Fold ``event`` into ``state`` and return the chunks it produces, in order.

    Raises ``ValueError`` on an impossible order (anything before ``StreamStart`` or after ``Finish``, deltas
    for a call that was never started or already ended, tool calls out of index order).
    """
    expected = "new" if isinstance(event, StreamStart) else "open"
    if state.phase != expected:
        raise ValueError(f"{type(event).__name__} fed while the stream is {state.phase}")
    match event:
        case StreamStart(id=response_id, model=model, created=created):
            state.phase, state.id, state.model, state.created = "open", response_id, model, created
            return [Chunk({"role": "assistant"})]
        case TextDelta(text=text):
            state.text.append(text)
            return [Chunk({"content": text})] if text else []
        case ReasoningDelta(text=text):
            state.reasoning.append(text)
            return [Chunk({"reasoning_content": text})] if text else []
        case ToolCallStarted(index=index, id=call_id, name=name, kind=kind):
            if index != len(state.calls):
                raise ValueError(f"tool call {index} started, expected index {len(state.calls)}")
            state.calls.append(CallState(call_id, name, kind))
            return [Chunk({"tool_calls": [_call_head(index, call_id, name, kind)]})]
        case ToolCallDelta(index=index, arguments=arguments):
            call = _open_call(state, index)
            call.arguments.append(arguments)
            return [Chunk({"tool_calls": [_call_piece(index, call.kind, arguments)]})] if arguments else []
        case ToolCallEnded(index=index):
            _open_call(state, index).ended = True
            return []
        case Finish(reason=reason, usage=usage):
            state.phase, state.finish_reason, state.usage = "finished", reason, usage
            return [Chunk({}, _FINISH[reason])]
        case _:
            assert_never(event)


def _open_call(state: ChatStreamState, index: int) -> CallState:
    if not 0 <= index < len(state.calls) or state.calls[index].ended:
        raise ValueError(f"tool call {index} is not open")
    return state.calls[index]


# --------------------------------------------------------------------------------------------------- builders


def _call_head(index: int, call_id: str, name: str, kind: Literal["function", "custom"]) -> dict[str, Any]:
    if kind == "custom":
        return {"index": index, "id": call_id, "type": "custom", "custom": {"name": name, "input": ""}}
    return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}


def _call_piece(index: int, kind: Literal["function", "custom"], text: str) -> dict[str, Any]:
    if kind == "custom":
        return {"index": index, "custom": {"input": text}}
    return {"index": index, "function": {"arguments": text}}


def _call_body(call: CallState) -> dict[str, Any]:
    args = "".join(call.arguments)
    if call.kind == "custom":
        return {"id": call.id, "type": "custom", "custom": {"name": call.name, "input": args}}
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}}


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def chunk_body(state: ChatStreamState, chunk: Chunk) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object."""
    choice = {"index": 0, "delta": dict(chunk.delta), "logprobs": None, "finish_reason": chunk.finish_reason}
    return {
        "id": state.id,
        "object": "chat.completion.chunk",
        "created": state.created,
        "model": state.model,
        "choices": [choice],
    }


def usage_chunk_body(state: ChatStreamState) -> dict[str, Any]:
    return {
        "id": state.id,
        "object": "chat.completion.chunk",
        "created": state.created,
        "model": state.model,
        "choices": [],
        "usage": usage_body(state.usage),
    }


def message_body(state: ChatStreamState) -> dict[str, Any]:
    """The assistant message. ``content`` is null when no text was produced, as OpenAI sends it."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(state.text) or None}
    if state.reasoning:
        message["reasoning_content"] = "".join(state.reasoning)
    if state.calls:
        message["tool_calls"] = [_call_body(c) for c in state.calls]
    return message


def completion_body(state: ChatStreamState) -> dict[str, Any]:
    if state.phase != "finished":
        raise ValueError("completion body rendered before Finish")
    choice = {
        "index": 0,
        "message": message_body(state),
        "logprobs": None,
        "finish_reason": _FINISH[state.finish_reason],
    }
    return {
        "id": state.id,
        "object": "chat.completion",
        "created": state.created,
        "model": state.model,
        "choices": [choice],
        "usage": usage_body(state.usage),
    }


def render_completion_body(completion: Completion) -> dict[str, Any]:
    """The non-streaming body: the completion's events folded through the stream state, rendered once."""
    state = ChatStreamState()
    for event in completion_events(completion):
        apply_event(state, event)
    return completion_body(state)


# ----------------------------------------------------------------------------------------------------- errors

# kind -> (HTTP status, error.type, error.code). Chat has no 529: "overloaded" is a 503, like an engine down.
_ERRORS: dict[ErrorKind, tuple[int, str, str | None]] = {
    "invalid_request": (400, "invalid_request_error", None),
    "authentication": (401, "invalid_request_error", "invalid_api_key"),
    "permission": (403, "invalid_request_error", "permission_denied"),
    "not_found": (404, "invalid_request_error", "model_not_found"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "context_length": (400, "invalid_request_error", "context_length_exceeded"),
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
    "internal": (500, "server_error", None),
    "unavailable": (503, "server_error", "service_unavailable"),
    "overloaded": (503, "server_error", "overloaded"),
    "timeout": (504, "server_error", "timeout"),
}
_CONTEXT_WORDING = "maximum context length"


def error_body(err: ConversionError) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}``. Context-length messages carry OpenAI's wording, which
    harnesses match on to trigger compaction."""
    _, typ, code = _ERRORS[err.kind]
    message = err.message
    if err.kind == "context_length" and _CONTEXT_WORDING not in message.lower():
        message = (
            f"This model's maximum context length was exceeded: {message.rstrip('.')}. "
            "Please reduce the length of the messages."
        )
    return {"error": {"message": message, "type": typ, "param": err.param, "code": code}}


def render_error_response(err: ConversionError) -> WireResponse:
    """The error as an HTTP answer, with the retry headers of :meth:`ConversionError.retry_headers`."""
    status = _ERRORS[err.kind][0]
    headers = {"content-type": "application/json"} | err.retry_headers()
    return WireResponse(status, headers, dumps(error_body(err)).encode())


# ---------------------------------------------------------------------------------------------------- encoder


class ChatStreamEncoder(StreamEncoder):
    """Canonical events in, ``chat.completion.chunk`` SSE bytes out. ``include_usage`` mirrors
    ``stream_options.include_usage``: when set, a usage chunk with ``choices: []`` precedes ``[DONE]``."""

    def __init__(self, include_usage: bool = False) -> None:
        self.state = ChatStreamState()
        self.include_usage = include_usage

    def feed(self, event: StreamEvent) -> bytes:
        out = b"".join(sse(chunk_body(self.state, c)) for c in apply_event(self.state, event))
        if self.state.phase == "finished":
            if self.include_usage:
                out += sse(usage_chunk_body(self.state))
            out += DONE
        return out

    def error(self, err: ConversionError) -> bytes:
        """Chat streams report errors as a bare ``{"error": {...}}`` data line; the stream then ends."""
        self.state.phase = "finished"
        return sse(error_body(err))

    @property
    def content_type(self) -> str:
        return "text/event-stream; charset=utf-8"

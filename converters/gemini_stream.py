"""Gemini responses: the non-streaming body, the incremental stream encoder, and errors, from one state.

Contract
--------
* :func:`step` is a pure reducer ``(StreamState, StreamEvent) -> (StreamState, chunks)``: each chunk is a
  whole ``GenerateContentResponse`` holding only the parts that event produced. Text and thoughts go out at
  once; a tool call's argument deltas are buffered and its ``functionCall`` part (Gemini sends ``args``
  whole) goes out on ``ToolCallEnded``. ``Finish`` emits the last chunk, carrying ``finishReason`` and
  ``usageMetadata`` (and any tool call still open). Impossible orders raise ``ValueError``.
* :func:`render_completion` folds ``completion_events(completion)`` through the same reducer and renders
  the accumulated state once, so the body and the stream cannot disagree.
* :class:`GeminiStreamEncoder` frames chunks either as SSE (``data: {...}`` + blank line; ``?alt=sse``) or
  as the JSON-array stream (``[`` on start, ``,\\r\\n`` between objects, ``]`` after the last), so that
  both shapes are complete, well-formed documents once the stream has finished or failed.
* :func:`render_error` gives ``{"error": {code, message, status, details}}`` with the HTTP status, and a
  ``retry-after`` header plus a ``google.rpc.RetryInfo`` detail on 429/503. In a stream the same object is one
  more chunk (the google-genai SDKs raise on a chunk that starts with ``"error"``).

Organisation: wire builders (usage, finish reason, parts, chunks); the state and its reducer; the completion
renderer; errors; the encoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, assert_never

from converters.base import StreamEncoder, dumps, dumps_event, sse
from converters.canonical import (
    ERROR_STATUS,
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
    ToolCallPart,
    ToolCallStarted,
    Usage,
    WireResponse,
    completion_events,
)

WirePart = dict[str, Any]

_FINISH: Mapping[FinishReason, str] = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",  # Gemini ends a function-calling turn with STOP
    "content_filter": "SAFETY",
    "error": "OTHER",
}

# ---------------------------------------------------------------------------------------------- wire builders


def usage_metadata(usage: Usage) -> dict[str, Any]:
    """Gemini counts thoughts apart from candidates; canonical completion tokens include the reasoning."""
    thoughts = usage.reasoning_tokens
    meta: dict[str, Any] = {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": max(usage.completion_tokens - thoughts, 0),
        "totalTokenCount": usage.total_tokens,
    }
    if usage.cached_tokens:
        meta["cachedContentTokenCount"] = usage.cached_tokens
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
    return meta


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """The ``functionCall`` object. Gemini needs ``args`` as an object: arguments that are not a JSON object
    (a malformed call from the model) are passed on under ``_raw_arguments`` so the harness sees it."""
    args = ToolCallPart(call_id, name, arguments).parsed_arguments()
    call: dict[str, Any] = ({"id": call_id} if call_id else {}) | {"name": name}
    call["args"] = args if isinstance(args, dict) else {"_raw_arguments": arguments}
    return call


def _function_call_part(call: PendingCall) -> WirePart:
    return {"functionCall": function_call(call.id, call.name, call.arguments)}


def _merge_part(parts: tuple[WirePart, ...], part: WirePart) -> tuple[WirePart, ...]:
    """Append ``part``, joined to the previous part when both are text of the same kind (thought or not)."""
    if parts and set(part) <= {"text", "thought"} and set(parts[-1]) <= {"text", "thought"}:
        last = parts[-1]
        if last.get("thought", False) == part.get("thought", False):
            return (*parts[:-1], {**last, "text": last["text"] + part["text"]})
    return (*parts, part)


# ------------------------------------------------------------------------------------------------------ state


@dataclass(frozen=True)
class PendingCall:
    """A tool call whose arguments are still arriving."""

    id: str
    name: str
    arguments: str = ""


Phase = Literal["before_start", "streaming", "finished"]


@dataclass(frozen=True)
class StreamState:
    """Everything one response has produced so far. ``parts`` is the whole candidate content (adjacent
    text merged); ``chunks`` counts the response objects emitted (the JSON-array stream needs commas)."""

    phase: Phase = "before_start"
    response_id: str = ""
    model: str = ""
    parts: tuple[WirePart, ...] = ()
    pending: Mapping[int, PendingCall] = field(default_factory=dict)
    finish: FinishReason | None = None
    usage: Usage | None = None
    chunks: int = 0


def response_object(
    state: StreamState, parts: tuple[WirePart, ...], finish: FinishReason | None, usage: Usage | None
) -> dict[str, Any]:
    """One GenerateContentResponse: a single candidate with ``parts``; finish and usage only when given."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}}
    if finish is not None:
        candidate["finishReason"] = _FINISH[finish]
    candidate["index"] = 0
    body: dict[str, Any] = {"candidates": [candidate]}
    if usage is not None:
        body["usageMetadata"] = usage_metadata(usage)
    return body | {"modelVersion": state.model, "responseId": state.response_id}


def _emit(state: StreamState, parts: tuple[WirePart, ...]) -> tuple[StreamState, list[dict[str, Any]]]:
    merged = state.parts
    for part in parts:
        merged = _merge_part(merged, part)
    new = replace(state, parts=merged, chunks=state.chunks + 1)
    return new, [response_object(new, parts, None, None)]


def _pending(state: StreamState, index: int) -> PendingCall:
    if index not in state.pending:
        raise ValueError(f"tool call {index} was not started (or already ended)")
    return state.pending[index]


def _finish(state: StreamState, event: Finish) -> tuple[StreamState, list[dict[str, Any]]]:
    # A call still open at Finish (cut by max tokens) is flushed as it stands rather than lost.
    flushed = tuple(_function_call_part(state.pending[i]) for i in sorted(state.pending))
    merged = state.parts
    for part in flushed:
        merged = _merge_part(merged, part)
    new = replace(
        state, phase="finished", parts=merged, pending={}, finish=event.reason, usage=event.usage,
        chunks=state.chunks + 1,
    )  # fmt: skip
    return new, [response_object(new, flushed, event.reason, event.usage)]


def step(state: StreamState, event: StreamEvent) -> tuple[StreamState, list[dict[str, Any]]]:
    """Apply one canonical event; return the new state and the response objects to send for it."""
    if state.phase == "finished":
        raise ValueError(f"{event.type} event after the stream finished")
    if state.phase == "before_start" and not isinstance(event, StreamStart):
        raise ValueError(f"{event.type} event before StreamStart")
    match event:
        case StreamStart():
            if state.phase != "before_start":
                raise ValueError("second StreamStart")
            return replace(state, phase="streaming", response_id=event.id, model=event.model), []
        case TextDelta(text=text):
            return _emit(state, ({"text": text},)) if text else (state, [])
        case ReasoningDelta(text=text):
            return _emit(state, ({"text": text, "thought": True},)) if text else (state, [])
        case ToolCallStarted(index=index):
            if index in state.pending:
                raise ValueError(f"tool call {index} started twice")
            call = PendingCall(event.id, event.name)
            return replace(state, pending={**state.pending, index: call}), []
        case ToolCallDelta(index=index, arguments=arguments):
            call = _pending(state, index)
            grown = replace(call, arguments=call.arguments + arguments)
            return replace(state, pending={**state.pending, index: grown}), []
        case ToolCallEnded(index=index):
            call = _pending(state, index)
            rest = {i: c for i, c in state.pending.items() if i != index}
            return _emit(replace(state, pending=rest), (_function_call_part(call),))
        case Finish():
            return _finish(state, event)
        case _:
            assert_never(event)


# ------------------------------------------------------------------------------------------------- completion


def final_state(completion: Completion) -> StreamState:
    state = StreamState()
    for event in completion_events(completion):
        state, _ = step(state, event)
    return state


def render_completion(completion: Completion) -> dict[str, Any]:
    """The non-streaming ``GenerateContentResponse``: the stream's accumulated state, rendered once."""
    state = final_state(completion)
    return response_object(state, state.parts, state.finish, state.usage)


# ----------------------------------------------------------------------------------------------------- errors

_STATUS_NAME: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def http_status(kind: ErrorKind) -> int:
    return 503 if kind == "overloaded" else ERROR_STATUS[kind]  # Google has no 529


def _retry_seconds(wait: float) -> int:
    return max(1, math.ceil(wait))


def error_object(err: ConversionError) -> dict[str, Any]:
    """``{"error": {...}}`` as Google APIs send it, with RetryInfo / BadRequest details where they apply."""
    code = http_status(err.kind)
    message = err.message
    if err.kind == "context_length" and "exceeds the maximum number of tokens" not in message:
        message = f"The input token count exceeds the maximum number of tokens allowed. {message}"
    details: list[dict[str, Any]] = []
    wait = err.retry_after_s
    if wait is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{_retry_seconds(wait)}s"})
    if err.param is not None and code == 400:
        violation = {"field": err.param, "description": message}
        details.append({"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [violation]})
    error: dict[str, Any] = {"code": code, "message": message, "status": _STATUS_NAME[code]}
    return {"error": error | ({"details": details} if details else {})}


def render_error(err: ConversionError) -> WireResponse:
    headers = {"content-type": "application/json; charset=UTF-8"} | err.retry_headers()
    return WireResponse(http_status(err.kind), headers, dumps(error_object(err)).encode())


# ---------------------------------------------------------------------------------------------------- encoder


class GeminiStreamEncoder(StreamEncoder):
    """Frames the reducer's response objects as SSE (``alt=sse``) or as one JSON array, each at once."""

    def __init__(self, sse: bool = True) -> None:
        self._sse = sse
        self._state = StreamState()

    @property
    def state(self) -> StreamState:
        return self._state

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self._sse else "application/json; charset=UTF-8"

    def feed(self, event: StreamEvent) -> bytes:
        before = self._state
        self._state, objects = step(before, event)
        if self._sse:
            return b"".join(sse(obj) for obj in objects)
        opening = b"[" if isinstance(event, StreamStart) else b""
        closing = b"]" if self._state.phase == "finished" else b""
        return opening + _array_items(objects, before.chunks) + closing

    def error(self, err: ConversionError) -> bytes:
        before = self._state
        if before.phase == "finished":
            return b""  # the stream is already a complete document; nothing may follow it
        self._state = replace(before, phase="finished", finish="error", chunks=before.chunks + 1)
        if self._sse:
            return sse(error_object(err))
        opening = b"[" if before.phase == "before_start" else b""
        return opening + _array_items([error_object(err)], before.chunks) + b"]"


def _array_items(objects: list[dict[str, Any]], sent_before: int) -> bytes:
    out = b""
    for i, obj in enumerate(objects):
        separator = b",\r\n" if sent_before + i > 0 else b""
        out += separator + dumps_event(obj)
    return out

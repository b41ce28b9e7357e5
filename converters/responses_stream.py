"""OpenAI Responses output side: response bodies, the SSE stream encoder and error answers.

Contract
--------
:class:`ResponsesStreamEncoder` is a sans-IO transducer: each canonical stream event fed to it returns, at
once, the exact SSE bytes for it (``event: <type>`` + ``data: <json>`` with a ``sequence_number`` counting
from 0). Both paths share one reducer: ``apply(state, event)`` updates a :class:`ResponseState` and returns
the wire events the change implies; :func:`render_response` (the non-streaming body) feeds
``completion_events(completion)`` through the same reducer and renders the final state once, so the body and
the stream's ``response.completed`` can never disagree.

Event grammar (per output item, items in order; several tool calls may be open at once, each by
output_index)::

    response.created, response.in_progress
    reasoning:  output_item.added, reasoning_summary_part.added, reasoning_summary_text.delta*,
                reasoning_summary_text.done, reasoning_summary_part.done, output_item.done
    message:    output_item.added, content_part.added, output_text.delta*, output_text.done,
                content_part.done, output_item.done
    function:   output_item.added, function_call_arguments.delta*, function_call_arguments.done,
                output_item.done
    custom:     output_item.added, custom_tool_call_input.delta*, custom_tool_call_input.done,
                output_item.done
    response.completed (status completed | incomplete)   or   response.failed

Reasoning is sent as a reasoning *summary* (not ``reasoning_text``): it is what Codex, OpenCode/Kilo and Pi
show and send back on the next turn. A ``length`` finish gives status ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` inside ``response.completed`` (the vendor sends
``response.incomplete``; the SDK stream helper and the harnesses that treat it as an error would then lose a
usable turn). Errors use the vendor shape ``{"error": {"message", "type", "param", "code"}}``; in-stream,
``response.failed`` (when a response was started) then an ``error`` event that carries both the documented
flat fields and a nested ``error`` object, which makes the SDK raise ``APIError``.

Organisation: state; pure JSON builders; the reducer; the encoder; errors.
"""

from __future__ import annotations

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

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
WireEvent = dict[str, Any]  # one event's JSON, without its sequence_number

ID_PREFIX: dict[ItemKind, str] = {
    "reasoning": "rs",
    "message": "msg",
    "function_call": "fc",
    "custom_tool_call": "ctc",
}
# Finish reasons that cut the output short, and the Responses incomplete_details.reason for each.
INCOMPLETE: dict[FinishReason, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}


# --------------------------------------------------------------------------------------------------- state


@dataclass
class OutputItem:
    """One output item as accumulated so far. ``text``: summary, output text, arguments or custom input."""

    kind: ItemKind
    id: str
    call_id: str = ""
    name: str = ""
    status: ItemStatus = "in_progress"
    # Deltas are kept as pieces and joined when the item is rendered, so a long output costs linear time.
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""


@dataclass
class ResponseState:
    id: str
    model: str
    created: int
    items: list[OutputItem] = field(default_factory=list)
    tool_items: dict[int, int] = field(default_factory=dict)  # canonical tool-call index -> output index
    status: ResponseStatus = "in_progress"
    usage: Usage | None = None
    incomplete_reason: str | None = None
    error: dict[str, Any] | None = None


def start_state(event: StreamStart) -> ResponseState:
    rid = event.id if event.id.startswith("resp_") else f"resp_{event.id}"
    return ResponseState(id=rid, model=event.model, created=event.created)


# ------------------------------------------------------------------------------------------------- JSON builders


def item_json(item: OutputItem, *, skeleton: bool = False) -> dict[str, Any]:
    """The item as the API shows it; ``skeleton`` is the empty shape sent in ``output_item.added``."""
    text = "" if skeleton else item.text
    match item.kind:
        case "reasoning":
            return {"type": "reasoning", "id": item.id, "summary": [] if skeleton else [_summary_part(text)]}
        case "message":
            content = [] if skeleton else [_text_part(text)]
            return {
                "type": "message",
                "id": item.id,
                "status": item.status,
                "role": "assistant",
                "content": content,
            }
        case "function_call":
            return {
                "type": "function_call",
                "id": item.id,
                "call_id": item.call_id,
                "name": item.name,
                "arguments": text,
                "status": item.status,
            }
        case "custom_tool_call":
            return {
                "type": "custom_tool_call",
                "id": item.id,
                "call_id": item.call_id,
                "name": item.name,
                "input": text,
            }
        case _:
            assert_never(item.kind)


def _summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage_json(usage: Usage) -> dict[str, Any]:
    # cache_write_tokens is required by the SDK's model (openai >= 3.x). The engine's prefix cache is automatic
    # and not billed: no prompt was written to a cache on the caller's behalf, so the count is honestly 0.
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_json(state: ResponseState) -> dict[str, Any]:
    """The response object. Request fields it echoes (tools, temperature …) are unknown here: API defaults."""
    reason = state.incomplete_reason
    return {
        "id": state.id,
        "object": "response",
        "created_at": state.created,
        "status": state.status,
        "error": state.error,
        "incomplete_details": {"reason": reason} if reason else None,
        "instructions": None,
        "max_output_tokens": None,
        "model": state.model,
        "output": [item_json(i) for i in state.items],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": None,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "truncation": "disabled",
        "usage": usage_json(state.usage) if state.usage else None,
        "metadata": {},
    }


# --------------------------------------------------------------------------------------------------- reducer


def apply(state: ResponseState, event: StreamEvent) -> list[WireEvent]:
    """Fold one event into ``state``; return the wire events it implies. Raises ValueError on impossible order."""
    if state.status != "in_progress":
        raise ValueError(f"{event.type} after the response finished")
    match event:
        case StreamStart():
            raise ValueError("a second start event")
        case TextDelta(text=text) | ReasoningDelta(text=text):
            if not text:
                return []
            kind: ItemKind = "message" if isinstance(event, TextDelta) else "reasoning"
            index, opened = _text_item(state, kind)
            return opened + _delta(state, index, text)
        case ToolCallStarted():
            if event.index in state.tool_items:
                raise ValueError(f"tool call {event.index} started twice")
            out = _close_open(state, ("message", "reasoning"), "completed")
            kind = "function_call" if event.kind == "function" else "custom_tool_call"
            item = OutputItem(kind, "", call_id=event.id, name=event.name)
            state.tool_items[event.index] = len(state.items)
            return out + _open(state, item)
        case ToolCallDelta():
            return _delta(state, _open_tool(state, event.index), event.arguments) if event.arguments else []
        case ToolCallEnded():
            return _close(state, _open_tool(state, event.index), "completed")
        case Finish():
            return _finish(state, event)
        case _:
            assert_never(event)


def _text_item(state: ResponseState, kind: ItemKind) -> tuple[int, list[WireEvent]]:
    """The open message/reasoning item of ``kind``, opening it (and closing the other text kind) if needed."""
    last = state.items[-1] if state.items else None
    if last is not None and last.kind == kind and last.status == "in_progress":
        return len(state.items) - 1, []
    closed = _close_open(state, ("message", "reasoning"), "completed")
    return len(state.items), closed + _open(state, OutputItem(kind, ""))


def _open(state: ResponseState, item: OutputItem) -> list[WireEvent]:
    index = len(state.items)
    item.id = f"{ID_PREFIX[item.kind]}_{state.id.removeprefix('resp_')}_{index}"
    state.items.append(item)
    out: list[WireEvent] = [
        {"type": "response.output_item.added", "output_index": index, "item": item_json(item, skeleton=True)}
    ]
    where = {"item_id": item.id, "output_index": index}
    if item.kind == "reasoning":
        out.append(
            {
                "type": "response.reasoning_summary_part.added",
                **where,
                "summary_index": 0,
                "part": _summary_part(""),
            }
        )
    elif item.kind == "message":
        out.append({"type": "response.content_part.added", **where, "content_index": 0, "part": _text_part("")})
    return out


def _delta(state: ResponseState, index: int, text: str) -> list[WireEvent]:
    item = state.items[index]
    item.pieces.append(text)
    where = {"item_id": item.id, "output_index": index}
    match item.kind:
        case "reasoning":
            return [{"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": text}]
        case "message":
            return [
                {
                    "type": "response.output_text.delta",
                    **where,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
            ]
        case "function_call":
            return [{"type": "response.function_call_arguments.delta", **where, "delta": text}]
        case "custom_tool_call":
            return [{"type": "response.custom_tool_call_input.delta", **where, "delta": text}]
        case _:
            assert_never(item.kind)


def _close(state: ResponseState, index: int, status: ItemStatus) -> list[WireEvent]:
    item = state.items[index]
    item.status = status
    where = {"item_id": item.id, "output_index": index}
    match item.kind:
        case "reasoning":
            part = {**where, "summary_index": 0}
            out = [
                {"type": "response.reasoning_summary_text.done", **part, "text": item.text},
                {"type": "response.reasoning_summary_part.done", **part, "part": _summary_part(item.text)},
            ]
        case "message":
            part = {**where, "content_index": 0}
            out = [
                {"type": "response.output_text.done", **part, "text": item.text, "logprobs": []},
                {"type": "response.content_part.done", **part, "part": _text_part(item.text)},
            ]
        case "function_call":
            out = [
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item.name,
                    "arguments": item.text,
                }
            ]
        case "custom_tool_call":
            out = [{"type": "response.custom_tool_call_input.done", **where, "input": item.text}]
        case _:
            assert_never(item.kind)
    return out + [{"type": "response.output_item.done", "output_index": index, "item": item_json(item)}]


def _close_open(state: ResponseState, kinds: tuple[ItemKind, ...], status: ItemStatus) -> list[WireEvent]:
    out: list[WireEvent] = []
    for index, item in enumerate(state.items):
        if item.kind in kinds and item.status == "in_progress":
            out += _close(state, index, status)
    return out


def _open_tool(state: ResponseState, tool_index: int) -> int:
    index = state.tool_items.get(tool_index)
    if index is None or state.items[index].status != "in_progress":
        raise ValueError(f"tool call {tool_index} is not open")
    return index


def _finish(state: ResponseState, event: Finish) -> list[WireEvent]:
    cut = event.reason in INCOMPLETE or event.reason == "error"
    out = _close_open(
        state,
        ("message", "reasoning", "function_call", "custom_tool_call"),
        "incomplete" if cut else "completed",
    )
    state.usage = event.usage
    if event.reason == "error":
        state.status = "failed"
        state.error = {"code": "server_error", "message": "The model failed to generate a response."}
        return out + [{"type": "response.failed", "response": response_json(state)}]
    state.status = "incomplete" if event.reason in INCOMPLETE else "completed"
    state.incomplete_reason = INCOMPLETE.get(event.reason)
    return out + [{"type": "response.completed", "response": response_json(state)}]


def render_response(completion: Completion) -> dict[str, Any]:
    """The non-streaming body: the completion's events folded through :func:`apply`, rendered once."""
    events = completion_events(completion)
    assert isinstance(events[0], StreamStart)
    state = start_state(events[0])
    for event in events[1:]:
        apply(state, event)
    return response_json(state)


# --------------------------------------------------------------------------------------------------- encoder


class ResponsesStreamEncoder(StreamEncoder):
    """Canonical events in, Responses SSE bytes out; one instance per response."""

    def __init__(self) -> None:
        self._state: ResponseState | None = None
        self._sequence = 0

    @property
    def content_type(self) -> str:
        return "text/event-stream; charset=utf-8"

    @property
    def state(self) -> ResponseState | None:
        return self._state

    def feed(self, event: StreamEvent) -> bytes:
        if self._state is None:
            if not isinstance(event, StreamStart):
                raise ValueError(f"{event.type} before the start event")
            self._state = start_state(event)
            snapshot = response_json(self._state)
            return self._encode(
                [
                    {"type": "response.created", "response": snapshot},
                    {"type": "response.in_progress", "response": snapshot},
                ]
            )
        return self._encode(apply(self._state, event))

    def error(self, err: ConversionError) -> bytes:
        events: list[WireEvent] = []
        code, etype, message = _error_fields(err)
        if self._state is not None:
            if self._state.status != "in_progress":
                raise ValueError("error after the response finished")
            self._state.status = "failed"
            self._state.error = {"code": code, "message": message}
            events.append({"type": "response.failed", "response": response_json(self._state)})
        wire = {"type": etype, "code": code, "message": message, "param": err.param}
        events.append({"type": "error", "code": code, "message": message, "param": err.param, "error": wire})
        return self._encode(events)

    def _encode(self, events: list[WireEvent]) -> bytes:
        out = bytearray()
        for ev in events:
            out += sse({**ev, "sequence_number": self._sequence}, event=ev["type"])
            self._sequence += 1
        return bytes(out)


# --------------------------------------------------------------------------------------------------- errors

# ErrorKind -> (HTTP status, error.type, error.code). OpenAI has no 529: overloaded is a 503.
ERRORS: dict[ErrorKind, tuple[int, str, str | None]] = {
    "invalid_request": (400, "invalid_request_error", None),
    "authentication": (401, "invalid_request_error", "invalid_api_key"),
    "permission": (403, "invalid_request_error", "permission_denied"),
    "not_found": (404, "invalid_request_error", "model_not_found"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "context_length": (400, "invalid_request_error", "context_length_exceeded"),
    "rate_limited": (429, "requests", "rate_limit_exceeded"),
    "internal": (500, "server_error", "server_error"),
    "unavailable": (503, "server_error", "service_unavailable"),
    "overloaded": (503, "server_error", "server_is_overloaded"),
    "timeout": (504, "server_error", "timeout"),
}
CONTEXT_WORDING = "Your input exceeds the context window of this model. Please adjust your input and try again."


def _error_fields(err: ConversionError) -> tuple[str, str, str]:
    """(code, type, message); the code falls back to the type so in-stream errors always have one."""
    _, etype, code = ERRORS[err.kind]
    message = err.message
    if err.kind == "context_length":
        message = f"{CONTEXT_WORDING} ({err.message})" if err.message else CONTEXT_WORDING
    wait = err.retry_after_s
    if wait is not None:  # Codex reads the delay of in-stream rate-limit errors from this wording
        message = f"{message} Please try again in {wait:g}s."
    return code or etype, etype, message


def render_error(err: ConversionError) -> WireResponse:
    status, etype, code = ERRORS[err.kind]
    _, _, message = _error_fields(err)
    param = err.param if err.param is not None else ("input" if err.kind == "context_length" else None)
    headers = {"content-type": "application/json"} | err.retry_headers()
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return WireResponse(status, headers, dumps(body).encode())

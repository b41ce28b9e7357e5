"""Anthropic Messages responses: message state, SSE stream encoder, JSON body and error shape.

Contract
--------
One reducer, :func:`advance`, folds canonical stream events into one :class:`MessageState` and
returns the wire events (plain dicts) the step produced. :class:`AnthropicStreamEncoder` serialises them
as Server-Sent Events with ``event:`` lines, as the vendor does; :func:`render_message` feeds
``completion_events(completion)`` through the same reducer and renders the final state once, so
streamed and non-streamed messages cannot disagree.

Grammar emitted (one content block open at a time, blocks numbered from 0)::

    message_start
    ( content_block_start  content_block_delta*  content_block_stop )*
    message_delta  message_stop                  | error (ends the stream)

A thinking block streams ``thinking_delta`` events and, just before it closes, one ``signature_delta``.
The canonical completion carries no signature, so we send :func:`thinking_signature`, a deterministic
token derived from the thinking text. A harness echoes it back next turn and the parser keeps it in
``ProviderState``.

Organisation: wire vocabulary; state dataclasses; the reducer and its builders; bodies and usage;
errors; encoder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, assert_never

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

# ----------------------------------------------------------------------------------------------- vocabulary

STOP_REASONS: Mapping[FinishReason, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
    # A failed generation should be sent as an error event; if it arrives as a finish, end the turn plainly.
    "error": "end_turn",
}

ERROR_TYPES: Mapping[ErrorKind, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "context_length": "invalid_request_error",
    "rate_limited": "rate_limit_error",
    "internal": "api_error",
    "unavailable": "api_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
}

SIGNATURE_PREFIX = "hrl1."

# ----------------------------------------------------------------------------------------------- state


@dataclass
class ThinkingBlock:
    pieces: list[str] = field(default_factory=list)  # joined once, at the end: linear, not quadratic
    kind: Literal["thinking"] = "thinking"


@dataclass
class TextBlock:
    pieces: list[str] = field(default_factory=list)
    kind: Literal["text"] = "text"


@dataclass
class ToolUseBlock:
    call_index: int  # the canonical tool-call index, not the block index
    id: str
    name: str
    pieces: list[str] = field(default_factory=list)  # the arguments' JSON text
    kind: Literal["tool_use"] = "tool_use"


Block: TypeAlias = ThinkingBlock | TextBlock | ToolUseBlock


@dataclass
class MessageState:
    """Everything sent so far for one message. ``open`` is the index of the block still open, if any.

    The reducer updates it in place (as the SDK's ``accumulate_event`` does with its snapshot), so a long
    message costs linear time; nothing outside this module mutates it.
    """

    id: str
    model: str
    input_tokens: int
    blocks: list[Block] = field(default_factory=list)
    open: int | None = None
    phase: Literal["streaming", "finished"] = "streaming"
    stop_reason: str | None = None
    usage: Usage | None = None


WireEvent: TypeAlias = dict[str, Any]

# ----------------------------------------------------------------------------------------------- reducer


def start(event: StreamStart) -> tuple[MessageState, list[WireEvent]]:
    """The state and ``message_start`` event for a new message."""
    state = MessageState(event.id, event.model, event.prompt_tokens)
    message: dict[str, Any] = {
        "id": event.id,
        "type": "message",
        "role": "assistant",
        "model": event.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "usage": {"input_tokens": event.prompt_tokens, "output_tokens": 0},
    }
    return state, [{"type": "message_start", "message": message}]


def advance(state: MessageState, event: StreamEvent) -> list[WireEvent]:
    """Fold one event into the state; return the wire events it produced. Raises on an impossible order."""
    if state.phase == "finished":
        raise ValueError(f"event {event.type!r} after the message finished")
    match event:
        case StreamStart():
            raise ValueError("a second StreamStart in one message")
        case TextDelta(text=text):
            return _append(state, TextBlock(), text) if text else []
        case ReasoningDelta(text=text):
            return _append(state, ThinkingBlock(), text) if text else []
        case ToolCallStarted():
            return _close(state) + _open(state, ToolUseBlock(event.index, event.id, event.name))
        case ToolCallDelta(index=index, arguments=arguments):
            _open_tool_use(state, index)
            return _append(state, None, arguments) if arguments else []
        case ToolCallEnded(index=index):
            _open_tool_use(state, index)
            return _close(state)
        case Finish():
            return _finish(state, event)
        case _:
            assert_never(event)


def _append(state: MessageState, fresh: Block | None, text: str) -> list[WireEvent]:
    """Append ``text`` to the open block, first opening ``fresh`` when the open block is of another kind."""
    out: list[WireEvent] = []
    current = state.blocks[state.open] if state.open is not None else None
    if fresh is not None and (current is None or current.kind != fresh.kind):
        out += _close(state) + _open(state, fresh)
        current = fresh
    assert state.open is not None and current is not None
    current.pieces.append(text)
    match current:
        case TextBlock():
            wire = {"type": "text_delta", "text": text}
        case ThinkingBlock():
            wire = {"type": "thinking_delta", "thinking": text}
        case ToolUseBlock():
            wire = {"type": "input_json_delta", "partial_json": text}
    out.append({"type": "content_block_delta", "index": state.open, "delta": wire})
    return out


def _open(state: MessageState, block: Block) -> list[WireEvent]:
    index = len(state.blocks)
    match block:
        case TextBlock():
            head: dict[str, Any] = {"type": "text", "text": ""}
        case ThinkingBlock():
            head = {"type": "thinking", "thinking": "", "signature": ""}
        case ToolUseBlock():
            head = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
    state.blocks.append(block)
    state.open = index
    return [{"type": "content_block_start", "index": index, "content_block": head}]


def _close(state: MessageState) -> list[WireEvent]:
    """Close the open block, if any. A thinking block gets its signature just before it stops."""
    if state.open is None:
        return []
    index, block = state.open, state.blocks[state.open]
    out: list[WireEvent] = []
    if isinstance(block, ThinkingBlock):
        delta = {"type": "signature_delta", "signature": thinking_signature("".join(block.pieces))}
        out.append({"type": "content_block_delta", "index": index, "delta": delta})
    out.append({"type": "content_block_stop", "index": index})
    state.open = None
    return out


def _open_tool_use(state: MessageState, index: int) -> None:
    block = state.blocks[state.open] if state.open is not None else None
    if not isinstance(block, ToolUseBlock) or block.call_index != index:
        # Anthropic streams one block at a time, so interleaved tool-call arguments have no wire form.
        raise ValueError(f"tool call {index} is not the open content block")


def _finish(state: MessageState, event: Finish) -> list[WireEvent]:
    out = _close(state)
    state.phase, state.stop_reason, state.usage = "finished", STOP_REASONS[event.reason], event.usage
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": state.stop_reason, "stop_sequence": None, "stop_details": None},
        # Cumulative totals: the SDK overwrites message_start's numbers with these.
        "usage": usage_json(event.usage),
    }
    return out + [delta, {"type": "message_stop"}]


def thinking_signature(thinking: str) -> str:
    """A deterministic stand-in for Anthropic's opaque signature: prefix + urlsafe sha256 of the thinking."""
    digest = hashlib.sha256(thinking.encode("utf-8")).digest()
    return SIGNATURE_PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


# ----------------------------------------------------------------------------------------------- bodies


def usage_json(usage: Usage) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens`` excludes cache reads, which are counted separately."""
    out: dict[str, Any] = {
        "input_tokens": max(usage.prompt_tokens - usage.cached_tokens, 0),
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }
    if usage.reasoning_tokens:
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return out


def block_json(block: Block) -> dict[str, Any]:
    """The finished form of one content block, as a non-streaming body carries it."""
    text = "".join(block.pieces)
    match block:
        case TextBlock():
            return {"type": "text", "text": text}
        case ThinkingBlock():
            return {"type": "thinking", "thinking": text, "signature": thinking_signature(text)}
        case ToolUseBlock():
            return {"type": "tool_use", "id": block.id, "name": block.name, "input": tool_input(text)}


def tool_input(arguments: str) -> dict[str, Any]:
    """Tool-call arguments as the JSON object Anthropic requires; anything else is an engine failure (500)."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as e:
        raise ConversionError("internal", f"tool call arguments are not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ConversionError("internal", f"tool call arguments must be a JSON object, got {type(value).__name__}")
    return value


def message_json(state: MessageState) -> dict[str, Any]:
    """The non-streaming message body for a finished state."""
    if state.phase != "finished" or state.usage is None:
        raise ValueError("the message has not finished")
    return {
        "id": state.id,
        "type": "message",
        "role": "assistant",
        "model": state.model,
        "content": [block_json(b) for b in state.blocks],
        "stop_reason": state.stop_reason,
        "stop_sequence": None,
        "stop_details": None,
        "usage": usage_json(state.usage),
    }


def render_message(completion: Completion) -> dict[str, Any]:
    """A completion as a non-streaming body: its events folded through :func:`advance`, rendered once."""
    first, *rest = completion_events(completion)
    assert isinstance(first, StreamStart)
    state, _ = start(first)
    for event in rest:
        advance(state, event)
    return message_json(state)


# ----------------------------------------------------------------------------------------------- errors


def error_json(err: ConversionError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES[err.kind], "message": error_message(err)}}


def error_message(err: ConversionError) -> str:
    """The message; context-length errors use Anthropic's wording.

    The canonical error carries no numbers, so the first two integers in its message are read as the prompt
    size and the limit ("9000 tokens exceed the 8192-token context"); without them the message is kept as is.
    """
    if err.kind != "context_length" or err.message.startswith("prompt is too long"):
        return err.message
    numbers = re.findall(r"\d+", err.message)
    if len(numbers) >= 2:
        return f"prompt is too long: {numbers[0]} tokens > {numbers[1]} maximum"
    return f"prompt is too long: {err.message}"


def render_error(err: ConversionError) -> WireResponse:
    headers = {"content-type": "application/json"} | err.retry_headers()
    return WireResponse(err.status, headers, dumps(error_json(err)).encode("utf-8"))


# ----------------------------------------------------------------------------------------------- encoder


class AnthropicStreamEncoder(StreamEncoder):
    """Canonical events in, Anthropic SSE bytes out; each event's bytes are returned as soon as it is fed."""

    def __init__(self) -> None:
        self._state: MessageState | None = None
        self._ended = False

    @property
    def content_type(self) -> str:
        return "text/event-stream; charset=utf-8"

    @property
    def state(self) -> MessageState | None:
        return self._state

    def feed(self, event: StreamEvent) -> bytes:
        if self._ended:
            raise ValueError(f"event {event.type!r} after the stream ended")
        if self._state is None:
            if not isinstance(event, StreamStart):
                raise ValueError(f"the first event must be StreamStart, got {event.type!r}")
            self._state, out = start(event)
        else:
            out = advance(self._state, event)
        self._ended = self._state.phase == "finished"
        return b"".join(sse(e, event=e["type"]) for e in out)

    def error(self, err: ConversionError) -> bytes:
        self._ended = True
        return sse(error_json(err), event="error")

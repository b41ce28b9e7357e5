"""Incremental output parser: sampled text deltas in, canonical stream events out.

Contract
--------
An :class:`OutputParser` is made per completion. ``feed(text_delta)`` returns the
:data:`~converters.canonical.StreamEvent` list that delta completes; ``finish(reason, usage)`` flushes what is
held back and ends with one :class:`~converters.canonical.Finish`. Feeding the same text split at any points
gives the same events once adjacent text / reasoning deltas are merged (the tests check every split point).

What the model writes is read through a :class:`ParserSpec` (the tags of one model family; default ``<think>``
… ``</think>`` and ``<tool_call>`` … ``</tool_call>`` with a JSON body ``{"name": ..., "arguments": {...}}``):

* plain text streams out at once as ``TextDelta``, except a possible partial tag at the end of what has
  arrived (``"<too"`` may become ``"<tool_call>"``) and trailing whitespace, both held back until the next
  character decides;
* text inside the think tags is ``ReasoningDelta`` (tool tags there are reasoning, not calls);
* a tool-call span is buffered to its close tag, then parsed. A valid call gives ``ToolCallStarted`` +
  ``ToolCallDelta`` (compact JSON arguments) + ``ToolCallEnded``; a body may also hold a JSON array of calls.
  A malformed body, a call to a tool the request did not offer (the allow-list), or a span still open at the
  end is sent as ``TextDelta`` of the raw span and recorded in ``ParserState.malformed`` so the addon can
  record it;
* whitespace touching a tag or either end of the output separates spans and is dropped, so ``"\\n\\n"``
  between ``</think>`` and the answer, or between two calls, does not become a text block of its own;
* an unclosed think span at the end is reasoning; ``finish("stop")`` becomes ``"tool_calls"`` when calls were
  emitted.

Custom (free-text) tools: the renderer offers them as a function with one string argument ``input``; a call's
``arguments`` may be ``{"input": "..."}`` or a bare JSON string, and the free text is what the event carries.

Organisation: spec and call ids; state; the pure step functions (:func:`step`, :func:`flush`); call parsing;
the :class:`OutputParser` wrapper that holds the state between deltas.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

from converters.base import dumps
from converters.canonical import (
    Finish,
    FinishReason,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
)

CallKind: TypeAlias = Literal["function", "custom"]
CallIds: TypeAlias = Callable[[int], str]
"""Maps a tool call's index within the completion to its id. Must be a pure function of the index."""


@dataclass(frozen=True)
class ParserSpec:
    """The tags one model family writes around reasoning and tool calls."""

    think_open: str = "<think>"
    think_close: str = "</think>"
    tool_open: str = "<tool_call>"
    tool_close: str = "</tool_call>"

    def __post_init__(self) -> None:
        tags = (self.think_open, self.think_close, self.tool_open, self.tool_close)
        if any(not t or t != t.strip() for t in tags):
            raise ValueError(f"ParserSpec tags must be non-empty and carry no surrounding whitespace: {tags!r}")
        if len(set(tags)) != len(tags):
            raise ValueError(f"ParserSpec tags must be distinct: {tags!r}")


def seeded_call_ids(seed: str | int) -> CallIds:
    """Deterministic ids ``call_<24 hex>`` derived from ``seed`` and the call index (tests, replays)."""

    def call_id(index: int) -> str:
        return "call_" + hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:24]

    return call_id


def random_call_ids() -> CallIds:
    """Ids ``call_<24 hex>`` from the OS random source, fixed per completion by one random seed."""
    return seeded_call_ids(secrets.token_hex(16))


# ---------------------------------------------------------------------------------------------------- state

Mode: TypeAlias = Literal["text", "reasoning", "tool_call", "done"]


@dataclass(frozen=True)
class MalformedToolCall:
    """A tool-call span that was sent back as text. ``raw`` is the span as sampled, tags included."""

    raw: str
    reason: str


@dataclass(frozen=True)
class ParserConfig:
    """What stays fixed for one completion: the tags, the allow-list and the id source."""

    spec: ParserSpec = field(default_factory=ParserSpec)
    # tool name -> kind; None accepts any name as a function call (no allow-list).
    allowed: Mapping[str, CallKind] | None = None
    call_ids: CallIds = field(default_factory=random_call_ids)


@dataclass(frozen=True)
class ParserState:
    """Where the parser is. ``buffer`` holds text not yet decided (text/reasoning) or the open call's body."""

    mode: Mode = "text"
    buffer: str = ""
    at_boundary: bool = True  # just after the start or a tag: leading whitespace is dropped
    scanned: int = 0  # tool_call mode: no close tag starts before this offset of ``buffer``
    calls: int = 0  # tool calls emitted
    malformed: tuple[MalformedToolCall, ...] = ()

    @property
    def malformed_tool_calls(self) -> int:
        return len(self.malformed)


# ---------------------------------------------------------------------------------------------------- steps


def step(state: ParserState, delta: str, config: ParserConfig) -> tuple[ParserState, list[StreamEvent]]:
    """Consume one text delta. Pure: returns the new state and the events the delta completed."""
    if state.mode == "done":
        raise ValueError("feed() after finish()")
    state = _rebuffered(state, state.buffer + delta, state.at_boundary)
    events: list[StreamEvent] = []
    while True:
        state, progressed = _advance(state, config, events)
        if not progressed:
            return state, events


def flush(
    state: ParserState, config: ParserConfig, reason: FinishReason, usage: Usage
) -> tuple[ParserState, list[StreamEvent]]:
    """End of output: emit what is held back, close or give back open spans, then ``Finish``."""
    if state.mode == "done":
        raise ValueError("finish() called twice")
    events: list[StreamEvent] = []
    spec = config.spec
    rest = state.buffer.rstrip()
    if state.mode == "text" and rest:
        events.append(TextDelta(rest))
    elif state.mode == "reasoning" and rest:
        events.append(ReasoningDelta(rest))
    elif state.mode == "tool_call":
        raw = spec.tool_open + state.buffer.rstrip()
        events.append(TextDelta(raw))
        state = replace(state, malformed=state.malformed + (MalformedToolCall(raw, "tool call not closed"),))
    if reason == "stop" and state.calls:
        reason = "tool_calls"
    events.append(Finish(reason, usage))
    return replace(state, mode="done", buffer=""), events


def _advance(state: ParserState, config: ParserConfig, events: list[StreamEvent]) -> tuple[ParserState, bool]:
    """One move: consume through the next complete tag (True), or emit what is safe to emit (False)."""
    spec = config.spec
    if state.mode == "tool_call":
        end = state.buffer.find(spec.tool_close, state.scanned)
        if end < 0:  # remember how far we looked, so a long call body is not rescanned per delta
            return replace(state, scanned=max(0, len(state.buffer) - len(spec.tool_close) + 1)), False
        raw = spec.tool_open + state.buffer[:end] + spec.tool_close
        state = _emit_calls(state, state.buffer[:end], raw, config, events)
        rest = state.buffer[end + len(spec.tool_close) :]
        return replace(state, mode="text", buffer=rest, at_boundary=True, scanned=0), True
    tags = (spec.think_open, spec.tool_open) if state.mode == "text" else (spec.think_close,)
    buffer = state.buffer.lstrip() if state.at_boundary else state.buffer
    hit = _first_tag(buffer, tags)
    if hit is not None:
        pos, tag = hit
        _emit_span(state.mode, buffer[:pos].rstrip(), events)
        mode: Mode = "reasoning" if tag == spec.think_open else "tool_call" if tag == spec.tool_open else "text"
        return replace(state, mode=mode, buffer=buffer[pos + len(tag) :], at_boundary=True), True
    keep = _held_back(buffer, tags)
    out = buffer[: len(buffer) - keep]
    _emit_span(state.mode, out, events)
    return _rebuffered(state, buffer[len(out) :], state.at_boundary and not out), False


def _rebuffered(state: ParserState, buffer: str, at_boundary: bool) -> ParserState:
    """``state`` with a new buffer: the two moves every text delta makes. A direct construction, as
    ``dataclasses.replace`` (which walks the fields) costs about twice as much, twice per sampled token."""
    return ParserState(
        mode=state.mode,
        buffer=buffer,
        at_boundary=at_boundary,
        scanned=state.scanned,
        calls=state.calls,
        malformed=state.malformed,
    )


def _emit_span(mode: Mode, text: str, events: list[StreamEvent]) -> None:
    if text:
        events.append(TextDelta(text) if mode == "text" else ReasoningDelta(text))


def _first_tag(buffer: str, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """The earliest complete tag in ``buffer`` (the longer one on a tie)."""
    found = [(pos, -len(t), t) for t in tags if (pos := buffer.find(t)) >= 0]
    if not found:
        return None
    pos, _, tag = min(found)
    return pos, tag


def _held_back(buffer: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters to hold: a possible partial tag and the whitespace before it or at the end."""
    partial = 0
    # a partial tag at the end starts with the tag's first character: where none is there (most deltas), skip the
    # suffix comparisons (~4 us of the ~10 us this parser spent per token)
    if any(t[0] in buffer[1 - len(t) :] for t in tags):
        partial = max((k for t in tags for k in range(1, len(t)) if buffer.endswith(t[:k])), default=0)
    head = buffer[: len(buffer) - partial]
    return partial + len(head) - len(head.rstrip())


# ----------------------------------------------------------------------------------------------- tool calls


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # compact JSON (function) or free text (custom)
    kind: CallKind


def _emit_calls(
    state: ParserState, body: str, raw: str, config: ParserConfig, events: list[StreamEvent]
) -> ParserState:
    """Emit the calls of one closed span, or the raw span as text when any part of it is malformed."""
    parsed = parse_tool_calls(body, config.allowed)
    if isinstance(parsed, str):
        events.append(TextDelta(raw))
        return replace(state, malformed=state.malformed + (MalformedToolCall(raw, parsed),))
    index = state.calls
    for call in parsed:
        events.append(ToolCallStarted(index, config.call_ids(index), call.name, call.kind))
        if call.arguments:
            events.append(ToolCallDelta(index, call.arguments))
        events.append(ToolCallEnded(index))
        index += 1
    return replace(state, calls=index)


def parse_tool_calls(body: str, allowed: Mapping[str, CallKind] | None) -> list[ParsedCall] | str:
    """The calls in one span body (an object, or an array of objects), or the reason it is malformed."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        return f"body is not JSON: {e}"
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        return "empty list of calls"
    calls: list[ParsedCall] = []
    for item in items:
        call = _parse_one(item, allowed)
        if isinstance(call, str):
            return call
        calls.append(call)
    return calls


def _parse_one(item: Any, allowed: Mapping[str, CallKind] | None) -> ParsedCall | str:
    if not isinstance(item, dict):
        return f"call is a {type(item).__name__}, not an object"
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return "call has no string name"
    if allowed is not None and name not in allowed:
        return f"unknown tool {name!r}"
    kind: CallKind = allowed[name] if allowed is not None else "function"
    args = item.get("arguments", {})
    if kind == "custom":
        if isinstance(args, str):
            return ParsedCall(name, args, kind)
        if isinstance(args, dict) and set(args) == {"input"} and isinstance(args["input"], str):
            return ParsedCall(name, args["input"], kind)
        return f"custom tool {name!r} needs a string input"
    if isinstance(args, str):
        # Some models write the arguments as a JSON string of an object, as the OpenAI wire format does.
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f"arguments of {name!r} are a string that is not JSON"
    if not isinstance(args, dict):
        return f"arguments of {name!r} are not an object"
    return ParsedCall(name, dumps(args), kind)


# -------------------------------------------------------------------------------------------------- wrapper


class OutputParser:
    """Holds one completion's :class:`ParserState` between deltas; see the module docstring."""

    def __init__(
        self,
        spec: ParserSpec | None = None,
        *,
        allowed: Mapping[str, CallKind] | None = None,
        call_ids: CallIds | None = None,
    ) -> None:
        self.config = ParserConfig(spec=spec or ParserSpec(), allowed=allowed, call_ids=call_ids or random_call_ids())
        self.state = ParserState()

    def feed(self, text_delta: str) -> list[StreamEvent]:
        self.state, events = step(self.state, text_delta, self.config)
        return events

    def finish(self, reason: FinishReason, usage: Usage) -> list[StreamEvent]:
        self.state, events = flush(self.state, self.config, reason, usage)
        return events

    @property
    def malformed(self) -> tuple[MalformedToolCall, ...]:
        return self.state.malformed

    @property
    def malformed_tool_calls(self) -> int:
        return self.state.malformed_tool_calls

    @property
    def tool_calls(self) -> int:
        return self.state.calls

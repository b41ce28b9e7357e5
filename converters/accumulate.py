"""Fold canonical stream events into a :class:`~converters.canonical.Completion` (the inverse of
``completion_events``).

Contract: ``Accumulator.feed(event)`` raises ``ValueError`` on an impossible order (an event before
``StreamStart``, argument deltas for a call that never started, anything after ``Finish``); ``completion`` gives
the result so far, and equals the input of ``completion_events`` when fed its output.
"""

from __future__ import annotations

from dataclasses import replace
from typing import assert_never

from converters.canonical import (
    Completion,
    Finish,
    ReasoningDelta,
    StreamEvent,
    StreamStart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
)


class Accumulator:
    """Feed events one at a time; ``completion`` is the result so far. Text is kept as lists of pieces so a long
    completion costs linear time, not quadratic."""

    def __init__(self) -> None:
        self._start: StreamStart | None = None
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[tuple[ToolCallStarted, list[str]]] = []
        self._open: set[int] = set()
        self._finish: Finish | None = None

    def feed(self, event: StreamEvent) -> None:
        if self._finish is not None:
            raise ValueError(f"{event.type} after finish")
        if isinstance(event, StreamStart):
            if self._start is not None:
                raise ValueError("second stream start")
            self._start = event
            return
        if self._start is None:
            raise ValueError(f"{event.type} before stream start")
        if isinstance(event, TextDelta):
            self._text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self._reasoning.append(event.text)
        elif isinstance(event, ToolCallStarted):
            if event.index != len(self._calls):
                raise ValueError(f"tool call {event.index} started, expected index {len(self._calls)}")
            self._calls.append((event, []))
            self._open.add(event.index)
        elif isinstance(event, ToolCallDelta):
            if event.index not in self._open:
                raise ValueError(f"arguments for tool call {event.index}, which is not open")
            self._calls[event.index][1].append(event.arguments)
        elif isinstance(event, ToolCallEnded):
            if event.index not in self._open:
                raise ValueError(f"tool call {event.index} ended but is not open")
            self._open.discard(event.index)
        elif isinstance(event, Finish):
            self._finish = event
        else:
            assert_never(event)

    def feed_all(self, events: list[StreamEvent]) -> None:
        for event in events:
            self.feed(event)

    @property
    def finished(self) -> bool:
        return self._finish is not None

    @property
    def completion(self) -> Completion:
        if self._start is None:
            raise ValueError("no stream start yet")
        calls = tuple(ToolCall(s.id, s.name, "".join(args), s.kind) for s, args in self._calls)
        c = Completion(
            id=self._start.id,
            model=self._start.model,
            created=self._start.created,
            text="".join(self._text),
            reasoning="".join(self._reasoning),
            tool_calls=calls,
        )
        if self._finish is not None:
            c = replace(c, finish_reason=self._finish.reason, usage=self._finish.usage)
        return c

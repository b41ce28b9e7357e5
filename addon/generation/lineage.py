"""What a call's place in its session is made of: why a call forks, the splice plan it gets, the context a lineage
shares, and the canonical keys that compare histories across wire formats.

Contract
--------
* :data:`ForkReason` / :data:`FORK_REASONS`: why a call does not extend its parent (the record's ``fork_reason``).
* :class:`SplicePlan`: the prompt ids for one call and how they relate to earlier calls of the session.
* :class:`Context`: the leading instructions and tools every turn of one lineage shares, compared cheaply first and
  canonically when that fails; its rendered head is cached per :class:`~addon.generation.render.PromptRenderer`.
* :func:`message_key` / :func:`assistant_key` / :func:`same_message`: a message canonically — provider state
  (signatures, cache_control, item ids) ignored, tool arguments compared as parsed JSON, developer == system.
* :func:`assistant_message`: the canonical assistant message the proxy returned for a completion.

Pure data and functions: no tokenizer calls except :meth:`Context.head`'s one render, no I/O. Both
:mod:`addon.generation.session_graph` (which stores plans and contexts) and :mod:`addon.generation.splice` (which
makes them) import this module; neither imports the other's types through it, so there is no import cycle.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, TypeAlias, get_args

from addon.generation.parser import CallKind
from addon.generation.render import PromptRenderer, TemplateInput, ToolMode, render_messages
from converters.canonical import (
    Completion,
    ImagePart,
    Message,
    ModelRequest,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolSpec,
)

ForkReason: TypeAlias = Literal[
    "first_call",  # nothing earlier in the session
    "history_rewritten",  # earlier messages changed (compaction, edits)
    "reasoning_dropped",  # the harness sent the turn back without its reasoning, which the template renders
    "tools_changed",
    "instructions_changed",  # leading system/developer text differs (sub-agents)
    "auxiliary",  # a side request (title, classifier): never spliced
    "length_cut",  # the parent was cut by max tokens and length_policy is "fork"
    "template_not_prefix",  # the template does not render the shared history as a prefix
]
FORK_REASONS: tuple[ForkReason, ...] = get_args(ForkReason)
SpliceReason: TypeAlias = Literal["extends"] | ForkReason


@dataclass(frozen=True)
class SplicePlan:
    """The prompt for one call and how it relates to earlier calls of the session."""

    prompt_ids: Sequence[int]  # a tuple, or FrozenIds over ``packed`` when the splice built the ids packed
    reason: SpliceReason
    parent_call_id: str | None
    reused_tokens: int  # leading prompt ids taken verbatim from the parent's prompt + completion
    suffix_text: str  # the text tokenised for this call (the whole prompt text for a new root)
    mode: ToolMode
    tool_kinds: tuple[tuple[str, CallKind], ...]
    retry_of: str | None = None  # a sibling: the earlier call with the same messages
    # The same ids already packed, when splicing built them so: the session graph holds this array instead of
    # packing the tuple again (an O(prompt) pass per call). Never kept on a graph node's plan (memory).
    packed: array[int] | None = field(default=None, compare=False, repr=False)

    @property
    def fork_reason(self) -> ForkReason | None:
        """The record's ``fork_reason``: set only with a parent (``CallRecord`` requires that)."""
        if self.reason == "extends" or self.parent_call_id is None:
            return None
        return self.reason

    def allowed_tools(self) -> dict[str, CallKind]:
        return dict(self.tool_kinds)


# --------------------------------------------------------------------------------------------- canonical keys
# Keys survive each format's round trip: provider state (signatures, cache_control, item ids) is ignored, tool
# arguments compare as parsed JSON, developer == system. Text compares exactly.


def _args_key(part: ToolCallPart) -> str:
    if part.kind == "custom":
        return part.arguments
    return json.dumps(part.parsed_arguments(), sort_keys=True, ensure_ascii=False)


def _part_key(part: Part) -> tuple[Any, ...]:
    if isinstance(part, TextPart):
        return ("text", part.text)
    if isinstance(part, ImagePart):
        return ("image", part.source, part.data, part.media_type)
    if isinstance(part, ReasoningPart):
        return ("reasoning", part.text)
    if isinstance(part, ToolCallPart):
        return ("call", part.id, part.name, part.kind, _args_key(part))
    return ("result", part.call_id, part.is_error, part.kind, tuple(_part_key(p) for p in part.content))


def message_key(msg: Message, *, keep_reasoning: bool = True) -> tuple[Any, ...]:
    """A history message, canonically (assistant turns via :func:`assistant_key`)."""
    if msg.role == "assistant":
        return ("assistant", assistant_key(msg, keep_reasoning=keep_reasoning))
    role = "system" if msg.role == "developer" else msg.role
    return (role, tuple(_part_key(p) for p in msg.parts))


def assistant_key(msg: Message, *, keep_reasoning: bool = True) -> tuple[str, str, tuple[tuple[Any, ...], ...]]:
    """(reasoning, text, calls): fragments joined, order between kinds ignored (formats order blocks differently),
    redacted reasoning (no text) left out."""
    reasoning = "".join(p.text for p in msg.parts if isinstance(p, ReasoningPart)) if keep_reasoning else ""
    text = "".join(p.text for p in msg.parts if isinstance(p, TextPart))
    calls = tuple(_part_key(p) for p in msg.parts if isinstance(p, ToolCallPart))
    return reasoning, text, calls


def same_message(a: Message, b: Message, *, keep_reasoning: bool = True) -> bool:
    if a == b:
        return True
    return message_key(a, keep_reasoning=keep_reasoning) == message_key(b, keep_reasoning=keep_reasoning)


def assistant_message(completion: Completion) -> Message:
    """The canonical assistant message the proxy returned for ``completion``."""
    parts: list[Part] = [ReasoningPart(completion.reasoning)] if completion.reasoning else []
    if completion.text:
        parts.append(TextPart(completion.text))
    parts.extend(ToolCallPart(c.id, c.name, c.arguments, c.kind) for c in completion.tool_calls)
    return Message("assistant", tuple(parts))


def _lead(messages: Sequence[Message]) -> int:
    n = 0
    while n < len(messages) and messages[n].role in ("system", "developer"):
        n += 1
    return n


def _tool_key(tool: ToolSpec) -> tuple[Any, ...]:
    params = json.dumps(tool.parameters, sort_keys=True, default=str)
    return (tool.name, tool.description, tool.kind, params, tuple(_tool_key(t) for t in tool.tools))


@dataclass(frozen=True, eq=False)
class Context:
    """What every turn of one lineage shares: the leading instructions and the tools offered. Compared as given
    first (cheap), canonically when that fails. A call that extends its parent shares the parent's object, so the
    canonical keys and the rendered head are computed once per lineage."""

    lead: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    tool_choice: ToolChoice | None
    _heads: dict[int, TemplateInput] = field(default_factory=dict, repr=False)  # id(renderer) -> rendered head

    @classmethod
    def of(cls, request: ModelRequest) -> Context:
        return cls(request.messages[: _lead(request.messages)], request.tools, request.tool_choice)

    @cached_property
    def instructions_key(self) -> tuple[tuple[Any, ...], ...]:
        return tuple(message_key(m) for m in self.lead)

    @cached_property
    def tools_key(self) -> tuple[Any, ...]:
        return tuple(_tool_key(t) for t in self.tools), repr(self.tool_choice)

    def same_instructions(self, other: Context) -> bool:
        return self.lead == other.lead or self.instructions_key == other.instructions_key

    def same_tools(self, other: Context) -> bool:
        if self.tools == other.tools and self.tool_choice == other.tool_choice:
            return True
        return self.tools_key == other.tools_key

    def same(self, other: Context) -> bool:
        return self is other or (self.same_instructions(other) and self.same_tools(other))

    def head(self, renderer: PromptRenderer, request: ModelRequest) -> TemplateInput:
        """The template's system message and tools for this context (rendered once)."""
        head = self._heads.get(id(renderer))
        if head is None:
            head = render_messages(replace(request, messages=self.lead), renderer.capabilities, renderer.spec)
            self._heads[id(renderer)] = head
        return head

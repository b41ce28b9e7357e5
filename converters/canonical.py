"""The canonical model: one typed conversation and one typed completion for all four wire formats.

Contract
--------
Every wire format (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, Gemini) parses a request into a
:class:`ModelRequest` and renders a :class:`Completion` (or a stream of :data:`StreamEvent`) back. Nothing here knows
a wire format; the dialect modules do. All classes are frozen dataclasses with a ``Literal`` tag where a union is
discriminated, so ``match`` statements over them are exhaustive and checkable.

Organisation: content parts -> messages -> tools / tool choice / sampling / output format -> request;
completion and its parts; stream events. Errors (:class:`ConversionError`, :class:`WireResponse`) are in
:mod:`converters.errors`, re-exported here.

Opaque provider state (Anthropic thinking signatures, Gemini ``thoughtSignature``, Responses ``encrypted_content``,
tool kinds we do not interpret) travels in :class:`ProviderState` so that a harness gets back exactly what it needs
on the next turn. It is opaque on purpose: converters copy it, never interpret it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, TypeAlias

import msgspec

# the model's errors live in converters/errors.py; re-exported here, where every converter imports them from
from converters.errors import ERROR_STATUS as ERROR_STATUS
from converters.errors import RETRYABLE_KINDS as RETRYABLE_KINDS
from converters.errors import ConversionError as ConversionError
from converters.errors import ErrorKind as ErrorKind
from converters.errors import WireResponse as WireResponse

_SORTED_JSON = msgspec.json.Encoder(order="sorted")


def json_text(value: Any) -> bytes:
    """The JSON text of a JSON-compatible value with sorted keys: what tells ``1``, ``1.0``, ``true`` and ``-0.0``
    apart (equal to Python, not to JSON). msgspec writes a tool schema's text ~7x as fast as
    ``json.dumps(sort_keys=True)``; values msgspec does not encode (non-JSON types, mixed key types) go through
    ``json.dumps``."""
    try:
        return _SORTED_JSON.encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):  # EncodeError is none of the others
        return json.dumps(value, sort_keys=True, default=str).encode()


def json_hash(value: Any) -> int:
    """A hash of a JSON-compatible value through :func:`json_text`. The mappings that hold JSON (tool schemas,
    provider state) are not hashable themselves."""
    return hash(json_text(value))


def _same_json(a: Any, b: Any, a_text: bytes, b_text: bytes) -> bool:
    """``a`` and ``b`` (with their :func:`json_text`) are the same JSON: equal to Python (so NaN, which both encoders
    write as something else, is never equal to that) and the same text (so ``1`` and ``1.0`` differ)."""
    return a is b or (a == b and a_text == b_text)


WireFormat: TypeAlias = Literal["chat", "responses", "anthropic", "gemini"]
WIRE_FORMATS: tuple[WireFormat, ...] = ("chat", "responses", "anthropic", "gemini")


@dataclass(frozen=True)
class ProviderState:
    """Opaque data a provider asked to be sent back unchanged (signatures, encrypted reasoning, unknown items).

    ``format`` says whose state it is; only the same format renders it back. ``data`` is JSON-compatible.
    """

    format: WireFormat
    data: Mapping[str, Any]

    # Equal means the same JSON, not only equal to Python ({"n": 1} == {"n": 1.0}): the records' encoding cache
    # (addon/records/blobs.py) reuses a previous call's text for an equal message. The text is computed once per
    # object (a frozen dataclass keeps it in its __dict__, outside the fields).
    @cached_property
    def _json(self) -> bytes:
        return json_text(self.data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProviderState):
            return NotImplemented
        return self is other or (
            self.format == other.format and _same_json(self.data, other.data, self._json, other._json)
        )

    def __hash__(self) -> int:  # Mapping is unhashable; hash its canonical JSON.
        return hash((self.format, self._json))


# --------------------------------------------------------------------------------------------------- content parts


@dataclass(frozen=True)
class TextPart:
    text: str
    type: Literal["text"] = "text"
    # e.g. Anthropic cache_control; recorded and rendered back by the same format only.
    provider_state: ProviderState | None = None


@dataclass(frozen=True)
class ImagePart:
    """An image reference. ``source`` says how ``data`` is to be read."""

    source: Literal["url", "base64", "file_id"]
    data: str
    media_type: str | None = None
    type: Literal["image"] = "image"


@dataclass(frozen=True)
class ReasoningPart:
    """Model reasoning. ``text`` may be empty when only opaque state exists (redacted / encrypted reasoning)."""

    text: str
    provider_state: ProviderState | None = None
    type: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True)
class ToolCallPart:
    """A call the assistant made. ``arguments`` is JSON text (function tools) or free text (custom tools)."""

    id: str
    name: str
    arguments: str
    kind: Literal["function", "custom"] = "function"
    provider_state: ProviderState | None = None
    type: Literal["tool_call"] = "tool_call"

    def parsed_arguments(self) -> Any:
        """Arguments as parsed JSON, or the raw text when they are not JSON (custom tools, malformed calls)."""
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError:
            return self.arguments


ResultContent: TypeAlias = TextPart | ImagePart


@dataclass(frozen=True)
class ToolResultPart:
    """The output of a tool call, sent back by the harness."""

    call_id: str
    content: tuple[ResultContent, ...]
    is_error: bool = False
    name: str | None = None  # Gemini identifies results by function name
    kind: Literal["function", "custom"] = "function"
    provider_state: ProviderState | None = None
    type: Literal["tool_result"] = "tool_result"

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


Part: TypeAlias = TextPart | ImagePart | ReasoningPart | ToolCallPart | ToolResultPart

Role: TypeAlias = Literal["system", "developer", "user", "assistant", "tool"]


@dataclass(frozen=True)
class Message:
    """One turn. ``system``/``developer`` messages are instructions; they may appear mid-conversation."""

    role: Role
    parts: tuple[Part, ...]
    provider_state: ProviderState | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


# --------------------------------------------------------------------------------------------------- tools


ToolKind: TypeAlias = Literal["function", "custom", "namespace", "builtin"]


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call.

    ``function``: ``parameters`` is a JSON schema. ``custom``: free-text input (Responses custom tools; ``grammar``
    in ``provider_state``). ``namespace``: a group of ``tools`` (Codex). ``builtin``: a provider-hosted tool
    (``web_search`` …) the model cannot run here; it is kept for the record and rendered back to its own format.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None
    kind: ToolKind = "function"
    strict: bool | None = None
    tools: tuple[ToolSpec, ...] = ()
    provider_state: ProviderState | None = None

    @cached_property
    def _json(self) -> bytes:  # the schema's text, once per object: equal means the same JSON (see ProviderState)
        return json_text(self.parameters)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolSpec):
            return NotImplemented
        return self is other or (
            self.name == other.name
            and self.description == other.description
            and self.kind == other.kind
            and self.strict == other.strict
            and self.tools == other.tools
            and self.provider_state == other.provider_state
            and _same_json(self.parameters, other.parameters, self._json, other._json)
        )

    def __hash__(self) -> int:
        return hash((self.name, self.kind, self._json))


@dataclass(frozen=True)
class ToolChoiceMode:
    mode: Literal["auto", "none", "required"]
    type: Literal["mode"] = "mode"


@dataclass(frozen=True)
class ToolChoiceNamed:
    name: str
    type: Literal["named"] = "named"


ToolChoice: TypeAlias = ToolChoiceMode | ToolChoiceNamed


# --------------------------------------------------------------------------------------------------- request


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asked for. ``None`` means the caller did not say."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


@dataclass(frozen=True)
class TextFormat:
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class JsonObjectFormat:
    type: Literal["json_object"] = "json_object"


@dataclass(frozen=True)
class JsonSchemaFormat:
    schema: Mapping[str, Any]
    name: str = "output"
    strict: bool | None = None
    type: Literal["json_schema"] = "json_schema"

    @cached_property
    def _json(self) -> bytes:  # equal means the same JSON (see ProviderState)
        return json_text(self.schema)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JsonSchemaFormat):
            return NotImplemented
        return self is other or (
            self.name == other.name
            and self.strict == other.strict
            and _same_json(self.schema, other.schema, self._json, other._json)
        )

    def __hash__(self) -> int:
        return hash((self.name, self._json))


OutputFormat: TypeAlias = TextFormat | JsonObjectFormat | JsonSchemaFormat


@dataclass(frozen=True)
class ReasoningRequest:
    """What the caller asked of reasoning: Anthropic thinking, Responses reasoning, Gemini thinkingConfig."""

    enabled: bool | None = None
    effort: str | None = None
    budget_tokens: int | None = None
    include_in_output: bool | None = None  # Gemini includeThoughts / Responses summary


@dataclass(frozen=True)
class IdentityHints:
    """What the request says about who sent it. Recorded, never trusted for session attribution."""

    headers: Mapping[str, str] = field(default_factory=dict)  # session-like headers, lower-cased names
    user_id: str | None = None
    session_id: str | None = None  # e.g. from a metadata.user_id JSON string
    prompt_cache_key: str | None = None
    user_agent: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.headers.items())), self.user_id, self.session_id, self.prompt_cache_key))


@dataclass(frozen=True)
class ModelRequest:
    """A model call, canonical. ``extras`` keeps accepted-but-uninterpreted fields (``thinking``,
    ``context_management``, ``output_config`` …) for the record, keyed by their wire name."""

    format: WireFormat
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    include_usage: bool = False  # Chat stream_options.include_usage
    output_format: OutputFormat = field(default_factory=TextFormat)
    reasoning: ReasoningRequest | None = None
    identity: IdentityHints = field(default_factory=IdentityHints)
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.format, self.model, self.messages, self.tools))


# --------------------------------------------------------------------------------------------------- completion

FinishReason: TypeAlias = Literal["stop", "length", "tool_calls", "content_filter", "error"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text for function tools, free text for custom tools
    kind: Literal["function", "custom"] = "function"


@dataclass(frozen=True)
class Completion:
    """What the model produced for one call, after parsing reasoning and tool calls out of the sampled text."""

    id: str
    model: str
    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    created: int = 0  # unix seconds


# --------------------------------------------------------------------------------------------------- stream events


@dataclass(frozen=True)
class StreamStart:
    """First event of every stream. ``prompt_tokens`` is known before sampling starts."""

    id: str
    model: str
    created: int
    prompt_tokens: int = 0
    type: Literal["start"] = "start"


@dataclass(frozen=True)
class TextDelta:
    text: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str
    type: Literal["reasoning_delta"] = "reasoning_delta"


@dataclass(frozen=True)
class ToolCallStarted:
    """A tool call begins. ``index`` counts tool calls from 0 within the completion."""

    index: int
    id: str
    name: str
    kind: Literal["function", "custom"] = "function"
    type: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    arguments: str
    type: Literal["tool_call_delta"] = "tool_call_delta"


@dataclass(frozen=True)
class ToolCallEnded:
    index: int
    type: Literal["tool_call_ended"] = "tool_call_ended"


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    usage: Usage
    type: Literal["finish"] = "finish"


StreamEvent: TypeAlias = (
    StreamStart | TextDelta | ReasoningDelta | ToolCallStarted | ToolCallDelta | ToolCallEnded | Finish
)


def completion_events(completion: Completion, prompt_tokens: int | None = None) -> list[StreamEvent]:
    """The event sequence equivalent to a finished completion (reasoning, text, then tool calls)."""
    events: list[StreamEvent] = [
        StreamStart(
            completion.id,
            completion.model,
            completion.created,
            completion.usage.prompt_tokens if prompt_tokens is None else prompt_tokens,
        )
    ]
    if completion.reasoning:
        events.append(ReasoningDelta(completion.reasoning))
    if completion.text:
        events.append(TextDelta(completion.text))
    for i, call in enumerate(completion.tool_calls):
        events.append(ToolCallStarted(i, call.id, call.name, call.kind))
        if call.arguments:
            events.append(ToolCallDelta(i, call.arguments))
        events.append(ToolCallEnded(i))
    events.append(Finish(completion.finish_reason, completion.usage))
    return events

"""Anthropic Messages (``POST /v1/messages``, also ``?beta=true``) to and from the canonical model.

Contract
--------
:class:`AnthropicDialect` parses a Messages request into a canonical ``ModelRequest`` and renders one back
(:mod:`converters.anthropic_render` is the inverse of parsing for every request Anthropic can express).
Responses, streams and errors live in :mod:`converters.anthropic_stream`. Decisions worth knowing:

* ``system`` (string or text blocks) becomes one leading ``system`` message; a ``role: "system"``
  message in ``messages`` (Claude Code's mid-conversation-system beta) stays where it is. Tool results
  stay inside their user message, in order, as ``ToolResultPart``.
* ``cache_control``/``citations`` on blocks, ``signature`` of thinking, redacted thinking and whole
  server tools (``web_search_20250305`` ...) are kept opaque in ``ProviderState`` and rendered back
  unchanged.
* ``max_tokens`` is required because Anthropic requires it (400 otherwise): a harness that works here
  also works against the vendor. Blocks we cannot represent (``document``, server tool results ...) and
  ``mcp_servers`` are a 400 naming them. Unknown fields are logged once through ``UnknownFields`` and
  ignored.
* ``thinking``, ``output_config``, ``context_management``, ``metadata``, ``service_tier`` ... are kept
  verbatim in ``extras``; ``thinking`` and ``output_config`` are also interpreted (``reasoning``,
  ``output_format``), and those canonical values win when rendering. ``metadata.user_id`` as a JSON
  string (Claude Code) or in the older ``user_..._session_<uuid>`` form gives
  ``IdentityHints.session_id``.

Organisation: field vocabularies; parsing (top level, messages, blocks, tools, knobs, identity); the dialect.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from converters import anthropic_render, anthropic_stream
from converters.anthropic_render import EXTRA_FIELDS, invalid
from converters.base import Dialect, ItemReuse, Route, StreamEncoder, UnknownFields, dumps, expect, load_json_object
from converters.canonical import (
    Completion,
    ConversionError,
    IdentityHints,
    ImagePart,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    OutputFormat,
    Part,
    ProviderState,
    ReasoningPart,
    ReasoningRequest,
    ResultContent,
    SamplingParams,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
    WireResponse,
)

# ----------------------------------------------------------------------------------------------- vocabulary

TOP_LEVEL = frozenset(
    {"model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream"}
    | {"tools", "tool_choice", "thinking", "output_config", "output_format", "metadata"}
    | {"context_management", "service_tier", "container", "inference_geo", "speed"}
)
REJECTED_TOP = {"mcp_servers": "server-side MCP servers (mcp_servers) cannot be served by this proxy"}

# Per block type: the keys interpreted, and the keys kept opaque in the part's ProviderState.
TEXT_KEYS, TEXT_OPAQUE = frozenset({"type", "text"}), ("cache_control", "citations")
TOOL_USE_KEYS, TOOL_USE_OPAQUE = frozenset({"type", "id", "name", "input"}), ("cache_control", "caller")
RESULT_KEYS, RESULT_OPAQUE = frozenset({"type", "tool_use_id", "content", "is_error"}), ("cache_control",)
TOOL_KEYS = frozenset({"name", "description", "input_schema", "strict"})
TOOL_OPAQUE = ("type", "cache_control", "eager_input_streaming", "defer_loading", "input_examples", "allowed_callers")

# Session-like and client headers recorded in IdentityHints.headers (lower-cased).
IDENTITY_HEADERS = (
    "x-claude-code-session-id",
    "x-session-id",
    "x-session-affinity",
    "session_id",
    "session-id",
    "x-client-request-id",
    "x-app",
    "anthropic-beta",
    "anthropic-version",
)
_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]+)$")

# ----------------------------------------------------------------------------------------------- parsing


def parse_body(
    obj: Mapping[str, Any], headers: Mapping[str, str], fields: UnknownFields, reuse: ItemReuse | None = None
) -> ModelRequest:
    """The whole request, as a short pipeline of named steps."""
    fields.check("body", obj, TOP_LEVEL | REJECTED_TOP.keys())
    for key, why in REJECTED_TOP.items():
        if obj.get(key):
            raise invalid(key, why)
    model = expect(obj, "model", str, "body", required=True)
    messages = expect(obj, "messages", list, "body", required=True)
    if not messages:
        raise invalid("messages", "at least one message is required")
    raw_tools = expect(obj, "tools", list, "body") or []
    tools = reuse.value("tools", lambda: parse_tools(raw_tools, fields)) if reuse else parse_tools(raw_tools, fields)
    tool_choice, parallel = parse_tool_choice(obj.get("tool_choice")) if tools else (None, None)
    # The system prompt from the previous request when its bytes are unchanged: the very same message object, so
    # the session graph sees the whole shared history as one copy (an identity check, not a walk of every node).
    raw_system = obj.get("system")
    system = (
        reuse.value("system", lambda: parse_system(raw_system, fields)) if reuse else parse_system(raw_system, fields)
    )
    return ModelRequest(
        format="anthropic",
        model=model,
        messages=system + parse_messages(messages, fields, reuse),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        sampling=parse_sampling(obj),
        stream=bool(expect(obj, "stream", bool, "body")),
        output_format=parse_output_format(obj),
        reasoning=parse_reasoning(obj, fields),
        identity=parse_identity(obj, headers),
        extras={k: obj[k] for k in EXTRA_FIELDS if obj.get(k) is not None},
    )


def parse_system(system: Any, fields: UnknownFields) -> tuple[Message, ...]:
    if system is None or system == "" or system == []:
        return ()
    return (Message("system", text_parts(system, "system", fields)),)


def text_parts(content: Any, where: str, fields: UnknownFields) -> tuple[Part, ...]:
    """A string or a list of text blocks (``system``, system messages)."""
    if isinstance(content, str):
        return (TextPart(content),)
    if not isinstance(content, list):
        raise invalid(where, "expected string or array of text blocks")
    parts = tuple(parse_block(b, f"{where}[{i}]", fields) for i, b in enumerate(content))
    for i, part in enumerate(parts):
        if not isinstance(part, TextPart):
            raise invalid(f"{where}[{i}]", "only text blocks are allowed here")
    return parts


def parse_messages(messages: list[Any], fields: UnknownFields, reuse: ItemReuse | None = None) -> tuple[Message, ...]:
    """Each message on its own (none depends on another): those the session's previous request held come from
    ``reuse``."""
    if reuse is not None:
        return tuple(reuse.items(messages, lambda m, i: parse_message(m, i, fields)))
    return tuple(parse_message(m, i, fields) for i, m in enumerate(messages))


def parse_message(msg: Any, index: int, fields: UnknownFields) -> Message:
    where = f"messages[{index}]"
    if not isinstance(msg, dict):
        raise invalid(where, "expected object", "messages")
    fields.check("messages", msg, {"role", "content"})
    role = expect(msg, "role", str, where, required=True)
    content = msg.get("content")
    if role == "system":
        return Message("system", text_parts(content, f"{where}.content", fields))
    if role not in ("user", "assistant"):
        raise invalid(f"{where}.role", f"unexpected role {role!r}", "role")
    if isinstance(content, str):
        return Message(role, (TextPart(content),))
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "expected string or array", "content")
    return Message(role, tuple(parse_block(b, f"{where}.content[{i}]", fields) for i, b in enumerate(content)))


def parse_block(block: Any, where: str, fields: UnknownFields) -> Part:
    """One content block. Anything we cannot represent is a 400 naming the block type."""
    if not isinstance(block, dict):
        raise invalid(where, "expected a content block object", "content")
    kind = expect(block, "type", str, where, required=True)
    if kind == "text":
        fields.check("content.text", block, TEXT_KEYS | set(TEXT_OPAQUE))
        return TextPart(expect(block, "text", str, where, required=True), provider_state=opaque(block, TEXT_OPAQUE))
    if kind == "image":
        return parse_image(block, where, fields)
    if kind == "tool_use":
        fields.check("content.tool_use", block, TOOL_USE_KEYS | set(TOOL_USE_OPAQUE))
        args = expect(block, "input", dict, where, required=True)
        return ToolCallPart(
            id=expect(block, "id", str, where, required=True),
            name=expect(block, "name", str, where, required=True),
            arguments=dumps(args),
            provider_state=opaque(block, TOOL_USE_OPAQUE),
        )
    if kind == "tool_result":
        return parse_tool_result(block, where, fields)
    if kind == "thinking":
        text = expect(block, "thinking", str, where, required=True)
        rest = {k: v for k, v in block.items() if k not in ("type", "thinking")}
        return ReasoningPart(text, ProviderState("anthropic", rest) if rest else None)
    if kind == "redacted_thinking":
        expect(block, "data", str, where, required=True)
        return ReasoningPart("", ProviderState("anthropic", dict(block)))
    raise ConversionError(
        "invalid_request",
        f"{where}: content block type {kind!r} is not supported by this proxy",
        param="content",
    )


def parse_image(block: Mapping[str, Any], where: str, fields: UnknownFields) -> ImagePart:
    fields.check("content.image", block, {"type", "source"})
    if "cache_control" in block:
        # ImagePart has no opaque state; a cache hint on an image changes nothing we generate.
        fields.report("content.image", {"cache_control"})
    source = expect(block, "source", dict, where, required=True)
    kind = source.get("type")
    if kind == "base64":
        data = expect(source, "data", str, f"{where}.source", required=True)
        return ImagePart("base64", data, expect(source, "media_type", str, f"{where}.source"))
    if kind == "url":
        return ImagePart("url", expect(source, "url", str, f"{where}.source", required=True))
    if kind == "file":
        return ImagePart("file_id", expect(source, "file_id", str, f"{where}.source", required=True))
    raise invalid(f"{where}.source.type", f"unsupported image source {kind!r}", "source")


def parse_tool_result(block: Mapping[str, Any], where: str, fields: UnknownFields) -> ToolResultPart:
    fields.check("content.tool_result", block, RESULT_KEYS | set(RESULT_OPAQUE))
    content = block.get("content")
    parts: tuple[ResultContent, ...]
    if content is None:
        parts = ()
    elif isinstance(content, str):
        parts = (TextPart(content),)
    elif isinstance(content, list):
        parsed = tuple(parse_block(b, f"{where}.content[{i}]", fields) for i, b in enumerate(content))
        parts = tuple(p for p in parsed if isinstance(p, TextPart | ImagePart))
        if len(parts) != len(parsed):
            raise invalid(f"{where}.content", "only text and image blocks", "content")
    else:
        raise invalid(f"{where}.content", "expected string or array", "content")
    return ToolResultPart(
        call_id=expect(block, "tool_use_id", str, where, required=True),
        content=parts,
        is_error=bool(expect(block, "is_error", bool, where)),
        provider_state=opaque(block, RESULT_OPAQUE),
    )


def opaque(block: Mapping[str, Any], keys: Sequence[str]) -> ProviderState | None:
    kept = {k: block[k] for k in keys if block.get(k) is not None}
    return ProviderState("anthropic", kept) if kept else None


def parse_tools(tools: list[Any], fields: UnknownFields) -> tuple[ToolSpec, ...]:
    """Client tools become function tools; typed server tools (``web_search_20250305`` …) become builtins."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(where, "expected object", "tools")
        name = expect(tool, "name", str, where, required=True)
        if tool.get("type") not in (None, "custom"):
            out.append(ToolSpec(name, kind="builtin", provider_state=ProviderState("anthropic", dict(tool))))
            continue
        fields.check("tools", tool, TOOL_KEYS | set(TOOL_OPAQUE))
        spec = ToolSpec(
            name,
            description=expect(tool, "description", str, where) or "",
            parameters=expect(tool, "input_schema", dict, where, required=True),
            strict=expect(tool, "strict", bool, where),
            provider_state=opaque(tool, TOOL_OPAQUE),
        )
        out.append(spec)
    return tuple(out)


def parse_tool_choice(choice: Any) -> tuple[ToolChoice | None, bool | None]:
    """``{type: auto|any|tool|none, name?, disable_parallel_tool_use?}`` -> (choice, parallel tool calls)."""
    if choice is None:
        return None, None
    if not isinstance(choice, dict):
        raise invalid("tool_choice", "expected object")
    kind = choice.get("type")
    disable = expect(choice, "disable_parallel_tool_use", bool, "tool_choice")
    parallel = None if disable is None else not disable
    if kind == "tool":
        return ToolChoiceNamed(expect(choice, "name", str, "tool_choice", required=True)), parallel
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in modes:
        raise invalid("tool_choice.type", f"unexpected value {kind!r}")
    return ToolChoiceMode(modes[kind]), parallel  # type: ignore[arg-type]


def parse_sampling(obj: Mapping[str, Any]) -> SamplingParams:
    max_tokens = expect(obj, "max_tokens", int, "body", required=True)
    if max_tokens < 1:
        raise invalid("max_tokens", "must be at least 1")
    stops = expect(obj, "stop_sequences", list, "body") or []
    if not all(isinstance(s, str) for s in stops):
        raise invalid("stop_sequences", "expected array of strings")
    temperature, top_p = (
        expect(obj, "temperature", (int, float), "body"),
        expect(obj, "top_p", (int, float), "body"),
    )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        top_k=expect(obj, "top_k", int, "body"),
        stop=tuple(stops),
    )


def parse_output_format(obj: Mapping[str, Any]) -> OutputFormat:
    """``output_config.format`` (current) or top-level ``output_format`` (structured-outputs beta)."""
    config = expect(obj, "output_config", dict, "body") or {}
    fmt = expect(config, "format", dict, "output_config") or expect(obj, "output_format", dict, "body")
    if fmt is None:
        return TextFormat()
    if fmt.get("type") != "json_schema":
        raise invalid("output_config.format.type", f"{fmt.get('type')!r} is not supported")
    return JsonSchemaFormat(expect(fmt, "schema", dict, "output_config.format", required=True))


def parse_reasoning(obj: Mapping[str, Any], fields: UnknownFields) -> ReasoningRequest | None:
    """``thinking`` {enabled+budget | adaptive | disabled, display} and ``output_config.effort``."""
    thinking = expect(obj, "thinking", dict, "body")
    effort = expect(expect(obj, "output_config", dict, "body") or {}, "effort", str, "output_config")
    if thinking is None:
        return None if effort is None else ReasoningRequest(effort=effort)
    fields.check("thinking", thinking, {"type", "budget_tokens", "display"})
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise invalid("thinking.type", f"unexpected value {kind!r}")
    display = expect(thinking, "display", str, "thinking")
    return ReasoningRequest(
        enabled=kind != "disabled",
        effort=effort,
        budget_tokens=expect(thinking, "budget_tokens", int, "thinking", required=kind == "enabled"),
        include_in_output=None if display is None else display != "omitted",
    )


def parse_identity(obj: Mapping[str, Any], headers: Mapping[str, str]) -> IdentityHints:
    lower = {k.lower(): v for k, v in headers.items()}
    metadata = expect(obj, "metadata", dict, "body") or {}
    user_id = expect(metadata, "user_id", str, "metadata")
    return IdentityHints(
        headers={k: lower[k] for k in IDENTITY_HEADERS if k in lower},
        user_id=user_id,
        session_id=session_from_user_id(user_id),
        user_agent=lower.get("user-agent"),
    )


def session_from_user_id(user_id: str | None) -> str | None:
    """Claude Code's ``metadata.user_id``: JSON with ``session_id``, or older ``user_..._session_<id>``."""
    if not user_id:
        return None
    try:
        parsed = json.loads(user_id)
    except json.JSONDecodeError:
        match = _LEGACY_USER_ID.search(user_id)
        return match.group(1) if match else None
    value = parsed.get("session_id") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else None


# ----------------------------------------------------------------------------------------------- dialect


class AnthropicDialect(Dialect):
    format = "anthropic"

    def parse_request(
        self,
        body: bytes | Mapping[str, Any],
        route: Route,
        headers: Mapping[str, str] | None = None,
        fields: UnknownFields | None = None,
        *,
        reuse: ItemReuse | None = None,
    ) -> ModelRequest:
        obj = reuse.load(body, "messages", "anthropic") if reuse is not None else load_json_object(body)
        return parse_body(obj, headers or {}, fields or UnknownFields(), reuse)

    def render_request(self, request: ModelRequest) -> dict[str, Any]:
        return anthropic_render.render_body(request)

    def render_completion(self, completion: Completion) -> dict[str, Any]:
        return anthropic_stream.render_message(completion)

    def stream_encoder(self, route: Route, request: ModelRequest | None = None) -> StreamEncoder:
        return anthropic_stream.AnthropicStreamEncoder()

    def render_error(self, err: ConversionError) -> WireResponse:
        return anthropic_stream.render_error(err)


DIALECT = AnthropicDialect()

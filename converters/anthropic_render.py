"""Anthropic Messages requests rendered from the canonical model: the inverse of :mod:`converters.anthropic`.

Contract
--------
:func:`render_body` turns a canonical ``ModelRequest`` into a Messages request body such that
``parse_request(render_body(req)) == req`` for every request Anthropic can express (the round-trip tests check
this). Requests from other formats render too: leading ``system``/``developer`` messages become ``system``,
later ones ``role: "system"`` messages, canonical ``tool`` messages ride in user turns. Opaque state renders
back only when it is Anthropic's own. What has no Anthropic form (``seed``, penalties, ``min_p``) is not
sent; namespace/custom tools and ``json_object`` output raise a 400 ``ConversionError``.

Organisation: the body; messages and blocks; tools and tool choice; sampling, thinking and output format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from converters.anthropic_stream import tool_input
from converters.canonical import (
    ConversionError,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    Part,
    ProviderState,
    ReasoningPart,
    ReasoningRequest,
    SamplingParams,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)

# Top-level fields accepted and kept verbatim in ModelRequest.extras (the parser fills them, we render them).
EXTRA_FIELDS: tuple[str, ...] = ("thinking", "output_config", "output_format", "context_management", "metadata")
EXTRA_FIELDS += ("service_tier", "container", "inference_geo", "speed")


def invalid(where: str, problem: str, param: str | None = None) -> ConversionError:
    """A 400 naming the offending field, in the ``field: problem`` style Anthropic uses."""
    return ConversionError("invalid_request", f"{where}: {problem}", param=param or where.split(".")[0])


def render_body(req: ModelRequest) -> dict[str, Any]:
    """The wire body for a canonical request: extras first (the record), then canonical fields over them."""
    out: dict[str, Any] = {k: v for k, v in req.extras.items() if k in EXTRA_FIELDS}
    out["model"] = req.model
    system, rest = split_system(req.messages)
    if system:
        out["system"] = render_text_content(system)
    out["messages"] = render_messages(rest)
    out.update(render_sampling(req.sampling))
    if req.tools:
        out["tools"] = [render_tool(t) for t in req.tools]
        choice = render_tool_choice(req.tool_choice, req.parallel_tool_calls)
        if choice is not None:
            out["tool_choice"] = choice
    render_reasoning_and_format(req, out)
    if req.identity.user_id is not None and "metadata" not in out:
        out["metadata"] = {"user_id": req.identity.user_id}
    if req.stream:
        out["stream"] = True
    return out


def split_system(messages: Sequence[Message]) -> tuple[tuple[Part, ...], Sequence[Message]]:
    """Leading system/developer messages go to ``system``; later ones stay as ``role: "system"`` messages."""
    parts: tuple[Part, ...] = ()
    i = 0
    while i < len(messages) and messages[i].role in ("system", "developer"):
        parts += messages[i].parts
        i += 1
    return parts, messages[i:]


def render_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous: str | None = None
    for msg in messages:
        if msg.role in ("system", "developer"):
            out.append({"role": "system", "content": render_text_content(msg.parts)})
        elif msg.role == "tool":
            # Canonical "tool" messages (other formats) ride in user turns; consecutive results share one turn.
            blocks = [render_block(p) for p in msg.parts]
            if previous == "tool":
                out[-1]["content"].extend(blocks)
            else:
                out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": msg.role, "content": render_text_content(msg.parts)})
        previous = msg.role
    return out


def render_text_content(parts: Sequence[Part]) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and isinstance(parts[0], TextPart) and state_of(parts[0].provider_state) == {}:
        return parts[0].text
    return [render_block(p) for p in parts]


def state_of(state: ProviderState | None) -> dict[str, Any]:
    """Only Anthropic's own opaque state renders back into an Anthropic body."""
    return dict(state.data) if state is not None and state.format == "anthropic" else {}


def render_block(part: Part) -> dict[str, Any]:
    block: dict[str, Any]
    match part:
        case TextPart():
            return {"type": "text", "text": part.text, **state_of(part.provider_state)}
        case ImagePart():
            return {"type": "image", "source": render_image_source(part)}
        case ReasoningPart():
            state = state_of(part.provider_state)
            if state.get("type") == "redacted_thinking":
                return state
            return {"type": "thinking", "thinking": part.text, **state}
        case ToolCallPart():
            args = tool_input(part.arguments)
            block = {"type": "tool_use", "id": part.id, "name": part.name, "input": args}
            return {**block, **state_of(part.provider_state)}
        case ToolResultPart():
            block = {"type": "tool_result", "tool_use_id": part.call_id}
            if part.content:
                block["content"] = render_text_content(part.content)
            if part.is_error:
                block["is_error"] = True
            return {**block, **state_of(part.provider_state)}


def render_image_source(part: ImagePart) -> dict[str, Any]:
    if part.source == "base64":
        return {"type": "base64", "media_type": part.media_type, "data": part.data}
    if part.source == "url":
        return {"type": "url", "url": part.data}
    return {"type": "file", "file_id": part.data}


def render_tool(tool: ToolSpec) -> dict[str, Any]:
    state = state_of(tool.provider_state)
    if tool.kind == "builtin" and state:
        return state
    if tool.kind != "function":
        raise invalid("tools", f"tool {tool.name!r} of kind {tool.kind!r} has no Anthropic form")
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    out["input_schema"] = dict(tool.parameters or {"type": "object", "properties": {}})
    if tool.strict is not None:
        out["strict"] = tool.strict
    return {**out, **state}


def render_tool_choice(choice: ToolChoice | None, parallel: bool | None) -> dict[str, Any] | None:
    match choice:
        case None:
            out: dict[str, Any] = {"type": "auto"}
        case ToolChoiceNamed(name=name):
            out = {"type": "tool", "name": name}
        case ToolChoiceMode(mode=mode):
            out = {"type": {"auto": "auto", "required": "any", "none": "none"}[mode]}
    if parallel is not None:
        out["disable_parallel_tool_use"] = not parallel
    return out if choice is not None or parallel is not None else None


def render_sampling(s: SamplingParams) -> dict[str, Any]:
    """What Anthropic can express; ``seed``, ``min_p`` and the penalties have no Anthropic field: not sent."""
    values = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}
    out: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    if s.stop:
        out["stop_sequences"] = list(s.stop)
    return out


def render_reasoning_and_format(req: ModelRequest, out: dict[str, Any]) -> None:
    """``thinking`` and ``output_config`` {effort, format} from the canonical reasoning and output format."""
    config = dict(out.get("output_config") or {})
    reasoning = req.reasoning or ReasoningRequest()
    if reasoning.enabled is not None:
        out["thinking"] = render_thinking(reasoning)
    config.pop("effort", None)
    if reasoning.effort is not None:
        config["effort"] = reasoning.effort
    match req.output_format:
        case TextFormat():
            config.pop("format", None)
            out.pop("output_format", None)
        case JsonSchemaFormat(schema=schema):
            fmt = {"type": "json_schema", "schema": dict(schema)}
            if "output_format" in out:  # the structured-outputs beta spelling, kept when that is what came in
                out["output_format"] = fmt
            else:
                config["format"] = fmt
        case JsonObjectFormat():
            raise invalid("output_config.format", "json_object has no Anthropic form; use a json_schema")
    if config:
        out["output_config"] = config
    else:
        out.pop("output_config", None)


def render_thinking(reasoning: ReasoningRequest) -> dict[str, Any]:
    if not reasoning.enabled:
        out: dict[str, Any] = {"type": "disabled"}
    elif reasoning.budget_tokens is not None:
        out = {"type": "enabled", "budget_tokens": reasoning.budget_tokens}
    else:
        out = {"type": "adaptive"}
    if reasoning.include_in_output is not None:
        out["display"] = "summarized" if reasoning.include_in_output else "omitted"
    return out

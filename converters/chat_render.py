"""Canonical :class:`~converters.canonical.ModelRequest` -> OpenAI Chat Completions request body.

Contract
--------
:func:`render_chat_request` is the inverse of :func:`converters.chat.parse_chat_request`: for every request
chat can represent, parsing the rendered body gives the same request back (headers are not part of the body,
so ``identity.headers``/``user_agent`` are not rendered). Requests parsed from other formats render too, as
far as chat can carry them: several tool results in one message become one ``tool`` message each, and parts
chat cannot carry (an image in an assistant turn, a ``file_id`` image, a namespace tool) raise a 400
:class:`~converters.canonical.ConversionError`. Chat provider state (message ``name``/``refusal``, the
``reasoning`` spelling, custom tool formats, unknown tool kinds) is rendered back as it was received.

Organisation: the top-level body; messages and content; tools and tool choice; sampling.
"""

from __future__ import annotations

from typing import Any

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
    SamplingParams,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolResultPart,
    ToolSpec,
)

# -------------------------------------------------------------------------------------------------- rendering


def render_chat_request(req: ModelRequest) -> dict[str, Any]:
    """The chat body for ``req``."""
    body: dict[str, Any] = {
        "model": req.model,
        "messages": [w for m in req.messages for w in _render_message(m)],
    }
    if req.tools:
        body["tools"] = [_render_tool(t) for t in req.tools]
        if req.tool_choice is not None:
            body["tool_choice"] = _render_tool_choice(req.tool_choice, req.tools)
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    body |= _render_sampling(req.sampling)
    match req.output_format:
        case JsonObjectFormat():
            body["response_format"] = {"type": "json_object"}
        case JsonSchemaFormat(schema=schema, name=name, strict=strict):
            spec = {"name": name, "schema": dict(schema)} | ({} if strict is None else {"strict": strict})
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
    if req.stream:
        body["stream"] = True
        if req.include_usage:
            body["stream_options"] = {"include_usage": True}
    effort = req.reasoning and (req.reasoning.effort or ("none" if req.reasoning.enabled is False else None))
    if effort:
        body["reasoning_effort"] = effort
    if req.identity.user_id is not None:
        body["user"] = req.identity.user_id
    if req.identity.prompt_cache_key is not None:
        body["prompt_cache_key"] = req.identity.prompt_cache_key
    return body | dict(req.extras)


def _render_message(m: Message) -> list[dict[str, Any]]:
    """One canonical message as chat messages: one ``tool`` message per tool result (other formats put several
    results, or results and text, in one user turn)."""
    wire: list[dict[str, Any]] = [_render_result(p) for p in m.parts if isinstance(p, ToolResultPart)]
    rest = tuple(p for p in m.parts if not isinstance(p, ToolResultPart))
    if m.role == "tool" and not rest:
        return wire
    role = "user" if m.role == "tool" else m.role
    msg: dict[str, Any] = {"role": role}
    if role == "assistant":
        msg |= _render_assistant(rest)
    else:
        msg["content"] = _render_content(rest, role)
    return [*wire, msg | _chat_data(m.provider_state)]


def _chat_data(state: ProviderState | None) -> dict[str, Any]:
    """Provider state to render back: only chat's own (another format's state means nothing here)."""
    return dict(state.data) if state is not None and state.format == "chat" else {}


def _render_content(parts: tuple[Part, ...], role: str) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and isinstance(parts[0], TextPart) and not _chat_data(parts[0].provider_state):
        return parts[0].text
    out: list[dict[str, Any]] = []
    for p in parts:
        match p:
            case TextPart(text=text, provider_state=state):
                out.append({"type": "text", "text": text} | _chat_data(state))
            case ImagePart(source="url", data=url) if role != "assistant":
                out.append({"type": "image_url", "image_url": {"url": url}})
            case ImagePart(source="base64", data=data, media_type=media) if role != "assistant":
                out.append({"type": "image_url", "image_url": {"url": f"data:{media or ''};base64,{data}"}})
            case _:
                raise ConversionError("invalid_request", f"chat cannot carry a {p.type} part in a {role} message")
    return out


def _render_assistant(parts: tuple[Part, ...]) -> dict[str, Any]:
    reasoning = [p for p in parts if isinstance(p, ReasoningPart)]
    calls = [p for p in parts if isinstance(p, ToolCallPart)]
    content = tuple(p for p in parts if not isinstance(p, ReasoningPart | ToolCallPart))
    msg: dict[str, Any] = {"content": _render_content(content, "assistant") if content else None}
    if reasoning:
        key = _chat_data(reasoning[0].provider_state).get("field", "reasoning_content")
        msg[key] = "".join(p.text for p in reasoning)
    if calls:
        msg["tool_calls"] = [_render_call(c) for c in calls]
    return msg


def _render_call(c: ToolCallPart) -> dict[str, Any]:
    if c.kind == "custom":
        return {"id": c.id, "type": "custom", "custom": {"name": c.name, "input": c.arguments}}
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _render_result(p: ToolResultPart) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": p.call_id,
        "content": _render_content(p.content, "tool"),
    }
    if p.name is not None:
        msg["name"] = p.name
    return msg


def _render_tool(t: ToolSpec) -> dict[str, Any]:
    if t.kind == "builtin" and _chat_data(t.provider_state):
        return _chat_data(t.provider_state)
    if t.kind not in ("function", "custom"):
        raise ConversionError("invalid_request", f"chat cannot carry a {t.kind} tool ({t.name!r})")
    body: dict[str, Any] = {"name": t.name}
    if t.description:
        body["description"] = t.description
    if t.kind == "custom":
        return {"type": "custom", "custom": body | _chat_data(t.provider_state)}
    if t.parameters is not None:
        body["parameters"] = dict(t.parameters)
    if t.strict is not None:
        body["strict"] = t.strict
    return {"type": "function", "function": body}


def _render_tool_choice(choice: ToolChoice, tools: tuple[ToolSpec, ...]) -> Any:
    if isinstance(choice, ToolChoiceMode):
        return choice.mode
    kind = next((t.kind for t in tools if t.name == choice.name), "function")
    kind = "custom" if kind == "custom" else "function"
    return {"type": kind, kind: {"name": choice.name}}


def _render_sampling(s: SamplingParams) -> dict[str, Any]:
    values = {
        "max_completion_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "stop": list(s.stop) or None,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    }
    return {k: v for k, v in values.items() if v is not None}

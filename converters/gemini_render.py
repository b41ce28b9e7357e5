"""Gemini request rendering: a canonical :class:`~converters.canonical.ModelRequest` back to a Gemini body.

Contract
--------
:func:`render_request` is the inverse of :func:`converters.gemini.parse_request` for every canonical request
Gemini can express: at most one leading system message (``systemInstruction``), ``function`` tools and
Gemini ``builtin`` tools, function (not custom) calls. Anything else is a 400
:class:`~converters.canonical.ConversionError` naming what cannot be expressed. The model and the stream
flag belong in the URL, not in the body.

Organisation: constants shared with the parser; parts; messages; tools and tool config; generation config;
the request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
    ReasoningRequest,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)
from converters.gemini_stream import function_call

# Wire key -> (SamplingParams attribute, type).
SAMPLING_KEYS: Mapping[str, tuple[str, type]] = {
    "maxOutputTokens": ("max_tokens", int),
    "temperature": ("temperature", float),
    "topP": ("top_p", float),
    "topK": ("top_k", int),
    "seed": ("seed", int),
    "presencePenalty": ("presence_penalty", float),
    "frequencyPenalty": ("frequency_penalty", float),
}
RECORDED_KEYS = ("safetySettings", "cachedContent", "labels")  # kept in extras for the record, not acted on


def _bad(message: str) -> ConversionError:
    return ConversionError("invalid_request", message)


def _gemini_state(state: ProviderState | None) -> Mapping[str, Any]:
    return state.data if state is not None and state.format == "gemini" else {}


def _with_signature(wire: dict[str, Any], state: ProviderState | None) -> dict[str, Any]:
    sig = _gemini_state(state).get("thoughtSignature")
    return wire if sig is None else {**wire, "thoughtSignature": sig}


def _render_blob(part: ImagePart) -> dict[str, Any]:
    if part.source == "base64":
        return {"inlineData": {"mimeType": part.media_type or "image/png", "data": part.data}}
    file = {"fileUri": part.data} | ({"mimeType": part.media_type} if part.media_type else {})
    return {"fileData": file}


def _render_result(part: ToolResultPart) -> dict[str, Any]:
    try:
        response = json.loads(part.text)
    except json.JSONDecodeError:
        response = None
    if not isinstance(response, dict):
        response = {"error": part.text} if part.is_error else {"output": part.text}
    wire: dict[str, Any] = {"id": part.call_id} if part.call_id else {}
    wire |= {"name": part.name or "", "response": response}
    images = [_render_blob(p) for p in part.content if isinstance(p, ImagePart)]
    return {"functionResponse": wire | ({"parts": images} if images else {})}


def render_part(part: Part) -> dict[str, Any]:
    match part:
        case TextPart(text=text, provider_state=state):
            return _with_signature({"text": text}, state)
        case ReasoningPart(text=text, provider_state=state):
            return _with_signature({"text": text, "thought": True}, state)
        case ImagePart():
            return _render_blob(part)
        case ToolCallPart(kind="custom"):
            raise _bad(f"Gemini has no custom (free-text) tool calls; cannot render call {part.name!r}")
        case ToolCallPart():
            call = function_call(part.id, part.name, part.arguments)
            return _with_signature({"functionCall": call}, part.provider_state)
        case ToolResultPart():
            return _with_signature(_render_result(part), part.provider_state)


def _render_messages(messages: tuple[Message, ...]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Leading system/developer messages -> systemInstruction; the rest -> contents (tool -> role user)."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    for message in messages:
        if message.role in ("system", "developer"):
            if contents:
                raise _bad("Gemini cannot express a system message after the conversation has started")
            system.extend(render_part(p) for p in message.parts)
            continue
        role = "model" if message.role == "assistant" else "user"
        contents.append({"role": role, "parts": [render_part(p) for p in message.parts]})
    return ({"parts": system} if system else None), contents


def _render_declaration(spec: ToolSpec) -> dict[str, Any]:
    kept = dict(_gemini_state(spec.provider_state))
    key = kept.pop("parametersKey", "parametersJsonSchema")
    decl: dict[str, Any] = {"name": spec.name}
    if spec.description:
        decl["description"] = spec.description
    if spec.parameters is not None:
        decl[key] = spec.parameters
    return decl | kept


def _render_tools(tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    """Runs of function tools share one ``functionDeclarations`` object (as Gemini CLI sends them)."""
    out: list[dict[str, Any]] = []
    for spec in tools:
        if spec.kind == "function":
            if not out or "functionDeclarations" not in out[-1]:
                out.append({"functionDeclarations": []})
            out[-1]["functionDeclarations"].append(_render_declaration(spec))
        elif spec.kind == "builtin" and _gemini_state(spec.provider_state):
            out.append(dict(_gemini_state(spec.provider_state)))
        else:
            raise _bad(f"Gemini cannot express the {spec.kind} tool {spec.name!r}")
    return out


def render_tool_config(choice: ToolChoice | None) -> dict[str, Any]:
    match choice:
        case None:
            return {}
        case ToolChoiceNamed(name=name):
            return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
        case ToolChoiceMode(mode=mode):
            wire = {"auto": "AUTO", "none": "NONE", "required": "ANY"}[mode]
            return {"functionCallingConfig": {"mode": wire}}


def _render_generation_config(request: ModelRequest) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, (attr, _typ) in SAMPLING_KEYS.items():
        value = getattr(request.sampling, attr)
        if value is not None:
            config[key] = value
    if request.sampling.stop:
        config["stopSequences"] = list(request.sampling.stop)
    match request.output_format:
        case JsonSchemaFormat(schema=schema):
            key = "responseSchema" if "responseSchema" in request.extras else "responseJsonSchema"
            config |= {"responseMimeType": "application/json", key: schema}
        case JsonObjectFormat():
            config["responseMimeType"] = "application/json"
        case TextFormat():
            pass
    if request.reasoning is not None:
        config["thinkingConfig"] = _render_thinking(request.reasoning)
    return config | dict(request.extras.get("generationConfig", {}))


def _render_thinking(reasoning: ReasoningRequest) -> dict[str, Any]:
    thinking: dict[str, Any] = {}
    if reasoning.include_in_output is not None:
        thinking["includeThoughts"] = reasoning.include_in_output
    if reasoning.budget_tokens is not None:
        thinking["thinkingBudget"] = reasoning.budget_tokens
    elif reasoning.enabled is False:
        thinking["thinkingBudget"] = 0
    if reasoning.effort is not None:
        thinking["thinkingLevel"] = reasoning.effort.upper()
    return thinking


def render_request(request: ModelRequest) -> dict[str, Any]:
    """ModelRequest -> Gemini body (the model and the stream flag go in the URL: see ``parse_route``)."""
    system, contents = _render_messages(request.messages)
    body: dict[str, Any] = {"contents": contents}
    if system is not None:
        body["systemInstruction"] = system
    if request.tools:
        body["tools"] = _render_tools(request.tools)
        tool_config = request.extras.get("toolConfig") or render_tool_config(request.tool_choice)
        if tool_config:
            body["toolConfig"] = tool_config
    config = _render_generation_config(request)
    if config:
        body["generationConfig"] = config
    return body | {k: request.extras[k] for k in RECORDED_KEYS if k in request.extras}

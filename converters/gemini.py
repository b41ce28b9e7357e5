"""Google Gemini ``generateContent`` / ``streamGenerateContent``: routes and requests (the response side is in
:mod:`converters.gemini_stream`).

Contract
--------
* :func:`parse_route` recognises ``/{v1beta|v1|v1alpha}/models/{model}:generateContent`` and
  ``:streamGenerateContent`` (``?alt=sse`` selects SSE, otherwise the JSON-array stream) and returns
  ``None`` for every other path.
* :func:`parse_request` turns a request body into a :class:`~converters.canonical.ModelRequest`; the model
  and the stream flag come from the :class:`~converters.base.Route`, never from the body. Its inverse is
  :func:`converters.gemini_render.render_request`; responses live in :mod:`converters.gemini_stream`.
* Mapping choices (see docs/wire-formats.md, "Google Gemini"): role ``model`` is ``assistant``; a ``user``/``function``
  content made only of ``functionResponse`` parts is a ``tool`` message; a missing call id is ``""``; a
  ``functionResponse.response`` object becomes the JSON text of a :class:`TextPart`; part-level
  ``thoughtSignature`` travels in ``ProviderState("gemini", {"thoughtSignature": ...})``; a declaration that
  used the OpenAPI ``parameters`` key (not ``parametersJsonSchema``) says so in its ``ProviderState``.

Organisation: route; request parsing (contents and parts, tools and tool config, generation config,
identity); the dialect object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from converters.base import Dialect, ItemReuse, Route, StreamEncoder, UnknownFields, dumps, expect, load_json_object
from converters.canonical import (
    Completion,
    ConversionError,
    IdentityHints,
    ImagePart,
    JsonObjectFormat,
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
from converters.gemini_render import RECORDED_KEYS, SAMPLING_KEYS, render_request, render_tool_config
from converters.gemini_stream import GeminiStreamEncoder, render_completion, render_error

# --------------------------------------------------------------------------------------------------- route

_ROUTE = re.compile(r"^/(?:v1beta|v1|v1alpha)/models/([^/:]+):(generateContent|streamGenerateContent)$")


def parse_route(path: str, query: Mapping[str, str]) -> Route | None:
    """The Route for a Gemini model call, or None for any other path (countTokens, model listing, files)."""
    bare = path.split("?", 1)[0]
    match = _ROUTE.match(bare)
    if match is None:
        return None
    model, method = unquote(match.group(1)), match.group(2)
    return Route(
        format="gemini",
        path=bare,
        model=model,
        stream=method == "streamGenerateContent",
        sse=query.get("alt", "").lower() == "sse",
        query=dict(query),
    )


# --------------------------------------------------------------------------------------------------- parsing

_BODY_KEYS = frozenset(
    {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "model", *RECORDED_KEYS}
)
_PART_KEYS = frozenset(
    {"text", "thought", "thoughtSignature", "inlineData", "fileData", "functionCall", "functionResponse"}
)
_UNSUPPORTED_PARTS = ("executableCode", "codeExecutionResult", "toolCall", "toolResponse")
_IDENTITY_HEADERS = ("x-goog-api-client", "user-agent", "x-gemini-api-privileged-user-id")
_ROLES = {"user": "user", "model": "assistant", "function": "user"}
_SNAKE = re.compile(r"_([a-z])")


def _camel(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Proto3 JSON accepts snake_case field names as well; google-genai for Python sends e.g.
    ``parameters_json_schema``. Keys only, one level: values (args, schemas) are data and stay as they are."""
    return {(k if k.startswith("_") else _SNAKE.sub(lambda m: m.group(1).upper(), k)): v for k, v in obj.items()}


def _camel_tool_config(value: Mapping[str, Any]) -> dict[str, Any]:
    config = _camel(value)
    calling = config.get("functionCallingConfig")
    return config | ({"functionCallingConfig": _camel(calling)} if isinstance(calling, dict) else {})


def _bad(message: str, param: str | None = None) -> ConversionError:
    return ConversionError("invalid_request", message, param=param)


def _signature(part: Mapping[str, Any], where: str) -> ProviderState | None:
    sig = expect(part, "thoughtSignature", str, where)
    return None if sig is None else ProviderState("gemini", {"thoughtSignature": sig})


def _parse_blob(part: Mapping[str, Any], where: str) -> ImagePart:
    """``inlineData`` / ``fileData`` -> ImagePart; a non-image media type is a 400 (no canonical form)."""
    if "inlineData" in part:
        blob = _camel(expect(part, "inlineData", dict, where))
        mime = expect(blob, "mimeType", str, f"{where}.inlineData", required=True)
        data = expect(blob, "data", str, f"{where}.inlineData", required=True)
        source, key = "base64", "inlineData"
    else:
        blob = _camel(expect(part, "fileData", dict, where))
        mime = expect(blob, "mimeType", str, f"{where}.fileData")
        data = expect(blob, "fileUri", str, f"{where}.fileData", required=True)
        source, key = "url", "fileData"
    if mime is not None and not mime.startswith("image/"):
        raise _bad(f"{where}.{key}: media type {mime!r} is not supported; only image/* can be represented", key)
    return ImagePart(source, data, mime)  # type: ignore[arg-type]


def _parse_function_call(part: Mapping[str, Any], where: str) -> ToolCallPart:
    call = _camel(expect(part, "functionCall", dict, where))
    args = expect(call, "args", dict, f"{where}.functionCall") or {}
    return ToolCallPart(
        id=expect(call, "id", str, f"{where}.functionCall") or "",
        name=expect(call, "name", str, f"{where}.functionCall", required=True),
        arguments=dumps(args),
        provider_state=_signature(part, where),
    )


def _parse_function_response(part: Mapping[str, Any], where: str, fields: UnknownFields) -> ToolResultPart:
    resp = _camel(expect(part, "functionResponse", dict, where))
    here = f"{where}.functionResponse"
    fields.check("contents.parts.functionResponse", resp, {"id", "name", "response", "parts"})
    response = expect(resp, "response", dict, here) or {}
    # The inverse of rendering a plain-text result as {"output": text} / {"error": text}: a text result that went
    # through Gemini comes back as the same text, so it reads the same in every other format.
    wrapped = next(iter(response.values())) if len(response) == 1 else None
    is_error = isinstance(wrapped, str) and "error" in response
    if isinstance(wrapped, str) and ("output" in response or is_error):
        content: list[ResultContent] = [TextPart(wrapped)]
    else:
        content = [TextPart(dumps(response))]
    for i, extra in enumerate(expect(resp, "parts", list, here) or []):
        if not isinstance(extra, dict) or not ({"inlineData", "fileData"} & set(_camel(extra))):
            raise _bad(f"{here}.parts[{i}]: only inlineData / fileData parts are supported", "parts")
        content.append(_parse_blob(_camel(extra), f"{here}.parts[{i}]"))
    return ToolResultPart(
        call_id=expect(resp, "id", str, here) or "",
        content=tuple(content),
        name=expect(resp, "name", str, here, required=True),
        is_error=is_error,
        provider_state=_signature(part, where),
    )


def _parse_part(part: Any, where: str, fields: UnknownFields) -> Part:
    if not isinstance(part, dict):
        raise _bad(f"{where}: expected object, got {type(part).__name__}")
    part = _camel(part)
    for key in _UNSUPPORTED_PARTS:
        if key in part:
            raise _bad(f"{where}: {key} parts are not supported by this proxy", key)
    fields.check("contents.parts", part, _PART_KEYS)
    if "functionCall" in part:
        return _parse_function_call(part, where)
    if "functionResponse" in part:
        return _parse_function_response(part, where, fields)
    if "inlineData" in part or "fileData" in part:
        if "thoughtSignature" in part:  # ImagePart has no provider state; say so rather than drop it silently
            fields.report("contents.parts", ["thoughtSignature(on inlineData/fileData)"])
        return _parse_blob(part, where)
    text = expect(part, "text", str, where)
    state = _signature(part, where)
    if text is None and state is None:
        raise _bad(f"{where}: part has no data (text, inlineData, fileData, functionCall or functionResponse)")
    if text is None or expect(part, "thought", bool, where):
        return ReasoningPart(text or "", provider_state=state)  # a bare signature is opaque reasoning
    return TextPart(text, provider_state=state)


def _parse_content(content: Any, where: str, fields: UnknownFields) -> Message:
    if not isinstance(content, dict):
        raise _bad(f"{where}: expected object, got {type(content).__name__}")
    content = _camel(content)
    fields.check("contents", content, {"role", "parts"})
    role = expect(content, "role", str, where) or "user"
    if role not in _ROLES:
        raise _bad(f"{where}.role: expected 'user' or 'model', got {role!r}", "role")
    raw_parts = expect(content, "parts", list, where) or []
    parts = tuple(_parse_part(p, f"{where}.parts[{i}]", fields) for i, p in enumerate(raw_parts))
    if role != "model" and parts and all(isinstance(p, ToolResultPart) for p in parts):
        return Message("tool", parts)
    return Message(_ROLES[role], parts)  # type: ignore[arg-type]


def _parse_system(value: Any, fields: UnknownFields) -> Message | None:
    if value is None:
        return None
    if isinstance(value, str):  # the SDKs accept a bare string; the REST API wants Content
        return Message("system", (TextPart(value),))
    if not isinstance(value, dict):
        raise _bad("systemInstruction: expected object", "systemInstruction")
    value = _camel(value)
    fields.check("systemInstruction", value, {"role", "parts"})
    raw_parts = expect(value, "parts", list, "systemInstruction") or []
    parts = [_parse_part(p, f"systemInstruction.parts[{i}]", fields) for i, p in enumerate(raw_parts)]
    if not all(isinstance(p, TextPart) for p in parts):
        raise _bad("systemInstruction: only text parts are supported", "systemInstruction")
    return Message("system", tuple(parts))


def _parse_declaration(decl: Any, where: str, fields: UnknownFields) -> ToolSpec:
    if not isinstance(decl, dict):
        raise _bad(f"{where}: expected object")
    decl = _camel(decl)
    known = {
        "name",
        "description",
        "parameters",
        "parametersJsonSchema",
        "response",
        "responseJsonSchema",
        "behavior",
    }
    fields.check("tools.functionDeclarations", decl, known)
    json_schema = expect(decl, "parametersJsonSchema", dict, where)
    openapi = expect(decl, "parameters", dict, where)
    if json_schema is not None and openapi is not None:
        raise _bad(f"{where}: set either parameters or parametersJsonSchema, not both", "parameters")
    # Remember what the harness used so the same key is rendered back; the rest is kept verbatim.
    kept = {k: decl[k] for k in ("response", "responseJsonSchema", "behavior") if k in decl}
    if openapi is not None:
        kept["parametersKey"] = "parameters"
    return ToolSpec(
        name=expect(decl, "name", str, where, required=True),
        description=expect(decl, "description", str, where) or "",
        parameters=json_schema if json_schema is not None else openapi,
        provider_state=ProviderState("gemini", kept) if kept else None,
    )


def _parse_tools(value: Any, fields: UnknownFields) -> tuple[ToolSpec, ...]:
    """``functionDeclarations`` -> function tools; every other key of a Tool (googleSearch …) -> a builtin."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(value or []):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}]: expected object", "tools")
        for key, spec in _camel(tool).items():
            if key != "functionDeclarations":
                specs.append(ToolSpec(name=key, kind="builtin", provider_state=ProviderState("gemini", {key: spec})))
                continue
            if not isinstance(spec, list):
                raise _bad(f"tools[{i}].functionDeclarations: expected array", "functionDeclarations")
            specs.extend(
                _parse_declaration(d, f"tools[{i}].functionDeclarations[{j}]", fields) for j, d in enumerate(spec)
            )
    return tuple(specs)


def _parse_tool_config(value: Mapping[str, Any], fields: UnknownFields) -> ToolChoice | None:
    """AUTO/NONE/ANY (one allowed name: named) -> tool choice. Anything finer is kept verbatim in extras."""
    fields.check("toolConfig", value, {"functionCallingConfig", "retrievalConfig"})
    config = expect(value, "functionCallingConfig", dict, "toolConfig")  # already camel-cased
    if config is None:
        return None
    mode = (expect(config, "mode", str, "toolConfig.functionCallingConfig") or "AUTO").upper()
    fields.check("toolConfig.functionCallingConfig", config, {"mode", "allowedFunctionNames"})
    names = expect(config, "allowedFunctionNames", list, "toolConfig.functionCallingConfig") or []
    if not all(isinstance(n, str) for n in names):
        raise _bad("toolConfig.functionCallingConfig.allowedFunctionNames: expected strings", "allowedFunctionNames")
    if mode not in ("AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"):
        raise _bad(f"toolConfig.functionCallingConfig.mode: unknown mode {mode!r}", "mode")
    if mode == "NONE":
        return ToolChoiceMode("none")
    if mode == "ANY":
        return ToolChoiceNamed(names[0]) if len(names) == 1 else ToolChoiceMode("required")
    return ToolChoiceMode("auto")


def _exact_tool_config(value: Mapping[str, Any], choice: ToolChoice | None) -> bool:
    return value == render_tool_config(choice)


# Accepted, not acted on: kept in extras["generationConfig"] and rendered back.
_GENERATION_RECORDED = frozenset(
    {"candidateCount", "responseModalities", "responseLogprobs", "logprobs", "mediaResolution",
     "routingConfig", "modelSelectionConfig", "enableEnhancedCivicAnswers", "audioTimestamp", "speechConfig"}
)  # fmt: skip
_GENERATION_KEYS = frozenset(SAMPLING_KEYS) | _GENERATION_RECORDED | {
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "_responseJsonSchema",
    "thinkingConfig",
}  # fmt: skip


def _number(config: Mapping[str, Any], key: str, typ: type) -> Any:
    value = expect(config, key, (int, float), "generationConfig")
    if value is None:
        return None
    if typ is int and value != int(value):
        raise _bad(f"generationConfig.{key}: expected integer, got {value}", key)
    return typ(value)


def _parse_sampling(config: Mapping[str, Any]) -> SamplingParams:
    values = {attr: _number(config, key, typ) for key, (attr, typ) in SAMPLING_KEYS.items()}
    stop = expect(config, "stopSequences", list, "generationConfig") or []
    if not all(isinstance(s, str) for s in stop):
        raise _bad("generationConfig.stopSequences: expected array of strings", "stopSequences")
    candidates = _number(config, "candidateCount", int)
    if candidates is not None and candidates > 1:
        raise _bad("generationConfig.candidateCount: only one candidate is supported", "candidateCount")
    return SamplingParams(stop=tuple(stop), **values)


def _parse_output_format(config: Mapping[str, Any]) -> OutputFormat:
    mime = expect(config, "responseMimeType", str, "generationConfig")
    schema = None
    for key in ("responseJsonSchema", "_responseJsonSchema", "responseSchema"):
        schema = schema if schema is not None else expect(config, key, dict, "generationConfig")
    if schema is not None:
        return JsonSchemaFormat(schema)
    if mime is None or mime == "text/plain":
        return TextFormat()
    if mime == "application/json":
        return JsonObjectFormat()
    raise _bad(f"generationConfig.responseMimeType: {mime!r} is not supported", "responseMimeType")


def _parse_thinking(value: Any, fields: UnknownFields) -> ReasoningRequest | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad("generationConfig.thinkingConfig: expected object", "thinkingConfig")
    value = _camel(value)
    where = "generationConfig.thinkingConfig"
    fields.check(where, value, {"includeThoughts", "thinkingBudget", "thinkingLevel"})
    budget = expect(value, "thinkingBudget", int, where)
    level = expect(value, "thinkingLevel", str, where)
    return ReasoningRequest(
        enabled=None if budget is None else budget != 0,  # 0 turns thinking off; -1 is "dynamic"
        effort=None if level is None else level.lower(),
        budget_tokens=budget,
        include_in_output=expect(value, "includeThoughts", bool, where),
    )


def _identity(headers: Mapping[str, str]) -> IdentityHints:
    lower = {k.lower(): v for k, v in headers.items()}
    kept = {h: lower[h] for h in _IDENTITY_HEADERS if h in lower}  # never the API key
    return IdentityHints(
        headers=kept, user_id=lower.get("x-gemini-api-privileged-user-id"), user_agent=lower.get("user-agent")
    )


def parse_request(
    body: bytes | Mapping[str, Any],
    route: Route,
    headers: Mapping[str, str] | None = None,
    fields: UnknownFields | None = None,
    reuse: ItemReuse | None = None,
) -> ModelRequest:
    """A Gemini request body -> ModelRequest (see the module docstring for the mapping). ``reuse``: the session's
    previous request's contents (:mod:`converters.delta`; each content parses on its own)."""
    fields = fields if fields is not None else UnknownFields()
    loaded = reuse.load(body, "contents", "gemini") if reuse is not None else load_json_object(body)
    obj = _camel(loaded)
    if not route.model:
        raise ConversionError("not_found", f"no model in the route {route.path!r}")
    fields.check("body", obj, _BODY_KEYS)
    contents = expect(obj, "contents", list, "body", required=True)
    if not contents:
        raise _bad("contents: must not be empty", "contents")
    raw_system = obj.get("systemInstruction")
    # unchanged bytes: the previous request's very message object (see converters.anthropic), under the name the
    # client used (the REST API takes both spellings; with both, the later one counts: parsed anew)
    spelled = [k for k in ("systemInstruction", "system_instruction") if k in loaded]
    if reuse is not None and len(spelled) == 1:
        system = reuse.value(spelled[0], lambda: _parse_system(raw_system, fields))
    else:
        system = _parse_system(raw_system, fields)
    if reuse is not None:
        messages = tuple(reuse.items(contents, lambda c, i: _parse_content(c, f"contents[{i}]", fields)))
    else:
        messages = tuple(_parse_content(c, f"contents[{i}]", fields) for i, c in enumerate(contents))
    raw_tools = expect(obj, "tools", list, "body")
    tools = reuse.value("tools", lambda: _parse_tools(raw_tools, fields)) if reuse else _parse_tools(raw_tools, fields)
    tool_config = _camel_tool_config(expect(obj, "toolConfig", dict, "body") or {})
    choice = _parse_tool_config(tool_config, fields) if tools else None  # empty tools: drop the config too
    config = _camel(expect(obj, "generationConfig", dict, "body") or {})
    fields.check("generationConfig", config, _GENERATION_KEYS)
    extras: dict[str, Any] = {k: obj[k] for k in RECORDED_KEYS if k in obj}
    if tools and tool_config and not _exact_tool_config(tool_config, choice):
        extras["toolConfig"] = tool_config  # VALIDATED, several allowed names …: rendered back verbatim
    if "responseSchema" in config:
        extras["responseSchema"] = config["responseSchema"]  # the OpenAPI-subset key, rendered back as such
    recorded = {k: config[k] for k in sorted(_GENERATION_RECORDED & set(config))}
    if recorded:
        extras["generationConfig"] = recorded
    return ModelRequest(
        format="gemini",
        model=route.model,
        messages=((system,) if system else ()) + messages,
        tools=tools,
        tool_choice=choice,
        sampling=_parse_sampling(config),
        stream=bool(route.stream),
        output_format=_parse_output_format(config),
        reasoning=_parse_thinking(config.get("thinkingConfig"), fields),
        identity=_identity(headers or {}),
        extras=extras,
    )


# --------------------------------------------------------------------------------------------------- dialect


class GeminiDialect(Dialect):
    """The Gemini wire format (stateless)."""

    format = "gemini"

    def parse_request(
        self,
        body: bytes | Mapping[str, Any],
        route: Route,
        headers: Mapping[str, str] | None = None,
        fields: UnknownFields | None = None,
        *,
        reuse: ItemReuse | None = None,
    ) -> ModelRequest:
        return parse_request(body, route, headers, fields, reuse)

    def render_request(self, request: ModelRequest) -> dict[str, Any]:
        return render_request(request)

    def render_completion(self, completion: Completion) -> dict[str, Any]:
        return render_completion(completion)

    def stream_encoder(self, route: Route, request: ModelRequest | None = None) -> StreamEncoder:
        return GeminiStreamEncoder(sse=route.sse)  # Gemini has no request-level stream options

    def render_error(self, err: ConversionError) -> WireResponse:
        return render_error(err)


DIALECT = GeminiDialect()

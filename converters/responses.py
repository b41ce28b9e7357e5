"""OpenAI Responses (``POST /v1/responses``) to and from the canonical model: the request body and the dialect.

Contract
--------
``parse_request`` turns a Responses body (plus headers) into a :class:`~converters.canonical.ModelRequest`;
``render_request`` is its inverse for every request the format can express:
``parse_request(render_request(r)) == r``. What the canonical model has no field for is kept in
``ProviderState(format="responses")`` on the part, message or tool it belongs to, or in
``ModelRequest.extras`` under its wire name (``store``, ``include``, ``client_metadata``,
``text.verbosity``, ``reasoning.summary`` …). Input items (messages, reasoning, tool calls and outputs) are
converted by :mod:`converters.responses_items`; the output side (response bodies, the stream encoder,
errors) lives in :mod:`converters.responses_stream`.

Decisions (all in docs/wire-formats.md, "OpenAI Responses"):

* ``instructions`` becomes a leading ``system`` message marked ``{"source": "instructions"}``; ``developer``
  and ``system`` input items stay messages of their role.
* Codex's ``additional_tools`` input items are merged into ``tools`` (after the top-level ones); where they
  stood is kept in ``extras["input.additional_tools"]`` so that rendering puts them back.
* ``previous_response_id`` needs stored state: a 400 unless the caller passes ``history=`` (its own record
  of the prior conversation), which is prepended. ``conversation``, ``prompt`` and ``background: true`` are
  400s too.
* Tools: ``function``, ``custom`` (``format`` kept as state), ``namespace`` (nested tools); any other type
  is a provider-hosted tool (``web_search`` …) kept as ``kind="builtin"`` with its raw dict.
* An empty ``tools`` list drops ``tool_choice``; ``max_tokens``/``max_completion_tokens`` are not Responses
  fields and are logged and ignored like every unknown field.

Organisation: constants; parse (body, identity, tools, options); render (the same order); the dialect.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from converters.base import Dialect, ItemReuse, Route, StreamEncoder, UnknownFields, expect, load_json_object
from converters.canonical import (
    Completion,
    ConversionError,
    IdentityHints,
    JsonObjectFormat,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    OutputFormat,
    ReasoningRequest,
    SamplingParams,
    TextFormat,
    TextPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolKind,
    ToolSpec,
    WireFormat,
    WireResponse,
)
from converters.responses_items import (
    STATEFUL,
    invalid,
    parse_input,
    render_input,
    rest,
    state_data,
    wire_state,
)
from converters.responses_stream import ResponsesStreamEncoder, render_error, render_response

# Accepted top-level fields kept verbatim in ``extras`` (recorded, not interpreted).
EXTRA_FIELDS = (
    "store", "include", "client_metadata", "metadata", "truncation", "service_tier", "safety_identifier",
    "top_logprobs", "max_tool_calls", "stream_options", "background", "prompt_cache_retention",
)  # fmt: skip
INTERPRETED_FIELDS = (
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "text", "reasoning", "stream", "prompt_cache_key", "user", "previous_response_id",
    "conversation", "prompt",
)  # fmt: skip
KNOWN_FIELDS = frozenset(EXTRA_FIELDS + INTERPRETED_FIELDS)
# The tool types interpreted here, and the wire keys each carries besides type, name and description.
TOOL_KEYS: dict[str, tuple[ToolKind, tuple[str, ...]]] = {
    "function": ("function", ("parameters", "strict")),
    "custom": ("custom", ("format",)),
    "namespace": ("namespace", ("tools",)),
}
# Session-like request headers recorded in IdentityHints (Codex, OpenCode/Kilo, Pi).
SESSION_HEADERS = (
    "session-id", "session_id", "thread-id", "x-session-id", "x-session-affinity", "x-client-request-id",
    "x-codex-turn-metadata", "x-codex-window-id", "originator",
)  # fmt: skip


# --------------------------------------------------------------------------------------------------- parse


def parse_request(
    body: bytes | Mapping[str, Any],
    route: Route | None = None,
    headers: Mapping[str, str] | None = None,
    fields: UnknownFields | None = None,
    *,
    history: Sequence[Message] | None = None,
    reuse: ItemReuse | None = None,
) -> ModelRequest:
    """A Responses request body as a canonical request.

    ``history`` is the conversation a ``previous_response_id`` refers to (the caller's own record of it);
    without it such a request is a 400. ``reuse``: the session's previous request's input items
    (:mod:`converters.delta`)."""
    obj = reuse.load(body, "input", "responses") if reuse is not None else load_json_object(body)
    sink = fields if fields is not None else UnknownFields()
    sink.check("body", obj, KNOWN_FIELDS)
    _reject_stateful(obj, history)
    model = expect(obj, "model", str, "body", required=True)
    messages, carriers = parse_input(obj.get("input"), sink, reuse)
    carried = [(i, item, _parse_tools(item.get("tools"), f"body.input[{i}].tools", sink)) for i, item in carriers]
    extras: dict[str, Any] = {k: obj[k] for k in EXTRA_FIELDS if obj.get(k) is not None}
    if carried:  # where the items stood and how many tools each held, so that rendering puts them back
        extras["input.additional_tools"] = [
            {"position": i, "count": len(found), **rest(item, "type", "tools")} for i, item, found in carried
        ]
    previous = expect(obj, "previous_response_id", str, "body")
    if previous is not None and history is not None:  # history is ignored when the body does not refer to it
        extras["previous_response_id"] = previous
        extras["history_messages"] = len(history)
        messages = tuple(history) + messages
    instructions = expect(obj, "instructions", str, "body")
    if instructions is not None:

        def lead() -> Message:
            return Message("system", (TextPart(instructions),), wire_state({"source": "instructions"}))

        # unchanged bytes: the previous request's very message object (see converters.anthropic)
        messages = (reuse.value("instructions", lead) if reuse else lead(),) + messages
    raw_tools = obj.get("tools")
    listed = (
        reuse.value("tools", lambda: _parse_tools(raw_tools, "body.tools", sink))
        if reuse
        else _parse_tools(raw_tools, "body.tools", sink)
    )
    tools = listed + tuple(t for _, _, found in carried for t in found)
    output_format = _parse_text(expect(obj, "text", dict, "body"), extras, sink)
    return ModelRequest(
        format="responses",
        model=model,
        messages=messages,
        tools=tools,
        # With no tools a tool_choice means nothing (clients send `tools: []` with `tool_choice: auto`).
        tool_choice=_parse_tool_choice(obj.get("tool_choice"), tools) if tools else None,
        parallel_tool_calls=expect(obj, "parallel_tool_calls", bool, "body"),
        sampling=SamplingParams(
            max_tokens=_max_tokens(expect(obj, "max_output_tokens", int, "body")),
            temperature=_float(expect(obj, "temperature", (int, float), "body")),
            top_p=_float(expect(obj, "top_p", (int, float), "body")),
        ),
        stream=bool(expect(obj, "stream", bool, "body")),
        output_format=output_format,
        reasoning=_parse_reasoning(expect(obj, "reasoning", dict, "body"), extras, sink),
        identity=_parse_identity(obj, headers),
        extras=extras,
    )


def _float(value: int | float | None) -> float | None:
    return None if value is None else float(value)


def _max_tokens(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise invalid(f"max_output_tokens must be at least 1, got {value}", "max_output_tokens")
    return value


def _reject_stateful(obj: Mapping[str, Any], history: Sequence[Message] | None) -> None:
    if obj.get("previous_response_id") is not None and history is None:
        raise invalid(f"previous_response_id {STATEFUL}; send the full conversation in input", "previous_response_id")
    for name in ("conversation", "prompt"):
        if obj.get(name) is not None:
            raise invalid(f"{name} {STATEFUL}", name)
    if obj.get("background"):
        raise invalid(f"background: true {STATEFUL}", "background")


def _parse_identity(obj: Mapping[str, Any], headers: Mapping[str, str] | None) -> IdentityHints:
    h = {k.lower(): v for k, v in (headers or {}).items()}
    session_id = h.get("session-id") or h.get("session_id") or h.get("x-session-id")
    if session_id is None and "x-codex-turn-metadata" in h:
        try:
            meta = json.loads(h["x-codex-turn-metadata"])
            session_id = meta.get("session_id") if isinstance(meta, dict) else None
        except json.JSONDecodeError:
            session_id = None
    return IdentityHints(
        headers={k: h[k] for k in SESSION_HEADERS if k in h},
        user_id=expect(obj, "user", str, "body"),
        session_id=session_id if isinstance(session_id, str) else None,
        prompt_cache_key=expect(obj, "prompt_cache_key", str, "body"),
        user_agent=h.get("user-agent"),
    )


# ------------------------------------------------------------------------------------------------ tools, options


def _parse_tools(raw: Any, where: str, sink: UnknownFields) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid(f"{where}: expected an array of tools", "tools")
    return tuple(_parse_tool(t, f"{where}[{i}]", sink) for i, t in enumerate(raw))


def _parse_tool(raw: Any, where: str, sink: UnknownFields) -> ToolSpec:
    ttype = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(ttype, str):
        raise invalid(f"{where}: a tool must be an object with a string type", "tools")
    if ttype not in TOOL_KEYS:
        # A provider-hosted tool (web_search, file_search …): nothing here runs it; keep it for the record.
        name = raw.get("name") if isinstance(raw.get("name"), str) else ttype
        return ToolSpec(name, kind="builtin", provider_state=wire_state({"tool": dict(raw)}))
    kind, known = TOOL_KEYS[ttype]
    extra = rest(raw, "type", "name", "description", *known)
    sink.report(f"tools.{ttype}", set(extra))
    state: dict[str, Any] = {"extra": extra} if extra else {}
    if ttype == "custom" and raw.get("format") is not None:
        state["format"] = raw["format"]
    return ToolSpec(
        name=expect(raw, "name", str, where, required=True),
        description=expect(raw, "description", str, where) or "",
        parameters=expect(raw, "parameters", dict, where) if ttype == "function" else None,
        kind=kind,
        strict=expect(raw, "strict", bool, where) if ttype == "function" else None,
        tools=_parse_tools(raw.get("tools"), f"{where}.tools", sink) if ttype == "namespace" else (),
        provider_state=wire_state(state),
    )


def _parse_tool_choice(raw: Any, tools: Sequence[ToolSpec]) -> ToolChoice | None:
    if raw is None:
        return None
    if raw in ("auto", "none", "required"):
        return ToolChoiceMode(raw)
    if isinstance(raw, dict) and raw.get("type") in ("function", "custom") and isinstance(raw.get("name"), str):
        if raw["name"] not in {t.name for t in _flat(tools) if t.kind in ("function", "custom")}:
            raise invalid(f"tool_choice names {raw['name']!r}, which is not among the tools", "tool_choice")
        return ToolChoiceNamed(raw["name"])
    raise invalid(f"tool_choice {json.dumps(raw)[:80]} is not supported (use auto, none, required or a named tool)")


def _parse_text(text: Mapping[str, Any] | None, extras: dict[str, Any], sink: UnknownFields) -> OutputFormat:
    if text is None:
        return TextFormat()
    sink.check("text", text, {"format", "verbosity"})
    if text.get("verbosity") is not None:
        extras["text.verbosity"] = text["verbosity"]
    fmt = expect(text, "format", dict, "body.text") or {"type": "text"}
    kind = fmt.get("type")
    if kind == "text":
        return TextFormat()
    if kind == "json_object":
        return JsonObjectFormat()
    if kind != "json_schema":
        raise invalid(f"text.format.type {kind!r} is not supported", "text.format")
    if fmt.get("description") is not None:
        extras["text.format.description"] = fmt["description"]
    return JsonSchemaFormat(
        schema=expect(fmt, "schema", dict, "body.text.format", required=True),
        name=expect(fmt, "name", str, "body.text.format") or "output",
        strict=expect(fmt, "strict", bool, "body.text.format"),
    )


def _parse_reasoning(
    raw: Mapping[str, Any] | None, extras: dict[str, Any], sink: UnknownFields
) -> ReasoningRequest | None:
    if raw is None:
        return None
    sink.check("reasoning", raw, {"effort", "summary", "context", "generate_summary"})
    effort = expect(raw, "effort", str, "body.reasoning")
    summary = expect(raw, "summary", str, "body.reasoning")
    if summary not in (None, "auto"):
        extras["reasoning.summary"] = summary
    for key in ("context", "generate_summary"):
        if raw.get(key) is not None:
            extras[f"reasoning.{key}"] = raw[key]
    return ReasoningRequest(
        enabled=False if effort == "none" else None,
        effort=effort,
        include_in_output=True if summary is not None else None,
    )


# --------------------------------------------------------------------------------------------------- render


def render_request(req: ModelRequest) -> dict[str, Any]:
    """The Responses body for ``req``: the inverse of :func:`parse_request` (headers are not in the body)."""
    ex = dict(req.extras)
    messages = list(req.messages)
    body: dict[str, Any] = {"model": req.model}
    if messages and state_data(messages[0].provider_state).get("source") == "instructions":
        body["instructions"] = messages.pop(0).text
    if "previous_response_id" in ex:
        body["previous_response_id"] = ex.pop("previous_response_id")
        messages = messages[ex.pop("history_messages", 0) :]
    carriers: list[Mapping[str, Any]] = ex.pop("input.additional_tools", [])
    n_top = len(req.tools) - sum(c["count"] for c in carriers)
    rendered, offset = [], n_top
    for c in carriers:
        tools = [_render_tool(t) for t in req.tools[offset : offset + c["count"]]]
        rendered.append((c["position"], {"type": "additional_tools", **rest(c, "position", "count"), "tools": tools}))
        offset += c["count"]
    body["input"] = render_input(messages, rendered)
    if req.tools[:n_top]:
        body["tools"] = [_render_tool(t) for t in req.tools[:n_top]]
    if req.tool_choice is not None:
        body["tool_choice"] = _render_tool_choice(req.tool_choice, req.tools)
    optional = {
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_output_tokens": req.sampling.max_tokens,
        "temperature": req.sampling.temperature,
        "top_p": req.sampling.top_p,
        "prompt_cache_key": req.identity.prompt_cache_key,
        "user": req.identity.user_id,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.stream:
        body["stream"] = True
    if req.reasoning is not None:
        body["reasoning"] = _render_reasoning(req.reasoning, ex)
    text = _render_text(req.output_format, ex)
    if text:
        body["text"] = text
    body.update({k: v for k, v in ex.items() if k in EXTRA_FIELDS})
    return body


def _render_tool(t: ToolSpec) -> dict[str, Any]:
    state = state_data(t.provider_state)
    if t.kind == "builtin":
        return dict(state.get("tool", {"type": t.name}))
    out: dict[str, Any] = {"type": t.kind, "name": t.name}
    if t.description:
        out["description"] = t.description
    if t.parameters is not None:
        out["parameters"] = t.parameters
    if t.strict is not None:
        out["strict"] = t.strict
    if "format" in state:
        out["format"] = state["format"]
    if t.kind == "namespace":
        out["tools"] = [_render_tool(s) for s in t.tools]
    return {**out, **state.get("extra", {})}


def _flat(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    return [x for t in tools for x in (_flat(t.tools) if t.kind == "namespace" else [t])]


def _render_tool_choice(choice: ToolChoice, tools: Sequence[ToolSpec]) -> Any:
    if isinstance(choice, ToolChoiceMode):
        return choice.mode
    custom = any(t.name == choice.name and t.kind == "custom" for t in _flat(tools))
    return {"type": "custom" if custom else "function", "name": choice.name}


def _render_reasoning(r: ReasoningRequest, ex: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.effort is not None:
        out["effort"] = r.effort
    if r.include_in_output:
        out["summary"] = ex.get("reasoning.summary", "auto")
    for key in ("context", "generate_summary"):
        if f"reasoning.{key}" in ex:
            out[key] = ex[f"reasoning.{key}"]
    return out


def _render_text(fmt: OutputFormat, ex: Mapping[str, Any]) -> dict[str, Any]:
    text: dict[str, Any] = {}
    if isinstance(fmt, JsonObjectFormat):
        text["format"] = {"type": "json_object"}
    elif isinstance(fmt, JsonSchemaFormat):
        text["format"] = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema}
        if fmt.strict is not None:
            text["format"]["strict"] = fmt.strict
        if "text.format.description" in ex:
            text["format"]["description"] = ex["text.format.description"]
    if "text.verbosity" in ex:
        text["verbosity"] = ex["text.verbosity"]
    return text


# --------------------------------------------------------------------------------------------------- dialect


class ResponsesDialect(Dialect):
    """OpenAI Responses. Stateless; ``parse_request`` also takes ``history=`` for ``previous_response_id``."""

    format: ClassVar[WireFormat] = "responses"

    def parse_request(
        self,
        body: bytes | Mapping[str, Any],
        route: Route,
        headers: Mapping[str, str] | None = None,
        fields: UnknownFields | None = None,
        *,
        history: Sequence[Message] | None = None,
        reuse: ItemReuse | None = None,
    ) -> ModelRequest:
        return parse_request(body, route, headers, fields, history=history, reuse=reuse)

    def render_request(self, request: ModelRequest) -> dict[str, Any]:
        return render_request(request)

    def render_completion(self, completion: Completion) -> dict[str, Any]:
        return render_response(completion)

    def stream_encoder(self, route: Route, request: ModelRequest | None = None) -> StreamEncoder:
        # Responses has no request-level stream options; the response echoes API defaults, not the request, so
        # that the stream's final response equals the non-streaming body (which is rendered without a request).
        return ResponsesStreamEncoder()

    def render_error(self, err: ConversionError) -> WireResponse:
        return render_error(err)


DIALECT = ResponsesDialect()

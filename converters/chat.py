"""OpenAI Chat Completions (``POST /v1/chat/completions``, wire format ``"chat"``) <-> the canonical model.

Contract
--------
``DIALECT.parse_request`` turns a Chat Completions body into a :class:`~converters.canonical.ModelRequest`
without loss of anything the canonical model can hold: every message (system, developer, user, assistant,
tool), text and ``image_url`` parts, assistant ``reasoning_content``/``reasoning`` (-> ``ReasoningPart``),
``function`` and ``custom`` tool calls and tools, tool choice, sampling, ``response_format``,
``reasoning_effort``, the stream flags and identity hints. Unsupported requests (``n > 1``, audio, legacy
``functions``, content types chat cannot carry) raise a 400 :class:`~converters.canonical.ConversionError`;
unknown fields go to the :class:`~converters.base.UnknownFields` sink and are otherwise ignored.
``render_request`` is the inverse: ``parse_request(render_request(r)) == r`` for every request chat can
represent.

The request renderer lives in :mod:`converters.chat_render`; responses (the body, the stream encoder, the
error shape) in :mod:`converters.chat_stream`.

Quirks handled on purpose: ``tools: []`` drops ``tool_choice``; ``stream_options`` is ignored unless
``stream`` is true; ``max_completion_tokens`` wins over the older ``max_tokens``; tool results given as JSON
values (not text) are kept as JSON text; a ``metadata`` session id (``session_id``/``sessionId``, or a
JSON-string ``user_id`` holding one) becomes ``identity.session_id``; vLLM's ``top_k``/``min_p`` extensions
are read.

Organisation: field tables; request parsing (top level, messages, content, tools, sampling, identity); the
:class:`ChatDialect`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from converters.base import Dialect, ItemReuse, Route, UnknownFields, expect, load_json_object
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
from converters.chat_render import render_chat_request
from converters.chat_stream import ChatStreamEncoder, render_completion_body, render_error_response

# Fields kept verbatim in ModelRequest.extras: accepted, recorded, not interpreted.
_EXTRAS = tuple(
    "store metadata service_tier logprobs top_logprobs logit_bias verbosity safety_identifier"
    " prompt_cache_retention prediction modalities chat_template_kwargs".split()
)
_READ = frozenset(
    "model messages tools tool_choice parallel_tool_calls max_tokens max_completion_tokens temperature top_p"
    " top_k min_p stop seed presence_penalty frequency_penalty response_format stream stream_options"
    " reasoning_effort user prompt_cache_key n".split()
)
# Fields chat defines whose meaning we cannot honour: a clear 400 beats silently answering something else.
_REJECTED = {
    "functions": "legacy `functions` is not supported; send `tools`",
    "function_call": "legacy `function_call` is not supported; send `tool_choice`",
    "audio": "audio output is not supported",
    "web_search_options": "hosted web search is not supported",
}
_KNOWN = _READ | frozenset(_EXTRAS) | frozenset(_REJECTED)
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
_ASSISTANT_KEYS = _MESSAGE_KEYS | frozenset(
    "tool_calls reasoning_content reasoning refusal annotations audio function_call".split()
)
_TOOL_KEYS = _MESSAGE_KEYS | {"tool_call_id"}
# Request headers kept as identity hints: any naming a session, plus per-request ids harnesses send.
_ID_HEADERS = frozenset({"thread-id", "x-client-request-id", "x-request-id"})

Kind = Literal["function", "custom"]


def _bad(where: str, message: str, param: str | None = None) -> ConversionError:
    return ConversionError("invalid_request", f"{where}: {message}", param=param or where)


# ---------------------------------------------------------------------------------------------------- parsing


def parse_chat_request(
    body: bytes | Mapping[str, Any],
    headers: Mapping[str, str] | None,
    fields: UnknownFields,
    reuse: ItemReuse | None = None,
) -> ModelRequest:
    """The whole request, as a short pipeline of the helpers below."""
    obj = reuse.load(body, "messages", "chat") if reuse is not None else load_json_object(body)
    fields.check("chat", obj, _KNOWN)
    for key, why in _REJECTED.items():
        if obj.get(key) is not None:
            raise _bad(key, why)
    if any(m != "text" for m in expect(obj, "modalities", list, "chat") or ()):
        raise _bad("modalities", "only text output is supported")
    n = expect(obj, "n", int, "chat")
    if n is not None and n != 1:
        raise _bad("n", f"n={n} is not supported; only one choice per request")
    stream = bool(expect(obj, "stream", bool, "chat"))
    raw_tools = expect(obj, "tools", list, "chat") or []
    tools = reuse.value("tools", lambda: _parse_tools(raw_tools, fields)) if reuse else _parse_tools(raw_tools, fields)
    return ModelRequest(
        format="chat",
        model=expect(obj, "model", str, "chat", required=True),
        messages=_parse_messages(expect(obj, "messages", list, "chat", required=True), fields, reuse),
        tools=tools,
        tool_choice=_parse_tool_choice(obj.get("tool_choice"), tools),
        parallel_tool_calls=expect(obj, "parallel_tool_calls", bool, "chat"),
        sampling=_parse_sampling(obj),
        stream=stream,
        include_usage=stream and _include_usage(obj, fields),
        output_format=_parse_output_format(expect(obj, "response_format", dict, "chat"), fields),
        reasoning=_parse_reasoning(expect(obj, "reasoning_effort", str, "chat")),
        identity=_parse_identity(obj, {k.lower(): v for k, v in (headers or {}).items()}),
        extras={k: obj[k] for k in _EXTRAS if obj.get(k) is not None},
    )


def _include_usage(obj: Mapping[str, Any], fields: UnknownFields) -> bool:
    options = expect(obj, "stream_options", dict, "chat") or {}
    fields.check("chat.stream_options", options, {"include_usage", "include_obfuscation"})
    return bool(expect(options, "include_usage", bool, "stream_options"))


def _parse_messages(raw: list[Any], fields: UnknownFields, reuse: ItemReuse | None = None) -> tuple[Message, ...]:
    """A tool result takes the kind of the call it answers, from the messages before it: those ``reuse`` gives back
    (always a leading run) were parsed after the same messages, and their calls' kinds are read off them."""
    if not raw:
        raise _bad("messages", "must contain at least one message")
    call_kinds = _CallKinds()  # tool results inherit the kind of the call they answer

    def one(m: Any, i: int) -> Message:
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"expected object, got {type(m).__name__}")
        message = _parse_message(m, where, call_kinds, fields)
        call_kinds.note(message)
        return message

    if reuse is None:
        return tuple(one(m, i) for i, m in enumerate(raw))
    return tuple(reuse.items(raw, one, call_kinds.reused))


class _CallKinds:
    """The kind of each tool call before the message being parsed, the latest call of an id winning.

    The calls of the messages parsed here are noted as they are parsed. The leading run a delta parse reuses is
    searched, newest first, only for a result whose call was not noted: a result usually answers the message just
    before it, which is new in its call, so a long session's history is not walked on every call (noting every
    reused message was O(session length) per call, 2.5% of an 800-call session's GIL time)."""

    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}
        self._earlier: Sequence[Message] = ()
        self._unsearched = 0  # how many of the reused messages, from the first, are not searched yet

    def reused(self, messages: Sequence[Message]) -> None:
        # the delta parse's own list, which goes on to take the new messages: only its first len() are searched
        self._earlier, self._unsearched = messages, len(messages)

    def note(self, message: Message) -> None:
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                self._kinds[part.id] = part.kind  # later than anything noted or searched: it wins

    def get(self, call_id: str, default: Kind) -> Kind:
        kind = self._kinds.get(call_id)
        while kind is None and self._unsearched:
            self._unsearched -= 1
            for part in reversed(self._earlier[self._unsearched].parts):
                if isinstance(part, ToolCallPart):
                    self._kinds.setdefault(part.id, part.kind)  # searched newest first: the first found wins
            kind = self._kinds.get(call_id)
        return default if kind is None else kind


def _parse_message(m: Mapping[str, Any], where: str, call_kinds: _CallKinds, fields: UnknownFields) -> Message:
    role = expect(m, "role", str, where, required=True)
    content = m.get("content")
    parts: tuple[Part, ...]
    if role in ("system", "developer"):
        fields.check(f"messages.{role}", m, _MESSAGE_KEYS)
        parts = _content_parts(content, where, False, fields)
    elif role == "user":
        fields.check("messages.user", m, _MESSAGE_KEYS)
        parts = _content_parts(content, where, True, fields)
    elif role == "assistant":
        fields.check("messages.assistant", m, _ASSISTANT_KEYS)
        parts = _assistant_parts(m, where, fields)
    elif role == "tool":
        fields.check("messages.tool", m, _TOOL_KEYS)
        call_id = expect(m, "tool_call_id", str, where, required=True)
        result = ToolResultPart(
            call_id,
            _result_content(content, where, fields),
            name=expect(m, "name", str, where),
            kind=call_kinds.get(call_id, "function"),
        )
        return Message("tool", (result,))
    else:
        raise _bad(f"{where}.role", f"unsupported role {role!r}")
    return Message(role, parts, _message_state(m, where))


def _message_state(m: Mapping[str, Any], where: str) -> ProviderState | None:
    """``name``, a ``refusal`` and ``annotations`` have no canonical slot; they travel as chat provider state."""
    data: dict[str, Any] = {k: expect(m, k, str, where) for k in ("name", "refusal") if m.get(k) is not None}
    if expect(m, "annotations", list, where):
        data["annotations"] = m["annotations"]
    return ProviderState("chat", data) if data else None


def _content_parts(content: Any, where: str, images: bool, fields: UnknownFields) -> tuple[Part, ...]:
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextPart(content),)
    if not isinstance(content, list):
        raise _bad(f"{where}.content", f"expected string or array, got {type(content).__name__}")
    return tuple(_content_part(p, f"{where}.content[{j}]", images, fields) for j, p in enumerate(content))


def _content_part(p: Any, where: str, images: bool, fields: UnknownFields) -> TextPart | ImagePart:
    if not isinstance(p, dict):
        raise _bad(where, f"expected object, got {type(p).__name__}")
    kind = expect(p, "type", str, where, required=True)
    if kind == "text":
        fields.check("messages.content.text", p, {"type", "text"})
        # Extra keys (e.g. cache_control, which some chat providers honour) are kept and rendered back.
        extra = {k: v for k, v in p.items() if k not in ("type", "text")}
        state = ProviderState("chat", extra) if extra else None
        return TextPart(expect(p, "text", str, where, required=True), provider_state=state)
    if kind == "image_url" and images:
        return _image(p, where, fields)
    raise _bad(where, f"content part type {kind!r} is not supported here")


def _image(p: Mapping[str, Any], where: str, fields: UnknownFields) -> ImagePart:
    ref = expect(p, "image_url", (dict, str), where, required=True)
    if isinstance(ref, dict):
        fields.check("messages.content.image_url", ref, {"url", "detail"})  # detail: no canonical slot
    url: str = ref if isinstance(ref, str) else expect(ref, "url", str, f"{where}.image_url", required=True)
    if not url.startswith("data:"):
        return ImagePart("url", url)
    head, comma, data = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise _bad(where, "data URLs must be base64 encoded (data:<type>;base64,<data>)")
    return ImagePart("base64", data, head[len("data:") : -len(";base64")] or None)


def _assistant_parts(m: Mapping[str, Any], where: str, fields: UnknownFields) -> tuple[Part, ...]:
    """Reasoning first, then text, then tool calls: the order the model produced them in."""
    parts: list[Part] = []
    for key in ("reasoning_content", "reasoning"):  # vLLM and OpenRouter spell it differently
        text = expect(m, key, str, where)
        if text is not None:
            # Remember the spelling so the message renders back the way the harness sent it.
            state = ProviderState("chat", {"field": key}) if key == "reasoning" else None
            parts.append(ReasoningPart(text, state))
            break
    parts.extend(_content_parts(m.get("content"), where, False, fields))
    for key in ("audio", "function_call"):
        if m.get(key) is not None:
            raise _bad(f"{where}.{key}", f"assistant `{key}` is not supported")
    calls = expect(m, "tool_calls", list, where) or []
    parts.extend(_tool_call(c, f"{where}.tool_calls[{j}]", fields) for j, c in enumerate(calls))
    return tuple(parts)


def _tool_call(c: Any, where: str, fields: UnknownFields) -> ToolCallPart:
    if not isinstance(c, dict):
        raise _bad(where, f"expected object, got {type(c).__name__}")
    fields.check("messages.tool_calls", c, {"id", "type", "function", "custom", "index"})
    call_id = expect(c, "id", str, where, required=True)
    kind: Kind
    match expect(c, "type", str, where) or "function":
        case "function" | "custom" as kind:
            pass
        case other:
            raise _bad(f"{where}.type", f"unsupported tool call type {other!r}")
    body = expect(c, kind, dict, where, required=True)
    name = expect(body, "name", str, f"{where}.{kind}", required=True)
    key = "arguments" if kind == "function" else "input"
    args = body.get(key)
    # Some clients send arguments as a JSON object rather than JSON text; keep the text form.
    text = "" if args is None else args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCallPart(call_id, name, text, kind)


def _result_content(content: Any, where: str, fields: UnknownFields) -> tuple[ResultContent, ...]:
    """Tool output: text, an array of text/image parts, or (quirk) any other JSON value, kept as JSON text."""
    if content is None or isinstance(content, str | list):
        return tuple(p for p in _content_parts(content, where, True, fields) if isinstance(p, TextPart | ImagePart))
    return (TextPart(json.dumps(content, ensure_ascii=False)),)


def _parse_tools(raw: list[Any], fields: UnknownFields) -> tuple[ToolSpec, ...]:
    return tuple(_tool(t, f"tools[{i}]", fields) for i, t in enumerate(raw))


def _tool(t: Any, where: str, fields: UnknownFields) -> ToolSpec:
    if not isinstance(t, dict):
        raise _bad(where, f"expected object, got {type(t).__name__}")
    kind = expect(t, "type", str, where) or "function"
    if kind not in ("function", "custom"):
        # A provider-hosted or future tool kind: kept whole, so it renders back exactly as sent.
        fields.report("chat.tools.type", [kind])
        return ToolSpec(name=kind, kind="builtin", provider_state=ProviderState("chat", dict(t)))
    body = expect(t, kind, dict, where, required=True)
    inner = f"{where}.{kind}"
    name = expect(body, "name", str, inner, required=True)
    description = expect(body, "description", str, inner) or ""
    if kind == "custom":
        fields.check("chat.tools.custom", body, {"name", "description", "format"})
        fmt = expect(body, "format", dict, inner)
        state = ProviderState("chat", {"format": fmt}) if fmt is not None else None
        return ToolSpec(name, description, kind="custom", provider_state=state)
    fields.check("chat.tools.function", body, {"name", "description", "parameters", "strict"})
    parameters = expect(body, "parameters", dict, inner)
    return ToolSpec(name, description, parameters, "function", expect(body, "strict", bool, inner))


def _parse_tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice | None:
    # With no tools a choice means nothing, and `tools: []` plus a choice upsets some servers: drop both.
    if value is None or not tools:
        return None
    match value:
        case "auto" | "none" | "required":
            return ToolChoiceMode(value)
        case str():
            raise _bad("tool_choice", f"unknown tool_choice {value!r}")
    if not isinstance(value, dict):
        raise _bad("tool_choice", f"expected string or object, got {type(value).__name__}")
    kind = expect(value, "type", str, "tool_choice", required=True)
    if kind not in ("function", "custom"):
        raise _bad("tool_choice", f"tool_choice type {kind!r} is not supported")
    name = expect(expect(value, kind, dict, "tool_choice", required=True), "name", str, "tool_choice", required=True)
    if name not in {t.name for t in tools}:
        raise _bad("tool_choice", f"tool_choice names {name!r}, which is not among the tools")
    return ToolChoiceNamed(name)


def _number(obj: Mapping[str, Any], key: str) -> float | None:
    value = expect(obj, key, (int, float), "chat")
    return None if value is None else float(value)


def _parse_sampling(obj: Mapping[str, Any]) -> SamplingParams:
    new, old = expect(obj, "max_completion_tokens", int, "chat"), expect(obj, "max_tokens", int, "chat")
    max_tokens = new if new is not None else old
    if max_tokens is not None and max_tokens < 1:
        raise _bad("max_tokens", f"must be at least 1, got {max_tokens}")
    stop = obj.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("stop", "expected a string or an array of strings")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(obj, "temperature"),
        top_p=_number(obj, "top_p"),
        top_k=expect(obj, "top_k", int, "chat"),
        min_p=_number(obj, "min_p"),
        stop=tuple(stop or ()),
        seed=expect(obj, "seed", int, "chat"),
        presence_penalty=_number(obj, "presence_penalty"),
        frequency_penalty=_number(obj, "frequency_penalty"),
    )


def _parse_output_format(value: Mapping[str, Any] | None, fields: UnknownFields) -> OutputFormat:
    kind = "text" if value is None else expect(value, "type", str, "response_format", required=True)
    if kind == "text":
        return TextFormat()
    if kind == "json_object":
        return JsonObjectFormat()
    if kind != "json_schema" or value is None:
        raise _bad("response_format", f"response_format type {kind!r} is not supported")
    spec = expect(value, "json_schema", dict, "response_format", required=True)
    fields.check("chat.response_format.json_schema", spec, {"name", "schema", "strict", "description"})
    return JsonSchemaFormat(
        schema=expect(spec, "schema", dict, "json_schema") or {},
        name=expect(spec, "name", str, "json_schema") or "output",
        strict=expect(spec, "strict", bool, "json_schema"),
    )


def _parse_reasoning(effort: str | None) -> ReasoningRequest | None:
    return None if effort is None else ReasoningRequest(enabled=effort != "none", effort=effort)


def _parse_identity(obj: Mapping[str, Any], headers: Mapping[str, str]) -> IdentityHints:
    return IdentityHints(
        headers={k: v for k, v in headers.items() if "session" in k or k in _ID_HEADERS},
        user_id=expect(obj, "user", str, "chat"),
        session_id=_metadata_session(expect(obj, "metadata", dict, "chat") or {}),
        prompt_cache_key=expect(obj, "prompt_cache_key", str, "chat"),
        user_agent=headers.get("user-agent"),
    )


def _metadata_session(metadata: Mapping[str, Any]) -> str | None:
    for key in ("session_id", "sessionId"):
        if isinstance(metadata.get(key), str):
            return str(metadata[key])
    user_id = metadata.get("user_id")
    if isinstance(user_id, str) and user_id.startswith("{"):
        try:  # Claude Code style: a JSON string {"device_id", "account_uuid", "session_id"}
            decoded = json.loads(user_id)
        except json.JSONDecodeError:
            return None
        if isinstance(decoded, dict) and isinstance(decoded.get("session_id"), str):
            return str(decoded["session_id"])
    return None


# ---------------------------------------------------------------------------------------------------- dialect


class ChatDialect(Dialect):
    """OpenAI Chat Completions. Stateless; one instance serves every request."""

    format = "chat"

    def parse_request(
        self,
        body: bytes | Mapping[str, Any],
        route: Route,
        headers: Mapping[str, str] | None = None,
        fields: UnknownFields | None = None,
        *,
        reuse: ItemReuse | None = None,
    ) -> ModelRequest:
        return parse_chat_request(body, headers, fields if fields is not None else UnknownFields(), reuse)

    def render_request(self, request: ModelRequest) -> dict[str, Any]:
        return render_chat_request(request)

    def render_completion(self, completion: Completion) -> dict[str, Any]:
        return render_completion_body(completion)

    def stream_encoder(self, route: Route, request: ModelRequest | None = None) -> ChatStreamEncoder:
        """``request`` supplies ``stream_options.include_usage``; without it no usage chunk is sent."""
        return ChatStreamEncoder(include_usage=request.include_usage if request is not None else False)

    def render_error(self, err: ConversionError) -> WireResponse:
        return render_error_response(err)


DIALECT = ChatDialect()

"""OpenAI Responses input items to and from canonical messages (the part of the request that is the conversation).

Contract
--------
``parse_input(input, sink)`` turns the ``input`` field (a string or an item array) into canonical messages
and returns Codex's ``additional_tools`` items, untouched, with their positions; ``render_input(messages)``
is the exact inverse for everything this format can express. Both directions share the conventions below,
which is why they live in one module.

Conventions
-----------
* A message item becomes a :class:`Message` of its role. Wire details with no canonical field (``id``,
  ``status``, ``phase``, a missing ``type``, string ``content``, a non-``auto`` image ``detail``) are kept
  in ``ProviderState("responses", ...)``: on the message, or, for assistant items, on the item's first text
  part under ``"item"`` (assistant items merge, see below, and a text part carrying ``"item"`` starts a new
  message item).
* Text parts of a non-default type for their role (``refusal``, ``input_text`` in an assistant message,
  extra keys such as ``annotations``) keep their raw shape under ``"part"``.
* Consecutive assistant-side items (``reasoning``, assistant ``message``, ``function_call``,
  ``custom_tool_call``) merge into one assistant message: one model turn is one canonical message. With ``reuse``
  (:mod:`converters.delta`), a turn merged from the very items the session's previous request held is that
  request's message object, as a reused item is.
* ``reasoning``: text is the ``content`` (raw reasoning) when present, else the summaries joined by a blank
  line; an item that is not the plain rendering of its text (an ``id``, ``encrypted_content``, several
  summaries) is kept whole under ``"item"`` and rendered back verbatim.
* Tool output items (``function_call_output``, ``custom_tool_call_output``) are one ``tool`` message each.
  Output as a string, a content array (``"array"`` when it holds one text part) or, leniently, a JSON object
  (``"json"``).
* Unknown item types, content part types and ``item_reference`` are rejected (400, naming the type).

Organisation: shared helpers; parse (items, content, reasoning, calls, outputs); render (the same order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from converters.base import ItemReuse, UnknownFields, expect
from converters.canonical import (
    ConversionError,
    ImagePart,
    Message,
    Part,
    ProviderState,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
STATEFUL = "needs state stored by the server, which this proxy does not keep"
Carrier = tuple[int, Mapping[str, Any]]  # an additional_tools item and its index in ``input``


def invalid(message: str, param: str | None = None) -> ConversionError:
    return ConversionError("invalid_request", message, param=param)


def wire_state(data: Mapping[str, Any]) -> ProviderState | None:
    """Provider state for non-default wire details; None when there are none, so plain shapes compare equal."""
    return ProviderState("responses", dict(data)) if data else None


def state_data(state: ProviderState | None) -> Mapping[str, Any]:
    return state.data if state is not None and state.format == "responses" else {}


def rest(obj: Mapping[str, Any], *consumed: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in consumed}


# --------------------------------------------------------------------------------------------------- parse


def parse_input(
    raw: Any, sink: UnknownFields, reuse: ItemReuse | None = None
) -> tuple[tuple[Message, ...], list[Carrier]]:
    """Input items as messages, plus the ``additional_tools`` items (raw) and their indices in ``input``. Each item
    parses on its own (merging is a pass over the parsed items): those the session's previous request held come
    from ``reuse``."""
    if isinstance(raw, str):
        return (Message("user", (TextPart(raw),), wire_state({"source": "input_string"})),), []
    if not isinstance(raw, list):
        raise invalid("body.input: field required (a string or an array of input items)", "input")
    parsed = reuse.items(raw, lambda item, i: _parse_one(item, i, sink)) if reuse is not None else None
    if parsed is None:
        parsed = [_parse_one(item, i, sink) for i, item in enumerate(raw)]
    pieces = [p for p in parsed if isinstance(p, Message)]
    carriers = [(i, p[1]) for i, p in enumerate(parsed) if not isinstance(p, Message)]
    return _merge_assistant(pieces, reuse), carriers


def _parse_one(item: Any, i: int, sink: UnknownFields) -> Message | tuple[str, Mapping[str, Any]]:
    """One input item: its message, or an ``additional_tools`` item kept raw (tagged)."""
    where = f"body.input[{i}]"
    if not isinstance(item, dict):
        raise invalid(f"{where}: expected an object, got {type(item).__name__}", "input")
    kind = item.get("type", "message")
    if kind == "additional_tools":
        return ("additional_tools", item)
    return _parse_item(kind, item, where, sink)


def _parse_item(kind: Any, item: Mapping[str, Any], where: str, sink: UnknownFields) -> Message:
    if kind == "message":
        return _parse_message(item, where, sink)
    if kind == "reasoning":
        return Message("assistant", (_parse_reasoning_item(item, where),))
    if kind in ("function_call", "custom_tool_call"):
        return Message("assistant", (_parse_call(kind, item, where),))
    if kind in ("function_call_output", "custom_tool_call_output"):
        return Message("tool", (_parse_output(kind, item, where),))
    if kind == "item_reference":
        raise invalid(f"{where}: item_reference {STATEFUL}; send the referenced item itself", "input")
    raise invalid(f"{where}: unsupported input item type {kind!r}", "input")


def _merge_assistant(pieces: list[Message], reuse: ItemReuse | None = None) -> tuple[Message, ...]:
    """Join consecutive plain assistant messages: one model turn is one canonical message. A turn joined from the
    very items the session's previous call joined is that call's message object (``reuse.derived``): a new one
    each call made the session graph re-point every node from the first such turn on (~1 ms a call at 250 calls)."""
    out: list[Message] = []
    run: list[Message] = []

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            sources = tuple(run)

            def join() -> Message:
                return Message("assistant", tuple(p for m in sources for p in m.parts))

            out.append(reuse.derived("assistant_turn", sources, join) if reuse is not None else join())
        run.clear()

    for m in pieces:
        if m.role == "assistant" and m.provider_state is None:
            run.append(m)
        else:
            close_run()
            out.append(m)
    close_run()
    return tuple(out)


def _parse_message(item: Mapping[str, Any], where: str, sink: UnknownFields) -> Message:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise invalid(f"{where}.role: expected one of {', '.join(MESSAGE_ROLES)}, got {role!r}", "input")
    sink.check("input.message", item, {"type", "role", "content", "id", "status", "phase"})
    content = item.get("content")
    parts, details = _parse_content(content, f"{where}.content", role)
    residue: dict[str, Any] = {}
    if extra := rest(item, "type", "role", "content"):
        residue["extra"] = extra
    if "type" not in item:
        residue["untyped"] = True
    if isinstance(content, str):
        residue["string_content"] = True
    if details:
        residue["image_detail"] = details
    if role != "assistant" or not parts or not residue:
        return Message(role, parts, wire_state(residue))
    # Assistant items merge into one turn, so the item's own shape rides on its first text part.
    first = parts[0]
    assert isinstance(first, TextPart)  # assistant content holds text parts only (checked by _parse_content)
    head = TextPart(first.text, provider_state=wire_state({**state_data(first.provider_state), "item": residue}))
    return Message("assistant", (head,) + parts[1:])


def _text_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def _parse_content(content: Any, where: str, role: str) -> tuple[tuple[Part, ...], list[str | None]]:
    """Content parts, and each image's non-default ``detail`` (empty when all are ``auto``)."""
    if isinstance(content, str):
        return (TextPart(content),), []
    if not isinstance(content, list):
        raise invalid(f"{where}: expected a string or an array of content parts", "input")
    parts: list[Part] = []
    details: list[str | None] = []
    for j, part in enumerate(content):
        w = f"{where}[{j}]"
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in ("input_text", "output_text", "refusal"):
            key = "refusal" if ptype == "refusal" else "text"
            text = expect(part, key, str, w, required=True)
            residue = rest(part, key)
            plain = residue == {"type": _text_type(role)}
            parts.append(TextPart(text, provider_state=None if plain else wire_state({"part": residue})))
        elif ptype == "input_image" and role != "assistant":
            parts.append(_parse_image(part, w))
            detail = part.get("detail")
            details.append(None if detail in (None, "auto") else detail)
        else:
            raise invalid(f"{w}: unsupported content part type {ptype!r} in a {role} message", "input")
    return tuple(parts), details if any(details) else []


def _parse_image(part: Mapping[str, Any], where: str) -> ImagePart:
    url, file_id = expect(part, "image_url", str, where), expect(part, "file_id", str, where)
    if file_id is not None:
        return ImagePart("file_id", file_id)
    if url is None:
        raise invalid(f"{where}: input_image needs image_url or file_id", "input")
    head, sep, payload = url.partition(",")
    if url.startswith("data:") and sep and head.endswith(";base64"):
        return ImagePart("base64", payload, head[5:-7] or None)
    return ImagePart("url", url)


def _parse_reasoning_item(item: Mapping[str, Any], where: str) -> ReasoningPart:
    summary, content = item.get("summary") or [], item.get("content") or []
    if not isinstance(summary, list) or not isinstance(content, list):
        raise invalid(f"{where}: reasoning summary and content must be arrays", "input")
    texts = [expect(p, "text", str, f"{where}.part", required=True) if isinstance(p, dict) else None for p in content]
    notes = [
        expect(p, "text", str, f"{where}.summary", required=True) if isinstance(p, dict) else None for p in summary
    ]
    if None in texts or None in notes:
        raise invalid(f"{where}: reasoning parts must be objects with text", "input")
    # The raw reasoning (content) is what the model produced; a summary stands in when it is all there is.
    text = "".join(t for t in texts if t) if content else "\n\n".join(n for n in notes if n)
    plain = dict(item) == _plain_reasoning(text)
    return ReasoningPart(text, provider_state=None if plain else wire_state({"item": dict(item)}))


def _plain_reasoning(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}] if text else []}


def _parse_call(kind: str, item: Mapping[str, Any], where: str) -> ToolCallPart:
    payload = "arguments" if kind == "function_call" else "input"
    return ToolCallPart(
        id=expect(item, "call_id", str, where, required=True),
        name=expect(item, "name", str, where, required=True),
        arguments=expect(item, payload, str, where, required=True),
        kind="function" if kind == "function_call" else "custom",
        provider_state=wire_state(
            {"extra": extra} if (extra := rest(item, "type", "call_id", "name", payload)) else {}
        ),
    )


def _parse_output(kind: str, item: Mapping[str, Any], where: str) -> ToolResultPart:
    output = item.get("output")
    residue: dict[str, Any] = {}
    if isinstance(output, str):
        content: tuple[Part, ...] = (TextPart(output),)
    elif isinstance(output, list):
        content, details = _parse_content(output, f"{where}.output", "tool")
        if len(content) == 1 and isinstance(content[0], TextPart):
            residue["array"] = True
        if details:
            residue["image_detail"] = details
    elif isinstance(output, dict):  # not in the API, but some clients send JSON; keep it as its text
        content, residue["json"] = (TextPart(json.dumps(output, ensure_ascii=False)),), True
    else:
        raise invalid(f"{where}.output: expected a string or an array of content parts", "input")
    if extra := rest(item, "type", "call_id", "output"):
        residue["extra"] = extra
    return ToolResultPart(
        call_id=expect(item, "call_id", str, where, required=True),
        content=tuple(p for p in content if isinstance(p, TextPart | ImagePart)),
        kind="function" if kind == "function_call_output" else "custom",
        provider_state=wire_state(residue),
    )


# --------------------------------------------------------------------------------------------------- render


def render_input(messages: Sequence[Message], carriers: Sequence[Carrier] = ()) -> str | list[dict[str, Any]]:
    """The ``input`` field for ``messages``, rendered ``additional_tools`` items put back at their indices."""
    if len(messages) == 1 and not carriers and state_data(messages[0].provider_state).get("source") == "input_string":
        return messages[0].text
    items = [item for m in messages for item in _render_message(m)]
    for position, item in sorted(carriers, key=lambda c: c[0]):  # indices of the final list: insert in order
        items.insert(position, dict(item))
    return items


def _render_message(m: Message) -> list[dict[str, Any]]:
    # Tool results become output items wherever they sit (Anthropic and Gemini put them in user turns); what
    # else the message holds follows as a message of its role (a user message for a canonical tool message).
    results = [_render_output(p) for p in m.parts if isinstance(p, ToolResultPart)]
    others = tuple(p for p in m.parts if not isinstance(p, ToolResultPart))
    if m.role == "tool" or results:
        role = "user" if m.role == "tool" else m.role
        return results + ([_message_item(role, others, {})] if others else [])
    if m.role != "assistant" or state_data(m.provider_state):
        return [_message_item(m.role, m.parts, state_data(m.provider_state))]
    items: list[dict[str, Any]] = []
    group: list[TextPart] = []
    for p in (*m.parts, None):
        if isinstance(p, TextPart) and not (group and "item" in state_data(p.provider_state)):
            group.append(p)
            continue
        if group:
            items.append(_message_item("assistant", tuple(group), state_data(group[0].provider_state).get("item", {})))
            group = [p] if isinstance(p, TextPart) else []
        if isinstance(p, ReasoningPart):
            items.append(dict(state_data(p.provider_state).get("item") or _plain_reasoning(p.text)))
        elif isinstance(p, ToolCallPart):
            key = "arguments" if p.kind == "function" else "input"
            kind = "function_call" if p.kind == "function" else "custom_tool_call"
            extra = state_data(p.provider_state).get("extra", {})
            items.append({"type": kind, "call_id": p.id, "name": p.name, key: p.arguments, **extra})
        elif p is not None and not isinstance(p, TextPart):
            raise invalid(f"a {p.type} part cannot be sent in a Responses assistant message")
    return items


def _message_item(role: str, parts: Sequence[Part], residue: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {} if residue.get("untyped") else {"type": "message"}
    item["role"] = role
    if residue.get("string_content"):
        item["content"] = "".join(p.text for p in parts if isinstance(p, TextPart))
    else:
        item["content"] = _render_content(parts, role, residue.get("image_detail", []))
    item.update(residue.get("extra", {}))
    return item


def _render_content(parts: Sequence[Part], role: str, details: Sequence[str | None]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    images = iter(details)
    for p in parts:
        if isinstance(p, TextPart):
            residue = state_data(p.provider_state).get("part", {"type": _text_type(role)})
            out.append({**residue, "refusal" if residue.get("type") == "refusal" else "text": p.text})
        elif isinstance(p, ImagePart) and role != "assistant":
            out.append({"type": "input_image", **_render_image(p), "detail": next(images, None) or "auto"})
        else:
            raise invalid(f"a {p.type} part cannot be sent in a Responses {role} message")
    return out


def _render_image(p: ImagePart) -> dict[str, str]:
    if p.source == "file_id":
        return {"file_id": p.data}
    if p.source == "base64":
        return {"image_url": f"data:{p.media_type or 'application/octet-stream'};base64,{p.data}"}
    return {"image_url": p.data}


def _render_output(p: ToolResultPart) -> dict[str, Any]:
    residue = state_data(p.provider_state)
    plain_text = len(p.content) == 1 and isinstance(p.content[0], TextPart) and not residue.get("array")
    output: Any = _render_content(p.content, "tool", residue.get("image_detail", []))
    if residue.get("json"):
        output = json.loads(p.text)
    elif plain_text:
        output = p.text
    kind = "function_call_output" if p.kind == "function" else "custom_tool_call_output"
    return {"type": kind, "call_id": p.call_id, "output": output, **residue.get("extra", {})}

"""Canonical request -> chat-template messages -> prompt text -> prompt token ids, for one served model.

Contract
--------
:class:`PromptRenderer` is built once per model: it loads the tokenizer once, detects what the chat template
can render (:class:`TemplateCapabilities`), and is read-only afterwards, so the addon may call it from a
worker thread. ``render(request)`` gives a :class:`RenderedPrompt`: the exact ids to send to vLLM's
completions endpoint, the text they came from, how tools were rendered (``"native"`` or ``"fallback"``) and
the tools the model was offered (the output parser's allow-list). ``count_tokens(request)`` is the length of
those ids, generation prompt included.

Pipeline, one named step each:

1. :func:`reject_unsupported` — image inputs are a 400 (``supports_images`` is off: the model is text-only).
2. :func:`render_messages` — pure, no tokenizer: canonical messages -> the list of message dicts a Hugging
   Face chat template takes, plus its ``tools`` argument. Kept apart so conversation suffixes can be rendered
   alone.
3. :meth:`PromptRenderer.render_text` — ``apply_chat_template(..., add_generation_prompt=True)``.
4. Tokenise with ``add_special_tokens=False``: the template already writes every special token it wants (for
   SmolLM2 its BOS is ``<|im_start|>``, written by the template; a doubled BOS is refused as an internal
   error). The ids are the tokenizer's ``encode``'s, computed by the cheapest exact path
   (:mod:`addon.generation.token_encoder`).

Message mapping
---------------
* Leading ``system``/``developer`` messages merge into one ``system`` message, blank-line separated. A later
  one becomes a ``system`` message in place when the template renders one there, else a ``user`` message
  starting with :data:`MID_SYSTEM_MARKER`.
* Text parts of user/system messages join with blank lines (separate blocks); an assistant's text parts join
  with nothing (they are fragments of one generation).
* Assistant reasoning goes to ``reasoning_content`` when the template renders that field, else it is written
  into the content as a think span with the :class:`~addon.generation.parser.ParserSpec` tags, where it was in the turn.
* Tool calls and results: ``"native"`` mode (the template renders both ``tools`` and ``tool_calls``) passes
  tools through ``tools=``, calls as ``tool_calls`` (arguments as an object) and results as ``tool`` messages.
  ``"fallback"`` mode (SmolLM2) appends :data:`FALLBACK_TOOL_PROMPT` to the system message, writes calls in
  the history as the tool-call spans the parser reads, and results as ``user`` messages of
  ``<tool_response>…</tool_response>`` blocks (the model knows the user role; a ``tool`` role it never saw). A
  failed result's text starts with ``Error: ``.
* Tools offered: function and custom tools, namespaces flattened to their members' own names; provider-hosted
  (``builtin``) tools cannot run here and are left out; ``tool_choice: none`` offers none. A custom
  (free-text) tool is offered as a function with one string argument ``input``. ``required`` / a named choice
  adds one sentence to the fallback prompt (native templates get no such hint; decoding constraints are the
  addon's job).

Prefix stability
----------------
Each canonical message renders to its own template messages, never merged with its neighbours, and the system
message depends only on the leading instructions and the tools. So with a template that renders messages one
by one (SmolLM2's), rendering ``messages[:k]`` with the generation prompt is a prefix of rendering
``messages`` whenever ``messages[k]`` is an assistant turn, in text and in ids. It does not hold when the
tools or the leading instructions change between turns, when a new message is appended to the leading
instruction block, or with templates that rewrite earlier turns (e.g. ones that drop reasoning before the last
user message).

Organisation: constants; capabilities; tools; message conversion; the renderer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias

from jinja2 import TemplateError

from addon.generation.parser import CallKind, ParserSpec
from addon.generation.token_encoder import token_encoder
from converters.canonical import (
    ConversionError,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)

ToolMode: TypeAlias = Literal["native", "fallback"]
TemplateMessage: TypeAlias = dict[str, Any]

MID_SYSTEM_MARKER = "[System instruction]\n"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

FALLBACK_TOOL_PROMPT = """\
# Tools

You can call tools to help with the request. Each line between <tools> and </tools> describes one tool as \
JSON: its name, what it does, and a JSON schema of the arguments it takes.
<tools>
{tools}
</tools>

To call a tool, answer with a block like the one below, holding one JSON object with the tool's name and its \
arguments:
{open}
{{"name": "<tool name>", "arguments": {{<the arguments, as a JSON object>}}}}
{close}
Write one block per call; you may write several blocks in one answer. Each result comes back to you inside a \
{response_open}{response_close} block, in the order of the calls."""


def _custom_parameters() -> dict[str, Any]:
    """The one-string-argument schema a custom (free-text) tool is offered with. Fresh per call: never shared."""
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's free-text input."}},
        "required": ["input"],
    }


def _empty_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


# --------------------------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class TemplateCapabilities:
    """What a chat template renders, found by reading its source and rendering small probe conversations."""

    tools: bool  # renders the ``tools`` argument
    tool_calls: bool  # renders an assistant message's ``tool_calls``
    reasoning: bool  # renders an assistant message's ``reasoning_content``
    mid_system: bool  # renders a system message after the first user turn

    @property
    def native_tools(self) -> bool:
        return self.tools and self.tool_calls


_PROBE = "probe_x7q"


def _probe_tool() -> dict[str, Any]:
    function = {"name": _PROBE + "_tool", "description": "probe", "parameters": _empty_parameters()}
    return {"type": "function", "function": function}


def detect_capabilities(
    source: str, apply: Callable[[list[TemplateMessage], list[Any] | None], str]
) -> TemplateCapabilities:
    """Capabilities of the template ``source``; ``apply(messages, tools)`` renders with it (it may raise).

    A feature counts only if the source names it *and* a probe shows it rendered: a template that mentions
    ``tools`` in a comment, or raises on a mid-conversation system message, does not have it.
    """

    def renders(marker: str, messages: list[TemplateMessage], tools: list[Any] | None = None) -> bool:
        try:
            return marker in apply(messages, tools)
        except Exception:  # templates raise anything on input they do not expect (TemplateError, TypeError ...)
            return False

    user = {"role": "user", "content": "hello"}
    call = {"id": "call_1", "type": "function", "function": {"name": _PROBE + "_call", "arguments": {"a": 1}}}
    return TemplateCapabilities(
        tools=bool(re.search(r"\btools\b", source)) and renders(_PROBE + "_tool", [user], [_probe_tool()]),
        tool_calls="tool_calls" in source
        and renders(_PROBE + "_call", [user, {"role": "assistant", "content": "", "tool_calls": [call]}]),
        reasoning="reasoning_content" in source
        and renders(
            _PROBE + "_think",
            [user, {"role": "assistant", "content": "ok", "reasoning_content": _PROBE + "_think"}],
        ),
        mid_system=renders(
            _PROBE + "_sys",
            [
                user,
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": _PROBE + "_sys"},
                user,
            ],
        ),
    )


# ---------------------------------------------------------------------------------------------------- tools


def offered_tools(tools: Sequence[ToolSpec], choice: ToolChoice | None) -> tuple[ToolSpec, ...]:
    """The tools the model may call: namespaces flattened, built-ins left out; none if ``tool_choice`` is none."""
    if isinstance(choice, ToolChoiceMode) and choice.mode == "none":
        return ()
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for tool in tools:
        members = offered_tools(tool.tools, None) if tool.kind == "namespace" else (tool,)
        for t in members:
            if t.kind in ("function", "custom") and t.name not in seen:
                seen.add(t.name)
                out.append(t)
    return tuple(out)


def tool_schema(tool: ToolSpec) -> dict[str, Any]:
    """A tool as a chat template (or the fallback prompt) shows it: name, description, parameters schema."""
    params = _custom_parameters() if tool.kind == "custom" else dict(tool.parameters or _empty_parameters())
    return {"name": tool.name, "description": tool.description, "parameters": params}


def fallback_tool_prompt(tools: Sequence[ToolSpec], choice: ToolChoice | None, spec: ParserSpec) -> str:
    """The system-prompt section that teaches a template without tool support our tool-call spans."""
    lines = "\n".join(json.dumps(tool_schema(t), ensure_ascii=False) for t in tools)
    text = FALLBACK_TOOL_PROMPT.format(
        tools=lines,
        open=spec.tool_open,
        close=spec.tool_close,
        response_open=TOOL_RESPONSE_OPEN,
        response_close=TOOL_RESPONSE_CLOSE,
    )
    if isinstance(choice, ToolChoiceNamed):
        text += f"\nIn this answer you must call the tool {choice.name}."
    elif isinstance(choice, ToolChoiceMode) and choice.mode == "required":
        text += "\nIn this answer you must call at least one tool."
    return text


def _call_kind(tool: ToolSpec) -> CallKind:
    return "custom" if tool.kind == "custom" else "function"


def _call_arguments(part: ToolCallPart) -> Any:
    """A call's arguments as the object the model is shown (custom tools: ``{"input": text}``)."""
    if part.kind == "custom":
        return {"input": part.arguments}
    return part.parsed_arguments()


# ------------------------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class TemplateInput:
    """What :func:`render_messages` gives the chat template. The dicts are its input: do not mutate them."""

    messages: tuple[TemplateMessage, ...]
    tools: tuple[dict[str, Any], ...] | None
    mode: ToolMode
    offered: tuple[ToolSpec, ...]


def reject_unsupported(request: ModelRequest, supports_images: bool) -> None:
    """Raise a 400 for inputs the model cannot take (images into a text-only model)."""
    if supports_images:
        return
    for i, msg in enumerate(request.messages):
        for part in msg.parts:
            inner = part.content if isinstance(part, ToolResultPart) else (part,)
            if any(isinstance(p, ImagePart) for p in inner):
                raise ConversionError(
                    "invalid_request",
                    f"messages[{i}] contains an image, but the served model is text-only and cannot read it",
                )


def render_messages(request: ModelRequest, caps: TemplateCapabilities, spec: ParserSpec) -> TemplateInput:
    """Pure step: canonical request -> chat-template messages and tools (see the module docstring)."""
    mode: ToolMode = "native" if caps.native_tools else "fallback"
    offered = offered_tools(request.tools, request.tool_choice)
    lead = 0
    while lead < len(request.messages) and request.messages[lead].role in ("system", "developer"):
        lead += 1
    instructions = [t for m in request.messages[:lead] if (t := _join_text(m, "\n\n"))]
    if offered and mode == "fallback":
        instructions.append(fallback_tool_prompt(offered, request.tool_choice, spec))
    out: list[TemplateMessage] = [{"role": "system", "content": "\n\n".join(instructions)}] if instructions else []
    names = {p.id: p.name for m in request.messages for p in m.parts if isinstance(p, ToolCallPart)}
    for msg in request.messages[lead:]:
        out.extend(convert_message(msg, caps, mode, spec, names))
    tools = tuple({"type": "function", "function": tool_schema(t)} for t in offered) if mode == "native" else ()
    return TemplateInput(tuple(out), tools or None, mode, offered)


def convert_message(
    msg: Message, caps: TemplateCapabilities, mode: ToolMode, spec: ParserSpec, names: dict[str, str]
) -> list[TemplateMessage]:
    """One canonical message after the leading instructions -> its template messages."""
    match msg.role:
        case "system" | "developer":
            text = _join_text(msg, "\n\n")
            if caps.mid_system:
                return [{"role": "system", "content": text}]
            return [{"role": "user", "content": MID_SYSTEM_MARKER + text}]
        case "user" | "tool":
            return _convert_input(msg, mode, names)
        case "assistant":
            return [_convert_assistant(msg, caps, mode, spec)]


def _join_text(msg: Message, sep: str) -> str:
    for part in msg.parts:
        if not isinstance(part, TextPart):
            raise ConversionError("invalid_request", f"a {msg.role} message may hold only text, not {part.type}")
    return sep.join(p.text for p in msg.parts if isinstance(p, TextPart))


def _convert_input(msg: Message, mode: ToolMode, names: dict[str, str]) -> list[TemplateMessage]:
    """A user or tool message: text and tool results, in their order."""
    out: list[TemplateMessage] = []
    pending: list[str] = []  # user text (fallback: and response blocks) not yet put into a message

    def flush_user() -> None:
        if pending:
            out.append({"role": "user", "content": "\n\n".join(pending)})
            pending.clear()

    for part in msg.parts:
        if isinstance(part, TextPart) and msg.role == "tool":
            part = ToolResultPart(call_id="", content=(part,))  # a bare tool message: its text is the result
        if isinstance(part, TextPart):
            pending.append(part.text)
        elif isinstance(part, ToolResultPart):
            text = ("Error: " if part.is_error else "") + part.text
            if mode == "fallback":
                pending.append(f"{TOOL_RESPONSE_OPEN}\n{text}\n{TOOL_RESPONSE_CLOSE}")
            else:
                flush_user()
                name = part.name or names.get(part.call_id, "")
                out.append({"role": "tool", "content": text, "tool_call_id": part.call_id, "name": name})
        else:
            raise ConversionError("invalid_request", f"a {msg.role} message cannot hold a {part.type} part")
    flush_user()
    return out or [{"role": "user", "content": ""}]


def _convert_assistant(msg: Message, caps: TemplateCapabilities, mode: ToolMode, spec: ParserSpec) -> TemplateMessage:
    """An assistant turn: reasoning, text and calls, written where the template has no field for them."""
    segments: list[str] = []  # content pieces in turn order; adjacent text fragments are glued
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    last_text = False
    for part in msg.parts:
        if isinstance(part, TextPart):
            if last_text:
                segments[-1] += part.text
            else:
                segments.append(part.text)
        elif isinstance(part, ReasoningPart):
            if not part.text:
                continue  # redacted reasoning: only opaque state, nothing for the model to read
            if caps.reasoning:
                reasoning.append(part.text)
            else:
                segments.append(f"{spec.think_open}\n{part.text}\n{spec.think_close}\n")
        elif isinstance(part, ToolCallPart):
            args = _call_arguments(part)
            if mode == "native":
                calls.append({"id": part.id, "type": "function", "function": {"name": part.name, "arguments": args}})
            else:
                body = json.dumps({"name": part.name, "arguments": args}, ensure_ascii=False)
                segments.append(f"{spec.tool_open}\n{body}\n{spec.tool_close}")
        else:
            raise ConversionError("invalid_request", f"an assistant message cannot hold a {part.type} part")
        last_text = isinstance(part, TextPart)
    out: TemplateMessage = {"role": "assistant", "content": "\n".join(s for s in segments if s)}
    if reasoning:
        out["reasoning_content"] = "\n".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


# ------------------------------------------------------------------------------------------------- renderer


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready for the completions endpoint, and what the output parser needs to know about it."""

    prompt_ids: tuple[int, ...]
    prompt_text: str
    mode: ToolMode
    num_tools: int
    tool_kinds: tuple[tuple[str, CallKind], ...]  # the allow-list: offered tool name -> kind

    def allowed_tools(self) -> dict[str, CallKind]:
        """The output parser's allow-list: offered tool name -> kind."""
        return dict(self.tool_kinds)


class PromptRenderer:
    """Renders canonical requests for one model's tokenizer and chat template (see the module docstring)."""

    supports_images: ClassVar[bool] = False  # text-only: no image processor is loaded

    def __init__(self, tokenizer: Any, *, spec: ParserSpec | None = None, chat_template: str | None = None) -> None:
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; pass chat_template=")
        self.tokenizer = tokenizer
        self.spec = spec or ParserSpec()
        # A dict of named templates resolves to its "tool_use" one if present; one template serves all requests.
        self.template: str = tokenizer.get_chat_template(chat_template, tools=[_probe_tool()])
        self.capabilities = detect_capabilities(self.template, self._apply)
        self.token_encoder = token_encoder(tokenizer)  # tiktoken or the Rust backend, where either gives its ids

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, spec: ParserSpec | None = None) -> PromptRenderer:
        from transformers import AutoTokenizer  # heavy; imported only where a model is loaded

        return cls(AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True), spec=spec)

    def _apply(self, messages: list[TemplateMessage], tools: list[Any] | None) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=self.template, tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def render_messages(self, request: ModelRequest) -> TemplateInput:
        reject_unsupported(request, self.supports_images)
        return render_messages(request, self.capabilities, self.spec)

    def render_text(self, prompt: TemplateInput) -> str:
        try:
            return self._apply(list(prompt.messages), list(prompt.tools) if prompt.tools else None)
        except TemplateError as e:  # the template's raise_exception: a conversation it refuses, e.g. bad role order
            raise ConversionError("invalid_request", f"the chat template refused the conversation: {e}") from e

    def encode(self, text: str) -> tuple[int, ...]:
        ids = tuple(self.token_encoder.encode(text))
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[:2] == (bos, bos):
            raise ConversionError("internal", "rendered prompt starts with a doubled BOS token")
        return ids

    def render(self, request: ModelRequest, encode: Callable[[str], tuple[int, ...]] | None = None) -> RenderedPrompt:
        """The request's prompt text and ids; ``encode`` (default :meth:`encode`) may take the ids of a shared
        leading turn from a cache (:class:`addon.generation.lead_cache.LeadCache`): the same ids, less work."""
        prompt = self.render_messages(request)
        text = self.render_text(prompt)
        kinds = tuple((t.name, _call_kind(t)) for t in prompt.offered)
        return RenderedPrompt((encode or self.encode)(text), text, prompt.mode, len(prompt.offered), kinds)

    def count_tokens(self, request: ModelRequest) -> int:
        return len(self.render(request).prompt_ids)

"""Seeded synthetic agent sessions in all four wire formats, and the client side of one call (request bytes out,
streamed reply in).

Contract
--------
* :func:`make_script` draws one session from a seed: a 5–40k-character system prompt, 10–30 function tools (always
  including ``read_file`` and ``bash``, the tools :mod:`benchmarks.fake_engine` calls), 5–60 calls, tool outputs of
  0.1–20k characters. Same seed, same session, byte for byte. :func:`context_script` makes a session whose first
  prompt holds about a given number of characters (the context-size sweep).
* :class:`Conversation` is the growing history of a tool loop, canonical (``converters.canonical``): the replayer
  appends the assistant turn it was actually answered with (:class:`Reply`, so a token-faithful proxy can extend its
  previous call) and the tool results the script says, then :meth:`Conversation.wire` renders the next request with
  the format's own ``render_request`` — the same code a round-trip test trusts, not a hand-written body.
* :func:`decode_reply` reads a finished SSE answer of any format back into text + tool calls (what a harness would
  keep), and says whether the stream completed normally or carried an in-stream error.

Nothing here does I/O. Organisation: text generation; scripts; conversation and wire calls; reply decoding.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from converters import dialect_for
from converters.canonical import (
    Message,
    ModelRequest,
    SamplingParams,
    TextPart,
    ToolCallPart,
    ToolChoiceMode,
    ToolResultPart,
    ToolSpec,
    WireFormat,
)

FORMATS: tuple[WireFormat, ...] = ("chat", "responses", "anthropic", "gemini")
MODEL = {"chat": "gpt-5", "responses": "gpt-5-codex", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-pro"}
HOST = {
    "chat": "api.openai.com",
    "responses": "api.openai.com",
    "anthropic": "api.anthropic.com",
    "gemini": "generativelanguage.googleapis.com",
}
# Tools every session offers: the fake engine's canned answers call these, so its tool calls are always allowed.
CORE_TOOLS = ("read_file", "bash")

_WORDS = (
    "the file function return value module import class self test error path config list dict string "
    "int none true false request response session token record shard proxy engine stream parse render "
    "def if else for while try except with as from raise yield async await lambda pass break continue "
    "src tests docs main util helper handler client server cache buffer index offset length count"
).split()


def words(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters of code-like prose (ASCII, so sizes in characters are sizes in bytes)."""
    out: list[str] = []
    n = 0
    while n < chars:
        chunk = rng.choices(_WORDS, k=64)
        line = " ".join(chunk) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:chars]


# --------------------------------------------------------------------------------------------------- scripts


@dataclass(frozen=True)
class SessionScript:
    """Everything a session will send, fixed by its seed. ``tool_output_chars[i]`` sizes the results of call i."""

    session_id: str
    format: WireFormat
    seed: int
    system: str
    tools: tuple[ToolSpec, ...]
    first_user: str
    tool_output_chars: tuple[int, ...]
    max_tokens: int = 256
    model: str | None = None  # None: the vendor's usual model name for the format
    tools_off: bool = False  # send the tools with tool_choice "none" (vLLM's chat route refuses "auto" by default)

    @property
    def calls(self) -> int:
        return len(self.tool_output_chars) + 1


def _tool(rng: random.Random, name: str, scale: float = 1.0) -> ToolSpec:
    n = max(10, int(60 * scale))
    props = {f"arg_{i}": {"type": "string", "description": words(rng, n)} for i in range(rng.randint(1, 4))}
    if name in CORE_TOOLS:
        props = {"path" if name == "read_file" else "command": {"type": "string", "description": words(rng, n)}}
    return ToolSpec(
        name=name,
        description=words(rng, int(scale * rng.randint(100, 600))),
        parameters={"type": "object", "properties": props, "required": sorted(props)[:1]},
    )


def make_script(
    seed: int, index: int, format: WireFormat, *, calls: int | None = None, scale: float = 1.0
) -> SessionScript:
    """Session ``index`` of the run seeded ``seed`` (sizes as in the module docstring; ``calls`` overrides the
    number of calls, ``scale`` multiplies every text size: small sessions for an engine with a short context)."""
    rng = random.Random(f"{seed}:{index}:{format}")
    n_tools = rng.randint(10, 30) if scale >= 1 else 3
    names = list(CORE_TOOLS) + [f"tool_{i}" for i in range(n_tools - len(CORE_TOOLS))]
    n_calls = calls if calls is not None else rng.randint(5, 60)
    return SessionScript(
        session_id=f"s{seed}-{index}-{format}",
        format=format,
        seed=seed,
        system=words(rng, int(scale * rng.randint(5_000, 40_000))),
        tools=tuple(_tool(rng, n, scale) for n in names),
        first_user="Fix the failing test in tests/test_main.py.\n" + words(rng, rng.randint(50, 400)),
        tool_output_chars=tuple(max(20, int(scale * 10 ** rng.uniform(2, 4.3))) for _ in range(n_calls - 1)),
    )


def context_script(seed: int, index: int, format: WireFormat, prompt_chars: int, calls: int) -> SessionScript:
    """A session whose first prompt is about ``prompt_chars`` characters (a large file already read into the
    conversation), followed by ``calls - 1`` turns with small tool outputs: the steady state at that context."""
    rng = random.Random(f"ctx:{seed}:{index}:{format}")
    base = make_script(seed, index, format, calls=calls)
    pad = max(0, prompt_chars - len(base.system) - sum(len(t.description) for t in base.tools))
    return SessionScript(
        session_id=f"c{prompt_chars}-{seed}-{index}-{format}",
        format=format,
        seed=seed,
        system=base.system,
        tools=base.tools,
        first_user="Here is the file you asked for:\n" + words(rng, pad),
        tool_output_chars=tuple(rng.randint(200, 2000) for _ in range(calls - 1)),
    )


# --------------------------------------------------------------------------------------------------- the conversation


@dataclass(frozen=True)
class ToolCallSeen:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Reply:
    """What the client saw: ``complete`` when the stream ended normally; ``error`` when it carried an error."""

    text: str = ""
    tool_calls: tuple[ToolCallSeen, ...] = ()
    complete: bool = False
    error: str | None = None


@dataclass(frozen=True)
class WireCall:
    """One HTTP request of the replayer. ``path`` includes any query string."""

    format: WireFormat
    host: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]


@dataclass
class Conversation:
    """The growing canonical history of one session (the replayer's own, appended as calls complete)."""

    script: SessionScript
    messages: list[Message] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.rng.seed(f"conv:{self.script.seed}:{self.script.session_id}")
        self.messages = [
            Message("system", (TextPart(self.script.system),)),
            Message("user", (TextPart(self.script.first_user),)),
        ]

    def request(self) -> ModelRequest:
        s = self.script
        return ModelRequest(
            format=s.format,
            model=s.model or MODEL[s.format],
            messages=tuple(self.messages),
            tools=s.tools,
            tool_choice=ToolChoiceMode("none") if s.tools_off else None,
            sampling=SamplingParams(max_tokens=s.max_tokens),
            stream=True,
            include_usage=s.format == "chat",
        )

    def wire(self) -> WireCall:
        body = json.dumps(dialect_for(self.script.format).render_request(self.request()), separators=(",", ":"))
        return WireCall(self.script.format, HOST[self.script.format], path_for(self.script.format), body.encode(), ())

    def extend(self, reply: Reply, call: int) -> None:
        """Append the assistant turn as answered, then the results the script gives for call ``call``."""
        parts: list[Any] = [TextPart(reply.text)] if reply.text else []
        parts += [ToolCallPart(c.id, c.name, c.arguments) for c in reply.tool_calls]
        self.messages.append(Message("assistant", tuple(parts) or (TextPart(""),)))
        size = self.script.tool_output_chars[call] if call < len(self.script.tool_output_chars) else 200
        if reply.tool_calls:
            share = max(1, size // len(reply.tool_calls))
            results = tuple(
                ToolResultPart(c.id, (TextPart(words(self.rng, share)),), name=c.name) for c in reply.tool_calls
            )
            self.messages.append(Message("tool", results))
        else:
            self.messages.append(Message("user", (TextPart("Continue.\n" + words(self.rng, size)),)))


def path_for(format: WireFormat) -> str:
    return {
        "chat": "/v1/chat/completions",
        "responses": "/v1/responses",
        "anthropic": "/v1/messages",
        "gemini": f"/v1beta/models/{MODEL['gemini']}:streamGenerateContent?alt=sse",
    }[format]


# --------------------------------------------------------------------------------------------------- reply decoding


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each server-sent event in ``raw``."""
    out: list[tuple[str | None, str]] = []
    for block in raw.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out


def decode_reply(format: WireFormat, raw: bytes) -> Reply:
    """The assistant turn a streamed answer of ``format`` carries (see the module docstring)."""
    decoder = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "gemini": _gemini}[format]
    try:
        return decoder(sse_events(raw))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return Reply(error=f"undecodable stream: {type(e).__name__}: {e}")


def _chat(events: list[tuple[str | None, str]]) -> Reply:
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    for _, data in events:
        if data == "[DONE]":
            return Reply("".join(text), tuple(ToolCallSeen(*c) for _, c in sorted(calls.items())), True)
        obj = json.loads(data)
        if "error" in obj:
            return Reply("".join(text), error=json.dumps(obj["error"]))
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], ["", "", ""])
                slot[0] = tc.get("id") or slot[0]
                fn = tc.get("function") or {}
                slot[1] = fn.get("name") or slot[1]
                slot[2] += fn.get("arguments") or ""
    return Reply("".join(text))


def _responses(events: list[tuple[str | None, str]]) -> Reply:
    for _, data in events:
        obj = json.loads(data)
        kind = obj.get("type")
        if kind in ("response.failed", "error", "response.incomplete"):
            return Reply(error=json.dumps(obj))
        if kind == "response.completed":
            text, calls = [], []
            for item in obj["response"]["output"]:
                if item["type"] == "message":
                    text += [c.get("text", "") for c in item["content"] if c["type"] == "output_text"]
                elif item["type"] == "function_call":
                    calls.append(ToolCallSeen(item["call_id"], item["name"], item["arguments"]))
            return Reply("".join(text), tuple(calls), True)
    return Reply()


def _anthropic(events: list[tuple[str | None, str]]) -> Reply:
    blocks: dict[int, list[str]] = {}  # index -> [kind, text-or-args, id, name]
    for name, data in events:
        obj = json.loads(data)
        kind = obj.get("type", name)
        if kind == "error":
            return Reply(error=json.dumps(obj))
        if kind == "content_block_start":
            b = obj["content_block"]
            blocks[obj["index"]] = [b["type"], b.get("text", ""), b.get("id", ""), b.get("name", "")]
        elif kind == "content_block_delta":
            d = obj["delta"]
            blocks[obj["index"]][1] += d.get("text") or d.get("partial_json") or ""
        elif kind == "message_stop":
            text = "".join(b[1] for _, b in sorted(blocks.items()) if b[0] == "text")
            calls = tuple(
                ToolCallSeen(b[2], b[3], b[1] or "{}") for _, b in sorted(blocks.items()) if b[0] == "tool_use"
            )
            return Reply(text, calls, True)
    return Reply()


def _gemini(events: list[tuple[str | None, str]]) -> Reply:
    text: list[str] = []
    calls: list[ToolCallSeen] = []
    for _, data in events:
        obj = json.loads(data)
        if "error" in obj:
            return Reply("".join(text), error=json.dumps(obj["error"]))
        for cand in obj.get("candidates") or []:
            for part in (cand.get("content") or {}).get("parts") or []:
                if "text" in part and not part.get("thought"):
                    text.append(part["text"])
                if "functionCall" in part:
                    fc = part["functionCall"]
                    calls.append(ToolCallSeen(fc.get("id", ""), fc["name"], json.dumps(fc.get("args") or {})))
            if cand.get("finishReason"):
                return Reply("".join(text), tuple(calls), True)
    return Reply()

"""converters/__init__.py: the dialect registry, and what survives a trip through every other format.

The per-format test files prove ``parse(render(req)) == req`` within one format. Here a canonical conversation goes
canonical -> format A -> canonical -> format B -> canonical, and the semantics every format can carry (who said what,
tool calls with their parsed arguments, tool results, tool definitions, max tokens, temperature) must be unchanged.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converters import WIRE_FORMATS, dialect_for
from converters.base import Route
from converters.canonical import (
    ERROR_STATUS,
    RETRYABLE_KINDS,
    ConversionError,
    ErrorKind,
    Message,
    ModelRequest,
    SamplingParams,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
)

ROUTES = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini": Route("gemini", "/v1beta/models/m:generateContent", model="m", stream=False),
}

words = st.text(alphabet="abcdefghij klmnop\u00e9\u4e2d", min_size=1, max_size=20).map(str.strip).filter(bool)
names = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
json_args = st.dictionaries(names, st.one_of(st.integers(-5, 5), words, st.booleans()), max_size=3)


@st.composite
def conversations(draw) -> ModelRequest:
    tool_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    tools = tuple(
        ToolSpec(n, draw(words), {"type": "object", "properties": {"x": {"type": "string"}}}) for n in tool_names
    )
    messages: list[Message] = [Message("system", (TextPart(draw(words)),))]
    messages.append(Message("user", (TextPart(draw(words)),)))
    for turn in range(draw(st.integers(0, 3))):
        calls = [
            ToolCallPart(f"call_{turn}_{i}", draw(st.sampled_from(tool_names)), json.dumps(draw(json_args)))
            for i in range(draw(st.integers(1, 2)))
        ]
        text = draw(st.one_of(st.none(), words))
        messages.append(Message("assistant", ((TextPart(text),) if text else ()) + tuple(calls)))
        results = tuple(ToolResultPart(c.id, (TextPart(draw(words)),), name=c.name) for c in calls)
        messages.append(Message("tool", results))
        messages.append(Message("user", (TextPart(draw(words)),)))
    sampling = SamplingParams(max_tokens=draw(st.integers(1, 4096)), temperature=draw(st.sampled_from([0.0, 0.5, 1.0])))
    return ModelRequest("chat", "m", tuple(messages), tools=tools, sampling=sampling)


def semantics(req: ModelRequest) -> dict:
    """What every format carries: speakers' texts, calls with parsed args, results, tools, max tokens, temperature."""
    flat: list[tuple] = []
    for msg in req.messages:
        speaker = {"assistant": "model", "system": "system", "developer": "system"}.get(msg.role, "user")
        for part in msg.parts:
            if isinstance(part, TextPart):
                flat.append((speaker, "text", part.text))
            elif isinstance(part, ToolCallPart):
                flat.append((speaker, "call", part.id, part.name, json.dumps(part.parsed_arguments(), sort_keys=True)))
            elif isinstance(part, ToolResultPart):
                flat.append(("user", "result", part.call_id, part.text))
    tools = sorted((t.name, t.description, json.dumps(t.parameters, sort_keys=True)) for t in req.tools)
    return {
        "flat": flat,
        "tools": tools,
        "max_tokens": req.sampling.max_tokens,
        "temperature": req.sampling.temperature,
    }


def through(req: ModelRequest, fmt: str) -> ModelRequest:
    dialect = dialect_for(fmt)  # type: ignore[arg-type]
    return dialect.parse_request(json.dumps(dialect.render_request(req)).encode(), ROUTES[fmt], {})


def test_every_format_has_a_dialect():
    for fmt in WIRE_FORMATS:
        assert dialect_for(fmt).format == fmt
    with pytest.raises(ValueError, match="unknown wire format"):
        dialect_for("smtp")  # type: ignore[arg-type]


@pytest.mark.parametrize("first", WIRE_FORMATS)
@pytest.mark.parametrize("second", WIRE_FORMATS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=conversations())
def test_semantics_survive_any_two_formats(first, second, req):
    expected = semantics(req)
    assert semantics(through(through(req, first), second)) == expected


@pytest.mark.parametrize("retry_after", [None, 0.0, 2.2, 30.0])
@pytest.mark.parametrize("kind", sorted(ERROR_STATUS))
def test_every_format_applies_the_one_retry_rule(kind: ErrorKind, retry_after: float | None) -> None:
    """Retryable kinds carry retry-after (whole seconds, at least 1) and retry-after-ms (the error's delay, else
    1 s) in all four formats; the other kinds never do, whatever delay the error holds."""
    err = ConversionError(kind, "x", retry_after=retry_after)
    for fmt in WIRE_FORMATS:
        headers = {k.lower(): v for k, v in dialect_for(fmt).render_error(err).headers.items()}
        if kind in RETRYABLE_KINDS:
            wait = 1.0 if retry_after is None else retry_after
            assert headers["retry-after"] == str(max(1, math.ceil(wait))), fmt
            assert headers["retry-after-ms"] == str(round(wait * 1000)), fmt
        else:
            assert "retry-after" not in headers and "retry-after-ms" not in headers, fmt

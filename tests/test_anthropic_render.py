"""Rendering canonical requests as Anthropic bodies: the round-trip property and requests from other formats.

The hypothesis strategy below builds canonical requests that Anthropic can express (one leading system message,
tool-call arguments as compact JSON objects, thinking/output_config kept both interpreted and verbatim in
``extras``); for all of them ``parse_request(render_request(req)) == req``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converters.anthropic import DIALECT
from converters.base import Route, dumps
from converters.canonical import (
    ConversionError,
    IdentityHints,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    ProviderState,
    ReasoningPart,
    ReasoningRequest,
    SamplingParams,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)

ROUTE = Route("anthropic", "/v1/messages")
CACHE = ProviderState("anthropic", {"cache_control": {"type": "ephemeral"}})

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
word = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=10)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(word, inner, max_size=3),
    max_leaves=8,
)
cache = st.none() | st.just(CACHE)

text_part = st.builds(TextPart, text, provider_state=cache)
image_part = st.one_of(
    st.builds(ImagePart, st.just("base64"), word, st.sampled_from(["image/png", "image/jpeg"])),
    st.builds(ImagePart, st.just("url"), word.map(lambda w: f"https://img.test/{w}.png")),
    st.builds(ImagePart, st.just("file_id"), word),
)
result_part = st.builds(
    ToolResultPart,
    word,
    st.lists(text_part | image_part, max_size=3).map(tuple),
    is_error=st.booleans(),
    provider_state=cache,
)
call_part = st.builds(
    ToolCallPart, word, word, st.dictionaries(word, json_value, max_size=3).map(dumps), provider_state=cache
)
reasoning_part = st.one_of(
    st.builds(ReasoningPart, text, st.none() | word.map(lambda s: ProviderState("anthropic", {"signature": s}))),
    word.map(lambda d: ReasoningPart("", ProviderState("anthropic", {"type": "redacted_thinking", "data": d}))),
)


def message(role: str, part: st.SearchStrategy[Any]) -> st.SearchStrategy[Message]:
    return st.lists(part, min_size=1, max_size=4).map(lambda parts: Message(role, tuple(parts)))  # type: ignore[arg-type]


user = message("user", text_part | image_part | result_part)
assistant = message("assistant", reasoning_part | text_part | call_part)
mid_system = message("system", text_part)
lead_system = message("system", st.builds(TextPart, text.filter(bool), provider_state=cache))

schema = st.fixed_dictionaries(
    {"type": st.just("object")}, optional={"properties": st.dictionaries(word, st.just({"type": "string"}), max_size=2)}
)
function_tool = st.builds(
    ToolSpec,
    word,
    description=text,
    parameters=schema,
    strict=st.none() | st.booleans(),
    provider_state=st.none() | st.just(CACHE) | st.just(ProviderState("anthropic", {"eager_input_streaming": True})),
)
builtin_tool = st.builds(
    lambda name, uses: ToolSpec(
        name,
        kind="builtin",
        provider_state=ProviderState("anthropic", {"type": "web_search_20250305", "name": name, "max_uses": uses}),
    ),
    word,
    st.integers(1, 9),
)
sampling = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 200_000),
    temperature=st.none() | st.floats(0, 1),
    top_p=st.none() | st.floats(0, 1),
    top_k=st.none() | st.integers(1, 500),
    stop=st.lists(text, max_size=3).map(tuple),
)
thinking = st.sampled_from(
    [
        None,
        {"type": "disabled"},
        {"type": "adaptive"},
        {"type": "adaptive", "display": "summarized"},
        {"type": "adaptive", "display": "omitted"},
    ]
) | st.integers(1024, 64000).map(lambda b: {"type": "enabled", "budget_tokens": b})


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    messages = draw(st.lists(lead_system, max_size=1))
    messages += [draw(user | assistant)] + draw(st.lists(user | assistant | mid_system, max_size=4))
    tools = draw(st.lists(function_tool | builtin_tool, max_size=3))
    choice = (
        draw(
            st.none()
            | st.builds(ToolChoiceMode, st.sampled_from(["auto", "none", "required"]))
            | st.builds(ToolChoiceNamed, word)
        )
        if tools
        else None
    )
    parallel = draw(st.none() | st.booleans()) if choice is not None else None
    think: dict[str, Any] | None = draw(thinking)
    effort = draw(st.none() | st.sampled_from(["low", "medium", "high", "max"]))
    out_schema = draw(st.none() | schema)
    extras: dict[str, Any] = {}
    reasoning = None
    if think is not None:
        extras["thinking"] = think
        reasoning = ReasoningRequest(
            enabled=think["type"] != "disabled",
            budget_tokens=think.get("budget_tokens"),
            include_in_output=None if "display" not in think else think["display"] == "summarized",
        )
    if effort is not None:
        reasoning = replace(reasoning or ReasoningRequest(), effort=effort)
    config: dict[str, Any] = {"effort": effort} if effort else {}
    if out_schema is not None:
        config["format"] = {"type": "json_schema", "schema": out_schema}
    if config:
        extras["output_config"] = config
    session = draw(st.none() | st.uuids().map(str))
    identity = IdentityHints()
    if session is not None:
        user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": session})
        extras["metadata"] = {"user_id": user_id}
        identity = IdentityHints(user_id=user_id, session_id=session)
    if draw(st.booleans()):
        extras["context_management"] = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    return ModelRequest(
        format="anthropic",
        model=draw(word),
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        sampling=draw(sampling),
        stream=draw(st.booleans()),
        output_format=TextFormat() if out_schema is None else JsonSchemaFormat(out_schema),
        reasoning=reasoning,
        identity=identity,
        extras=extras,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_parse_inverts_render(req: ModelRequest) -> None:
    wire = json.dumps(DIALECT.render_request(req)).encode()
    assert DIALECT.parse_request(wire, ROUTE) == req


def test_requests_from_other_formats_render_to_anthropic_shape() -> None:
    foreign = ProviderState("responses", {"encrypted_content": "gAAA"})
    req = ModelRequest(
        format="chat",
        model="m",
        messages=(
            Message("system", (TextPart("be brief"),)),
            Message("developer", (TextPart("use tools"),)),
            Message("user", (TextPart("go"),)),
            Message(
                "assistant",
                (ReasoningPart("plan", foreign), ToolCallPart("c1", "f", '{"a":1}'), ToolCallPart("c2", "f", "")),
            ),
            Message("tool", (ToolResultPart("c1", (TextPart("one"),)),)),
            Message("tool", (ToolResultPart("c2", (TextPart("two"),), is_error=True),)),
            Message("developer", (TextPart("late instruction"),)),
        ),
        tools=(ToolSpec("f", parameters=None),),
        parallel_tool_calls=False,
        sampling=SamplingParams(max_tokens=50, seed=7, presence_penalty=0.5, min_p=0.1),
        reasoning=ReasoningRequest(effort="medium"),
    )
    wire = DIALECT.render_request(req)
    assert wire["system"] == [{"type": "text", "text": "be brief"}, {"type": "text", "text": "use tools"}]
    assert wire["messages"][1]["content"][0] == {"type": "thinking", "thinking": "plan"}  # foreign state not sent
    assert wire["messages"][1]["content"][2]["input"] == {}
    assert wire["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "two", "is_error": True},
        ],
    }
    assert wire["messages"][3] == {"role": "system", "content": "late instruction"}
    assert wire["tools"] == [{"name": "f", "input_schema": {"type": "object", "properties": {}}}]
    assert wire["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert wire["max_tokens"] == 50 and not {"seed", "presence_penalty", "min_p"} & wire.keys()
    assert wire["output_config"] == {"effort": "medium"} and "thinking" not in wire
    results = DIALECT.parse_request(wire, ROUTE).messages[3].parts
    assert [(p.call_id, p.is_error) for p in results if isinstance(p, ToolResultPart)] == [("c1", False), ("c2", True)]


@pytest.mark.parametrize(
    "req",
    [
        ModelRequest("chat", "m", (Message("user", (TextPart("x"),)),), tools=(ToolSpec("ns", kind="namespace"),)),
        ModelRequest("chat", "m", (Message("user", (TextPart("x"),)),), output_format=JsonObjectFormat()),
    ],
)
def test_what_anthropic_cannot_express_is_refused(req: ModelRequest) -> None:
    with pytest.raises(ConversionError) as info:
        DIALECT.render_request(req)
    assert info.value.status == 400


def test_tool_results_merge_only_with_the_tool_results_before_them() -> None:
    image = ImagePart("url", "https://img.test/a.png")
    req = ModelRequest(
        "chat",
        "m",
        (
            Message("user", (TextPart("look"), image)),
            Message("tool", (ToolResultPart("c1", (TextPart("one"),)),)),
            Message("tool", (ToolResultPart("c2", ()),)),
        ),
        sampling=SamplingParams(max_tokens=5),
    )
    messages = DIALECT.render_request(req)["messages"]
    assert [len(m["content"]) for m in messages] == [2, 2]
    assert messages[1]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
        {"type": "tool_result", "tool_use_id": "c2"},
    ]

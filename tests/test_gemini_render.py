"""Gemini request rendering: round trips (hypothesis and harness fixtures) and what Gemini cannot express."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converters.base import Route, dumps
from converters.canonical import (
    ConversionError,
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
    SamplingParams,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)
from converters.gemini import DIALECT, parse_route
from converters.gemini_render import render_request
from tests import gemini_fixtures

MODEL = "gem-x"


def route_for(stream: bool) -> Route:
    method = "streamGenerateContent" if stream else "generateContent"
    route = parse_route(f"/v1beta/models/{MODEL}:{method}", {"alt": "sse"})
    assert route is not None
    return route


# --------------------------------------------------------------------------------------------------- strategies

names = st.text(st.characters(categories=["L", "N"], include_characters="_-."), min_size=1, max_size=12)
texts = st.text(max_size=20)
scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | texts
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3), max_leaves=8
)
objects = st.dictionaries(names, json_values, max_size=4)
signatures = st.none() | st.builds(lambda s: ProviderState("gemini", {"thoughtSignature": s}), names)
image_types = st.sampled_from(["image/png", "image/jpeg", "image/webp"])
images = st.builds(ImagePart, st.just("base64"), names, image_types) | st.builds(
    ImagePart, st.just("url"), names, st.none() | image_types
)
text_parts = st.builds(TextPart, texts, provider_state=signatures)
reasoning_parts = st.builds(ReasoningPart, texts, signatures)
call_parts = st.builds(ToolCallPart, st.just("") | names, names, objects.map(dumps), provider_state=signatures)
result_parts = st.builds(
    lambda call_id, name, obj, imgs, state: ToolResultPart(
        call_id, (TextPart(dumps(obj)), *imgs), name=name, provider_state=state
    ),
    st.just("") | names,
    names,
    objects,
    st.lists(images, max_size=2),
    signatures,
)


@st.composite
def user_messages(draw: st.DrawFn) -> Message:
    # At least one part that is not a tool result, or it parses as a "tool" message (by design).
    anchor = draw(text_parts | images)
    rest = draw(st.lists(text_parts | images | result_parts, max_size=3))
    parts: list[Part] = [*rest]
    parts.insert(draw(st.integers(0, len(rest))), anchor)
    return Message("user", tuple(parts))


messages = st.one_of(
    user_messages(),
    st.builds(
        lambda ps: Message("assistant", tuple(ps)),
        st.lists(text_parts | reasoning_parts | call_parts, min_size=1, max_size=4),
    ),
    st.builds(lambda ps: Message("tool", tuple(ps)), st.lists(result_parts, min_size=1, max_size=3)),
)
systems = st.builds(
    lambda ts: Message("system", tuple(TextPart(t) for t in ts)), st.lists(texts, min_size=1, max_size=3)
)

function_tools = st.builds(
    lambda name, desc, params, openapi: ToolSpec(
        name,
        desc,
        params,
        provider_state=ProviderState("gemini", {"parametersKey": "parameters"})
        if openapi and params is not None
        else None,
    ),
    names,
    texts,
    st.none() | objects,
    st.booleans(),
)
builtin_tools = st.sampled_from(["googleSearch", "codeExecution", "urlContext"]).flatmap(
    lambda key: st.builds(
        lambda v: ToolSpec(key, kind="builtin", provider_state=ProviderState("gemini", {key: v})), objects
    )
)
floats = st.floats(-2, 2, allow_nan=False, allow_infinity=False)
sampling = st.builds(
    SamplingParams,
    max_tokens=st.none() | st.integers(1, 100_000),
    temperature=st.none() | floats,
    top_p=st.none() | floats,
    top_k=st.none() | st.integers(1, 200),
    stop=st.lists(texts, max_size=3).map(tuple),
    seed=st.none() | st.integers(0, 2**31),
    presence_penalty=st.none() | floats,
    frequency_penalty=st.none() | floats,
)
output_formats: st.SearchStrategy[OutputFormat] = st.one_of(
    st.just(TextFormat()), st.just(JsonObjectFormat()), st.builds(JsonSchemaFormat, objects)
)
budgets = st.none() | st.sampled_from([-1, 0]) | st.integers(1, 32_768)
reasonings = st.none() | st.builds(
    lambda budget, effort, include: ReasoningRequest(
        enabled=None if budget is None else budget != 0, effort=effort, budget_tokens=budget, include_in_output=include
    ),
    budgets,
    st.none() | st.sampled_from(["minimal", "low", "medium", "high"]),
    st.none() | st.booleans(),
)
recorded_extras = st.fixed_dictionaries(
    {},
    optional={
        "safetySettings": st.just([{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}]),
        "cachedContent": names,
        "labels": st.dictionaries(names, names, max_size=2),
        "generationConfig": st.just({"responseModalities": ["TEXT"]}),
    },
)


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    tools = tuple(draw(st.lists(function_tools | builtin_tools, max_size=4)))
    choice = draw(
        st.none()
        | st.builds(ToolChoiceMode, st.sampled_from(["auto", "none", "required"]))
        | st.builds(ToolChoiceNamed, names)
    )
    output_format = draw(output_formats)
    extras = dict(draw(recorded_extras))
    if isinstance(output_format, JsonSchemaFormat) and draw(st.booleans()):
        extras["responseSchema"] = output_format.schema  # the OpenAPI-subset key was used
    return ModelRequest(
        format="gemini",
        model=MODEL,
        messages=tuple(draw(st.lists(systems, max_size=1)) + draw(st.lists(messages, min_size=1, max_size=5))),
        tools=tools,
        tool_choice=choice if tools else None,
        sampling=draw(sampling),
        stream=draw(st.booleans()),
        output_format=output_format,
        reasoning=draw(reasonings),
        extras=extras,
    )


@settings(max_examples=150, deadline=None)
@given(requests())
def test_parse_inverts_render(req: ModelRequest) -> None:
    body = render_request(req)
    assert DIALECT.parse_request(body, route_for(req.stream)) == req
    # And through real JSON bytes, as the replayer would send it.
    assert DIALECT.parse_request(json.dumps(body).encode(), route_for(req.stream)) == req


@pytest.mark.parametrize("name", sorted(gemini_fixtures.ALL))
def test_harness_fixtures_survive_a_round_trip(name: str) -> None:
    path, query, headers, body = gemini_fixtures.ALL[name]()
    route = parse_route(path, query)
    assert route is not None
    once = DIALECT.parse_request(body, route)
    rendered = render_request(once)
    assert DIALECT.parse_request(rendered, route) == once
    # The wire shape itself comes back too (the system instruction loses only its optional role).
    assert rendered["contents"] == body["contents"]
    assert rendered["systemInstruction"]["parts"] == body["systemInstruction"]["parts"]
    assert (rendered.get("tools"), rendered["generationConfig"]) == (body.get("tools"), body["generationConfig"])


# --------------------------------------------------------------------------------------------------- specific shapes


def request(*messages: Message, **kwargs: Any) -> ModelRequest:
    return ModelRequest("gemini", MODEL, tuple(messages), **kwargs)


HI = Message("user", (TextPart("hi"),))


def test_tool_results_render_as_user_function_responses() -> None:
    tool = Message(
        "tool",
        (
            ToolResultPart("c1", (TextPart("plain text output"),), name="ls"),
            ToolResultPart("c2", (TextPart("boom"),), is_error=True, name="cat"),
            ToolResultPart("c3", (TextPart('{"output":"x"}'), ImagePart("base64", "AAAA", "image/png")), name="shot"),
        ),
    )
    body = render_request(request(HI, tool))
    assert body["contents"][1] == {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "plain text output"}}},
            {"functionResponse": {"id": "c2", "name": "cat", "response": {"error": "boom"}}},
            {
                "functionResponse": {
                    "id": "c3",
                    "name": "shot",
                    "response": {"output": "x"},
                    "parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}],
                }
            },
        ],
    }


def test_leading_system_and_developer_messages_become_the_system_instruction() -> None:
    body = render_request(request(Message("system", (TextPart("a"),)), Message("developer", (TextPart("b"),)), HI))
    assert body["systemInstruction"] == {"parts": [{"text": "a"}, {"text": "b"}]}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]


def test_function_tools_share_one_declarations_object_per_run() -> None:
    tools = (
        ToolSpec("a", parameters={"type": "object"}),
        ToolSpec("b"),
        ToolSpec("googleSearch", kind="builtin", provider_state=ProviderState("gemini", {"googleSearch": {}})),
        ToolSpec(
            "c", "does c", {"type": "OBJECT"}, provider_state=ProviderState("gemini", {"parametersKey": "parameters"})
        ),
    )
    body = render_request(request(HI, tools=tools, tool_choice=ToolChoiceNamed("a")))
    assert body["tools"] == [
        {"functionDeclarations": [{"name": "a", "parametersJsonSchema": {"type": "object"}}, {"name": "b"}]},
        {"googleSearch": {}},
        {"functionDeclarations": [{"name": "c", "description": "does c", "parameters": {"type": "OBJECT"}}]},
    ]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["a"]}}


def test_verbatim_tool_config_and_thinking_off() -> None:
    config = {"functionCallingConfig": {"mode": "VALIDATED"}}
    req = request(
        HI,
        tools=(ToolSpec("f"),),
        tool_choice=ToolChoiceMode("auto"),
        reasoning=ReasoningRequest(enabled=False),
        extras={"toolConfig": config},
    )
    body = render_request(req)
    assert body["toolConfig"] == config
    assert body["generationConfig"] == {"thinkingConfig": {"thinkingBudget": 0}}


def test_foreign_provider_state_is_not_rendered() -> None:
    foreign = ProviderState("anthropic", {"signature": "x"})
    body = render_request(
        request(Message("assistant", (ReasoningPart("r", foreign), TextPart("t", provider_state=foreign))))
    )
    assert body["contents"][0]["parts"] == [{"text": "r", "thought": True}, {"text": "t"}]


@pytest.mark.parametrize(
    ("req", "words"),
    [
        (request(HI, Message("system", (TextPart("late"),))), "after the conversation"),
        (request(Message("assistant", (ToolCallPart("c", "exec", "ls", kind="custom"),))), "custom"),
        (request(HI, tools=(ToolSpec("fs", kind="namespace", tools=(ToolSpec("read"),)),)), "namespace"),
        (request(HI, tools=(ToolSpec("custom_t", kind="custom"),)), "custom"),
        (
            request(HI, tools=(ToolSpec("web_search", kind="builtin", provider_state=ProviderState("responses", {})),)),
            "builtin",
        ),
    ],
)
def test_what_gemini_cannot_express_is_a_400(req: ModelRequest, words: str) -> None:
    with pytest.raises(ConversionError) as info:
        render_request(req)
    assert info.value.kind == "invalid_request" and words in info.value.message

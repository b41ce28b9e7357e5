"""Chat request rendering: ``parse_request(render_request(r)) == r`` for every request chat can represent
(hypothesis), and requests from other formats render as far as chat can carry them."""

from __future__ import annotations

import json
import string
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converters import dialect_for
from converters.base import Route
from converters.canonical import (
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
    Role,
    SamplingParams,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
)

DIALECT = dialect_for("chat")
ROUTE = Route("chat", "/v1/chat/completions")

names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
texts = st.text(max_size=24)
floats = st.floats(allow_nan=False, allow_infinity=False)
json_scalars = st.none() | st.booleans() | st.integers() | texts
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(names, c, max_size=3), max_leaves=6
)
json_objects = st.dictionaries(names, json_values, max_size=3)
images = st.builds(ImagePart, source=st.just("url"), data=texts.map(lambda s: "https://img.test/" + s)) | st.builds(
    ImagePart,
    source=st.just("base64"),
    data=st.text(string.ascii_letters + string.digits + "+/=", max_size=16),
    media_type=st.none() | st.sampled_from(["image/png", "image/jpeg"]),
)
ROLES: tuple[Role, ...] = ("system", "developer", "user", "assistant")
cache = ProviderState("chat", {"cache_control": {"type": "ephemeral"}})
text_parts = st.builds(TextPart, texts, provider_state=st.sampled_from([None, None, cache]))
chat_state = st.none() | st.builds(lambda n: ProviderState("chat", {"name": n}), names)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[Message, ...]:
    """Turns as chat carries them: instructions, user turns, assistant turns (reasoning, text, calls) each followed
    by one tool message per call. Call ids are unique, so tool results inherit their call's kind."""
    out: list[Message] = []
    for turn in range(draw(st.integers(1, 5))):
        role = draw(st.sampled_from(ROLES))
        if role == "system" or role == "developer":
            parts: tuple[Part, ...] = tuple(draw(st.lists(text_parts, max_size=3)))
            out.append(Message(role, parts, draw(chat_state)))
        elif role == "user":
            parts = tuple(draw(st.lists(text_parts | images, max_size=3)))
            out.append(Message("user", parts, draw(chat_state)))
        else:
            out.extend(draw(assistant_turn(turn)))
    return tuple(out)


@st.composite
def assistant_turn(draw: st.DrawFn, turn: int) -> list[Message]:
    parts: list[Part] = []
    if draw(st.booleans()):
        spelling = draw(st.sampled_from([None, ProviderState("chat", {"field": "reasoning"})]))
        parts.append(ReasoningPart(draw(texts), spelling))
    parts.extend(draw(st.lists(text_parts, max_size=2)))
    kinds: list[Literal["function", "custom"]] = draw(st.lists(st.sampled_from(["function", "custom"]), max_size=3))
    calls = [ToolCallPart(f"call_{turn}_{i}", draw(names), draw(texts), k) for i, k in enumerate(kinds)]
    state_data: dict[str, Any] = {k: draw(texts) for k in draw(st.sets(st.sampled_from(["name", "refusal"])))}
    if draw(st.booleans()):
        state_data["annotations"] = [{"type": "url_citation", "url_citation": {"url": draw(texts)}}]
    message = Message("assistant", (*parts, *calls), ProviderState("chat", state_data) if state_data else None)
    results = [
        Message(
            "tool",
            (
                ToolResultPart(
                    c.id,
                    tuple(draw(st.lists(text_parts | images, max_size=2))),
                    name=draw(st.none() | names),
                    kind=c.kind,
                ),
            ),
        )
        for c in calls
    ]
    return [message, *results]


def tool_specs() -> st.SearchStrategy[ToolSpec]:
    function = st.builds(
        ToolSpec,
        name=names,
        description=texts,
        parameters=st.none() | json_objects,
        kind=st.just("function"),
        strict=st.none() | st.booleans(),
    )
    custom = st.builds(
        ToolSpec,
        name=names,
        description=texts,
        kind=st.just("custom"),
        provider_state=st.none() | json_objects.map(lambda f: ProviderState("chat", {"format": f})),
    )
    builtin = st.sampled_from(["web_search", "file_search", "computer"]).map(
        lambda k: ToolSpec(name=k, kind="builtin", provider_state=ProviderState("chat", {"type": k, "extra": 1}))
    )
    return function | custom | builtin


output_formats: st.SearchStrategy[OutputFormat] = (
    st.just(TextFormat())
    | st.just(JsonObjectFormat())
    | st.builds(JsonSchemaFormat, schema=json_objects, name=names, strict=st.none() | st.booleans())
)
sampling = st.builds(
    SamplingParams,
    max_tokens=st.none() | st.integers(1, 1 << 20),
    temperature=st.none() | floats,
    top_p=st.none() | floats,
    top_k=st.none() | st.integers(-1, 1000),
    min_p=st.none() | floats,
    stop=st.lists(texts, max_size=3).map(tuple),
    seed=st.none() | st.integers(),
    presence_penalty=st.none() | floats,
    frequency_penalty=st.none() | floats,
)


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    tools = tuple(draw(st.lists(tool_specs(), max_size=4, unique_by=lambda t: t.name)))
    named = [t.name for t in tools if t.kind != "builtin"]
    choice: ToolChoice | None = draw(
        st.none() | st.builds(ToolChoiceMode, st.sampled_from(["auto", "none", "required"]))
    )
    if draw(st.booleans()) and named:
        choice = ToolChoiceNamed(draw(st.sampled_from(named)))
    stream = draw(st.booleans())
    effort = draw(st.none() | st.sampled_from(["none", "minimal", "low", "medium", "high"]))
    session = draw(st.none() | names)
    metadata = {"promptId": draw(names)} | ({"sessionId": session} if session else {})
    extras: dict[str, Any] = {"metadata": metadata} if draw(st.booleans()) else {}
    optional: dict[str, st.SearchStrategy[Any]] = {"store": st.booleans(), "service_tier": names}
    extras |= {k: draw(v) for k, v in optional.items() if draw(st.booleans())}
    return ModelRequest(
        format="chat",
        model=draw(names),
        messages=draw(conversations()),
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=draw(st.none() | st.booleans()),
        sampling=draw(sampling),
        stream=stream,
        include_usage=stream and draw(st.booleans()),
        output_format=draw(output_formats),
        reasoning=None if effort is None else ReasoningRequest(enabled=effort != "none", effort=effort),
        identity=IdentityHints(
            user_id=draw(st.none() | names),
            session_id=session if "metadata" in extras else None,
            prompt_cache_key=draw(st.none() | names),
        ),
        extras=extras,
    )


@settings(max_examples=200, deadline=None)
@given(requests())
def test_round_trip_is_identity(request: ModelRequest) -> None:
    wire = json.dumps(DIALECT.render_request(request)).encode()  # through real JSON bytes, as on the wire
    assert DIALECT.parse_request(wire, ROUTE) == request


def test_rendered_body_shape() -> None:
    request = ModelRequest(
        "chat",
        "m",
        (
            Message("assistant", (ReasoningPart("hm"), ToolCallPart("c1", "bash", '{"cmd":"ls"}'))),
            Message("tool", (ToolResultPart("c1", (TextPart("a.py"),), name="bash"),)),
        ),
        tools=(ToolSpec("bash", "run", {"type": "object"}, strict=True),),
        tool_choice=ToolChoiceNamed("bash"),
        sampling=SamplingParams(max_tokens=100, stop=("END",)),
        stream=True,
        include_usage=True,
    )
    assert DIALECT.render_request(request) == {
        "model": "m",
        "messages": [
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "hm",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"cmd":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py", "name": "bash"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "description": "run",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "bash"}},
        "max_completion_tokens": 100,
        "stop": ["END"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_results_from_other_formats_become_one_tool_message_each() -> None:
    """Anthropic puts several tool results and text in one user turn; chat needs a tool message per result."""
    message = Message(
        "user",
        (
            ToolResultPart("t1", (TextPart("one"),), is_error=True),
            ToolResultPart("t2", (TextPart("two"),)),
            TextPart("now continue"),
        ),
    )
    wire = DIALECT.render_request(ModelRequest("anthropic", "m", (message,)))["messages"]
    assert wire == [
        {"role": "tool", "tool_call_id": "t1", "content": "one"},
        {"role": "tool", "tool_call_id": "t2", "content": "two"},
        {"role": "user", "content": "now continue"},
    ]


def test_foreign_provider_state_is_not_rendered() -> None:
    reasoning = ReasoningPart("r", ProviderState("anthropic", {"signature": "sig"}))
    message = Message("assistant", (reasoning, TextPart("ok")), ProviderState("gemini", {"x": 1}))
    wire = DIALECT.render_request(ModelRequest("anthropic", "m", (message,)))["messages"][0]
    assert wire == {"role": "assistant", "content": "ok", "reasoning_content": "r"}


def test_disabled_reasoning_without_effort_renders_none() -> None:
    request = ModelRequest("anthropic", "m", (Message("user", (TextPart("hi"),)),), reasoning=ReasoningRequest(False))
    assert DIALECT.render_request(request)["reasoning_effort"] == "none"


@pytest.mark.parametrize(
    "request_",
    [
        ModelRequest("gemini", "m", (Message("user", (ImagePart("file_id", "file-1"),)),)),
        ModelRequest("anthropic", "m", (Message("assistant", (ImagePart("url", "https://x/y.png"),)),)),
        ModelRequest("anthropic", "m", (Message("system", (ReasoningPart("no"),)),)),
        ModelRequest("responses", "m", (Message("user", (TextPart("x"),)),), tools=(ToolSpec("ns", kind="namespace"),)),
    ],
)
def test_unrepresentable_requests_raise_400(request_: ModelRequest) -> None:
    with pytest.raises(ConversionError) as info:
        DIALECT.render_request(request_)
    assert info.value.status == 400

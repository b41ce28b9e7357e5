"""Parsing Anthropic Messages requests: harness-shaped fixtures (written here, made-up text) and the quirks.

Each fixture mirrors the shape of one harness's traffic (headers, body fields, sizes) as recorded in the
reference notes; the tests assert that every message, tool, call, result, sampling value and identity hint
survives parsing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from converters import dialect_for
from converters.anthropic import DIALECT
from converters.base import Route, UnknownFields
from converters.canonical import (
    ConversionError,
    ImagePart,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    ProviderState,
    ReasoningPart,
    ReasoningRequest,
    TextFormat,
    TextPart,
    ToolCallPart,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
)

ROUTE = Route("anthropic", "/v1/messages", query={"beta": "true"})
EPHEMERAL = {"type": "ephemeral"}
SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
CC_SESSION = "3f1c2a9e-0d4b-4c1e-9a7f-5b6c7d8e9f00"
CC_BETAS = (
    "claude-code-20250219,context-1m-2025-08-07,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,effort-2025-11-24"
)


def parse(body: dict[str, Any], headers: dict[str, str] | None = None, fields: UnknownFields | None = None):
    return DIALECT.parse_request(json.dumps(body).encode(), ROUTE, headers or {}, fields)


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": f"Does {name}.", "input_schema": SCHEMA, **extra}


def rejects(body: dict[str, Any], *words: str, status: int = 400) -> ConversionError:
    with pytest.raises(ConversionError) as info:
        parse(body)
    assert info.value.status == status
    for word in words:
        assert word in info.value.message
    return info.value


def base(**fields: Any) -> dict[str, Any]:
    return {"model": "claude-opus-4-8", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}], **fields}


# ----------------------------------------------------------------------------------------------- fixtures


def claude_code_main() -> tuple[dict[str, Any], dict[str, str]]:
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": CC_BETAS,
        "X-Claude-Code-Session-Id": CC_SESSION,
        "x-app": "cli",
        "anthropic-dangerous-direct-browser-access": "true",
        "User-Agent": "claude-cli/2.1.197 (external, sdk-cli)",
        "X-Stainless-Lang": "js",
    }
    tools = [tool(f"Tool{i:02d}") for i in range(24)] + [tool("Bash", input_schema={"type": "object"})]
    body = {
        "model": "claude-opus-4-8",
        "system": [
            {"type": "text", "text": "x-billing-line: cc_version=9.9.9; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a made-up coding agent.", "cache_control": EPHEMERAL},
            {"type": "text", "text": "Main prompt. " * 40, "cache_control": EPHEMERAL},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {"role": "system", "content": "Available agents: none."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Use ls.", "signature": "c2lnbmF0dXJl"},
                    {"type": "text", "text": "Listing."},
                    {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "a.py\nb.py"},
                    {"type": "text", "text": "Thanks.", "cache_control": EPHEMERAL},
                ],
            },
        ],
        "tools": tools,
        "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": CC_SESSION})},
        "max_tokens": 64000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }
    return body, headers


def test_claude_code_main_turn_parses_without_loss() -> None:
    body, headers = claude_code_main()
    req = parse(body, headers)
    assert req.format == "anthropic" and req.model == "claude-opus-4-8" and req.stream is True
    system, user, mid, assistant, results = req.messages
    assert system.role == "system" and [p.text for p in system.parts] == [b["text"] for b in body["system"]]
    assert [p.provider_state for p in system.parts] == [None] + [
        ProviderState("anthropic", {"cache_control": EPHEMERAL})
    ] * 2
    assert (user.role, user.text) == ("user", "List the files.")
    assert (mid.role, mid.text) == ("system", "Available agents: none.")  # stays mid-conversation
    thinking, text, call = assistant.parts
    assert thinking == ReasoningPart("Use ls.", ProviderState("anthropic", {"signature": "c2lnbmF0dXJl"}))
    assert text == TextPart("Listing.")
    assert call == ToolCallPart("toolu_01A", "Bash", '{"command":"ls"}')
    assert results.parts[0] == ToolResultPart("toolu_01A", (TextPart("a.py\nb.py"),))
    assert results.parts[1].provider_state == ProviderState("anthropic", {"cache_control": EPHEMERAL})
    assert len(req.tools) == 25 and req.tools[-1].name == "Bash" and req.tools[0].parameters == SCHEMA
    assert req.sampling.max_tokens == 64000 and req.tool_choice is None
    assert req.reasoning == ReasoningRequest(enabled=True, effort="high")
    assert req.extras["context_management"] == body["context_management"]
    assert req.extras["thinking"] == {"type": "adaptive"}
    assert req.identity.session_id == CC_SESSION and req.identity.user_id == body["metadata"]["user_id"]
    assert req.identity.headers["x-claude-code-session-id"] == CC_SESSION
    assert req.identity.headers["anthropic-beta"] == CC_BETAS and req.identity.headers["x-app"] == "cli"
    assert "x-stainless-lang" not in req.identity.headers
    assert req.identity.user_agent == "claude-cli/2.1.197 (external, sdk-cli)"


def test_claude_code_title_request_asks_for_json_schema_without_thinking() -> None:
    title_schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    body = base(
        system=[{"type": "text", "text": "Write a short title."}],
        thinking={"type": "disabled"},
        output_config={"format": {"type": "json_schema", "schema": title_schema}},
        max_tokens=32000,
        stream=True,
    )
    req = parse(body)
    assert req.output_format == JsonSchemaFormat(title_schema)
    assert req.reasoning == ReasoningRequest(enabled=False)
    assert req.messages[0].role == "system" and req.sampling.max_tokens == 32000


def test_opencode_anthropic_provider() -> None:
    headers = {
        "x-session-id": "ses_abc123",
        "x-session-affinity": "ses_abc123",
        "anthropic-beta": "structured-outputs-2025-11-13",
    }
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are a made-up agent.", "cache_control": EPHEMERAL}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}],
        "tools": [tool(n, eager_input_streaming=True) for n in ("bash", "read", "edit", "glob")],
        "tool_choice": {"type": "auto"},
        "temperature": 0.7,
        "stream": True,
    }
    req = parse(body, headers)
    assert req.tool_choice == ToolChoiceMode("auto") and req.parallel_tool_calls is None
    assert [t.name for t in req.tools] == ["bash", "read", "edit", "glob"]
    assert all(t.provider_state == ProviderState("anthropic", {"eager_input_streaming": True}) for t in req.tools)
    assert req.messages[0].parts[0].provider_state == ProviderState("anthropic", {"cache_control": EPHEMERAL})
    assert req.sampling.max_tokens == 32000 and req.sampling.temperature == 0.7
    assert req.identity.headers == {k.lower(): v for k, v in headers.items()} and req.identity.session_id is None
    assert DIALECT.render_request(req)["tools"][0]["eager_input_streaming"] is True

    title = parse(
        base(model="claude-haiku-4-5", max_tokens=48000, thinking={"type": "enabled", "budget_tokens": 16000})
    )
    assert title.reasoning == ReasoningRequest(enabled=True, budget_tokens=16000)
    assert title.sampling.max_tokens == 48000


def test_pi_adaptive_summarized_thinking() -> None:
    body = base(
        max_tokens=32000,
        thinking={"type": "adaptive", "display": "summarized"},
        output_config={"effort": "medium"},
        system="Tiny made-up prompt.",
        tools=[tool(n) for n in ("read", "bash", "edit", "write")],
        stream=True,
    )
    req = parse(body, {"user-agent": "Anthropic/JS 0.91.1"})
    assert req.reasoning == ReasoningRequest(enabled=True, effort="medium", include_in_output=True)
    assert req.messages[0] == Message("system", (TextPart("Tiny made-up prompt."),))
    assert len(req.tools) == 4 and req.identity.user_agent == "Anthropic/JS 0.91.1"
    assert DIALECT.render_request(req)["thinking"] == {"type": "adaptive", "display": "summarized"}


def test_mini_swe_agent_via_litellm_is_non_streaming() -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64000,
        "system": "You are a helpful assistant that can interact with a computer.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the failing test. " * 20}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Look first."},
                    {"type": "tool_use", "id": "toolu_x", "name": "bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_x",
                        "content": [{"type": "text", "text": "<returncode>0</returncode>"}],
                    }
                ],
            },
        ],
        "tools": [tool("bash")],
    }
    req = parse(body)
    assert req.stream is False and req.sampling.max_tokens == 64000 and req.tool_choice is None
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.messages[2].parts[1] == ToolCallPart("toolu_x", "bash", '{"command":"ls"}')
    assert req.messages[3].parts[0].text == "<returncode>0</returncode>"


def test_hermes_anthropic_provider_with_prefixed_tools() -> None:
    headers = {"user-agent": "claude-code/2.1.74", "anthropic-beta": "oauth-2025-04-20", "authorization": "Bearer x"}
    names = ["mcp__terminal", "mcp__execute_code", "mcp__patch"]
    body = base(
        system=[{"type": "text", "text": "Made-up identity line."}, {"type": "text", "text": "Made-up main prompt."}],
        tools=[tool(n) for n in names],
        max_tokens=65536,
        stream=True,
    )
    req = parse(body, headers)
    assert [t.name for t in req.tools] == names and len(req.messages[0].parts) == 2
    assert "authorization" not in req.identity.headers  # credentials are never recorded
    assert req.identity.headers["anthropic-beta"] == "oauth-2025-04-20"


# ----------------------------------------------------------------------------------------------- quirks


def test_empty_tools_drop_tool_choice() -> None:
    req = parse(base(tools=[], tool_choice={"type": "any"}))
    assert req.tools == () and req.tool_choice is None and req.parallel_tool_calls is None


@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        (json.dumps({"device_id": "d1", "account_uuid": "a1", "session_id": "s-9"}), "s-9"),
        (
            "user_abc123_account_a1b2_session_5e0c9f1a-1111-2222-3333-444455556666",
            "5e0c9f1a-1111-2222-3333-444455556666",
        ),
        ("plain-user", None),
        (json.dumps(["not", "an", "object"]), None),
    ],
)
def test_metadata_user_id_yields_session(user_id: str, session: str | None) -> None:
    req = parse(base(metadata={"user_id": user_id}))
    assert req.identity.user_id == user_id and req.identity.session_id == session


def test_tool_choice_forms_and_parallel_calls() -> None:
    tools = [tool("a"), tool("b", strict=True)]
    assert parse(base(tools=tools, tool_choice={"type": "any"})).tool_choice == ToolChoiceMode("required")
    assert parse(base(tools=tools, tool_choice={"type": "none"})).tool_choice == ToolChoiceMode("none")
    named = parse(base(tools=tools, tool_choice={"type": "tool", "name": "b", "disable_parallel_tool_use": True}))
    assert named.tool_choice == ToolChoiceNamed("b") and named.parallel_tool_calls is False
    assert named.tools[1].strict is True and named.tools[0].strict is None
    assert DIALECT.render_request(named)["tools"][1]["strict"] is True
    rejects(base(tools=tools, tool_choice={"type": "sometimes"}), "tool_choice.type")
    parallel = base(
        messages=[
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": "1"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "two"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "one", "is_error": True},
                ],
            },
        ]
    )
    req = parse(parallel)
    assert [p.id for p in req.messages[1].parts] == ["t1", "t2"]
    assert [(p.call_id, p.text, p.is_error) for p in req.messages[2].parts] == [
        ("t2", "two", False),
        ("t1", "one", True),
    ]


def test_tool_result_content_as_string_blocks_or_nothing() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    content = [
        {"type": "tool_result", "tool_use_id": "a", "content": "text"},
        {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "x"}, image]},
        {"type": "tool_result", "tool_use_id": "c"},
        {"type": "tool_result", "tool_use_id": "d", "content": '{"json": true}', "cache_control": EPHEMERAL},
    ]
    a, b, c, d = parse(base(messages=[{"role": "user", "content": content}])).messages[0].parts
    assert a.content == (TextPart("text"),)
    assert b.content == (TextPart("x"), ImagePart("base64", "iVBORw0KGgo=", "image/png"))
    assert c.content == () and d.text == '{"json": true}'
    assert d.provider_state == ProviderState("anthropic", {"cache_control": EPHEMERAL})
    rejects(
        base(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "e", "content": 5}]}]),
        "content",
    )
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    rejects(
        base(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "e", "content": [doc]}]}]),
        "document",
    )


def test_images_from_each_source() -> None:
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}},
        {"type": "image", "source": {"type": "file", "file_id": "file_123"}},
    ]
    parts = parse(base(messages=[{"role": "user", "content": blocks}])).messages[0].parts
    assert parts == (
        ImagePart("base64", "/9j/", "image/jpeg"),
        ImagePart("url", "https://example.test/a.png"),
        ImagePart("file_id", "file_123"),
    )
    bad = {"type": "image", "source": {"type": "svg-inline", "data": "<svg/>"}}
    rejects(base(messages=[{"role": "user", "content": [bad]}]), "unsupported image source")


def test_thinking_signatures_and_redacted_thinking_round_trip() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "step 1", "signature": "EqQBCkYIBx"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
        {"type": "text", "text": "done", "citations": [{"type": "char_location", "cited_text": "x"}]},
    ]
    body = base(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": blocks}])
    req = parse(body)
    redacted = req.messages[1].parts[1]
    assert redacted == ReasoningPart("", ProviderState("anthropic", blocks[1]))
    assert DIALECT.render_request(req)["messages"][1]["content"] == blocks


def test_server_tools_become_builtins_and_render_back_unchanged() -> None:
    web = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5, "allowed_domains": ["example.test"]}
    custom = tool("deferred", type="custom", defer_loading=True, cache_control=EPHEMERAL)
    req = parse(base(tools=[web, custom]))
    assert req.tools[0].kind == "builtin" and req.tools[0].name == "web_search"
    assert req.tools[0].provider_state == ProviderState("anthropic", web)
    assert req.tools[1].kind == "function" and req.tools[1].parameters == SCHEMA
    assert DIALECT.render_request(req)["tools"] == [web, custom]


@pytest.mark.parametrize(
    ("block", "word"),
    [
        ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}, "document"),
        ({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}, "server_tool_use"),
        ({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}, "web_search_tool_result"),
        ({"type": "search_result", "source": "s", "title": "t", "content": []}, "search_result"),
    ],
)
def test_unrepresentable_blocks_are_a_clear_400(block: dict[str, Any], word: str) -> None:
    err = rejects(base(messages=[{"role": "assistant", "content": [block]}]), word, "not supported")
    assert DIALECT.render_error(err).status == 400


def test_required_fields_and_types() -> None:
    no_max = base()
    del no_max["max_tokens"]
    no_max["max_completion_tokens"] = 100  # another format's spelling does not stand in for max_tokens
    rejects(no_max, "max_tokens", "required")
    rejects(base(max_tokens=0), "max_tokens")
    rejects(base(messages=[]), "messages")
    rejects(base(temperature="hot"), "temperature")
    rejects(base(stop_sequences=["ok", 3]), "stop_sequences")
    rejects(base(thinking={"type": "enabled"}), "budget_tokens")
    rejects(base(messages=[{"role": "tool", "content": "x"}]), "role")
    rejects(base(system=[{"type": "image", "source": {"type": "url", "url": "u"}}]), "only text")
    rejects(base(mcp_servers=[{"type": "url", "url": "https://mcp.test", "name": "m"}]), "mcp_servers")
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(ConversionError) as info:
            DIALECT.parse_request(raw, ROUTE)
        assert info.value.status == 400


def test_sampling_values_and_legacy_output_format() -> None:
    req = parse(
        base(
            temperature=1,
            top_p=0.9,
            top_k=40,
            stop_sequences=["\n\nHuman:"],
            output_format={"type": "json_schema", "schema": SCHEMA},
        )
    )
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == (1.0, 0.9, 40)
    assert req.sampling.stop == ("\n\nHuman:",)
    assert req.output_format == JsonSchemaFormat(SCHEMA)
    rendered = DIALECT.render_request(req)
    assert rendered["output_format"] == {"type": "json_schema", "schema": SCHEMA} and "output_config" not in rendered
    assert parse(base()).output_format == TextFormat()


def test_unknown_fields_are_logged_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    sink = UnknownFields(logging.getLogger("test.anthropic"))
    body = base(
        future_knob=1,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi", "shiny": True},
                    {"type": "image", "source": {"type": "url", "url": "u"}, "cache_control": EPHEMERAL},
                ],
                "name": "bob",
            }
        ],
        tools=[tool("a", experimental=1)],
        thinking={"type": "adaptive", "mode": "x"},
    )
    with caplog.at_level(logging.INFO, logger="test.anthropic"):
        first = parse(body, fields=sink)
        parse(body, fields=sink)
    logged = [r.getMessage() for r in caplog.records]
    names = ("body.future_knob", "messages.name", "content.text.shiny", "tools.experimental", "thinking.mode")
    for name in names + ("content.image.cache_control",):
        assert logged.count(f"ignoring unknown request field {name}") == 1, name
    assert "future_knob" not in first.extras and first.messages[0].text == "hi"


def test_registered_under_its_format() -> None:
    assert dialect_for("anthropic") is DIALECT
    assert isinstance(parse(base()), ModelRequest)

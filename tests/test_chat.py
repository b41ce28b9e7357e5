"""Chat Completions request parsing: harness-shaped fixtures parsed without loss, the quirks of real traffic, and
clear 400s for what chat requests may say but we cannot honour.

The fixtures are written here (made-up prompt text), shaped like each harness's traffic as measured in
harnesses.md: Qwen Code, Pi (custom openai-completions provider), mini-swe-agent (litellm), hermes-agent (custom
provider) and OpenCode (@ai-sdk/openai-compatible).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from converters import dialect_for
from converters.base import Route, UnknownFields
from converters.canonical import (
    ConversionError,
    ImagePart,
    JsonObjectFormat,
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
    ToolSpec,
)

DIALECT = dialect_for("chat")
ROUTE = Route("chat", "/v1/chat/completions")
OBJ = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def parse(body: dict[str, Any], headers: dict[str, str] | None = None, fields: UnknownFields | None = None):
    return DIALECT.parse_request(json.dumps(body).encode(), ROUTE, headers, fields)


def fn_tool(name: str, strict: bool | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "description": f"Tool {name}.", "parameters": OBJ}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assert_round_trips(request: ModelRequest) -> None:
    """Rendering what we parsed and parsing it again loses nothing (identity hints from headers aside)."""
    again = DIALECT.parse_request(json.dumps(DIALECT.render_request(request)).encode(), ROUTE)
    assert again == ModelRequest(**{**request.__dict__, "identity": again.identity})
    assert (again.identity.user_id, again.identity.session_id) == (
        request.identity.user_id,
        request.identity.session_id,
    )


# --------------------------------------------------------------------------------------------------- harness fixtures


def test_qwen_code_request() -> None:
    """Big system message, a fake context-setup exchange, 11 tools, max_tokens 8000, stream_options."""
    tools = [
        fn_tool(n) for n in ("ls", "read", "grep", "glob", "edit", "write", "fetch", "many", "mem", "todo", "task")
    ]
    body = {
        "model": "qwen3-coder-plus",
        "messages": [
            {"role": "system", "content": "You are a careful coding assistant. " * 1000},
            user("Here is the workspace context: a tiny repo with main.py."),
            {"role": "assistant", "content": "Got it. Thanks for the context!"},
            user("What does main.py do?"),
            {"role": "assistant", "content": "", "tool_calls": [call("call_q1", "read", {"path": "main.py"})]},
            {"role": "tool", "tool_call_id": "call_q1", "content": "print('hi')"},
        ],
        "tools": tools,
        "max_tokens": 8000,
        "stream": True,
        "stream_options": {"include_usage": True},
        "metadata": {"sessionId": "5d0c7f7e-qwen", "promptId": "5d0c7f7e-qwen########3"},
    }
    headers = {"User-Agent": "QwenCode/0.15.10 (linux; x64)", "X-Stainless-Retry-Count": "0"}
    r = parse(body, headers)
    assert r.format == "chat" and r.model == "qwen3-coder-plus"
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert len(r.messages[0].text) == 36000
    assert r.messages[4].parts == (TextPart(""), ToolCallPart("call_q1", "read", '{"path": "main.py"}'))
    assert r.messages[5].parts == (ToolResultPart("call_q1", (TextPart("print('hi')"),)),)
    assert [t.name for t in r.tools] == [t["function"]["name"] for t in tools]
    assert all(t.parameters == OBJ and t.kind == "function" and t.strict is None for t in r.tools)
    assert r.sampling.max_tokens == 8000 and r.stream and r.include_usage
    assert r.identity.session_id == "5d0c7f7e-qwen" and r.identity.user_agent == "QwenCode/0.15.10 (linux; x64)"
    assert r.extras["metadata"]["promptId"] == "5d0c7f7e-qwen########3"
    assert_round_trips(r)


def test_pi_request() -> None:
    """max_completion_tokens, strict on each function, store:false, reasoning_effort, stream_options."""
    body = {
        "model": "fake-model",
        "messages": [{"role": "developer", "content": "Be brief. " * 245}, user("list the files")],
        "tools": [fn_tool(n, strict=False) for n in ("read", "bash", "edit", "write")],
        "stream": True,
        "stream_options": {"include_usage": True},
        "store": False,
        "max_completion_tokens": 16384,
        "reasoning_effort": "medium",
    }
    r = parse(body, {"user-agent": "OpenAI/JS 6.3.0", "x-stainless-retry-count": "0"})
    assert r.messages[0] == Message("developer", (TextPart("Be brief. " * 245),))
    assert [(t.name, t.strict) for t in r.tools] == [
        ("read", False),
        ("bash", False),
        ("edit", False),
        ("write", False),
    ]
    assert r.sampling.max_tokens == 16384 and r.extras == {"store": False}
    assert r.reasoning == ReasoningRequest(enabled=True, effort="medium")
    assert r.include_usage and r.identity.user_agent == "OpenAI/JS 6.3.0"
    assert_round_trips(r)


def test_mini_swe_agent_request() -> None:
    """Non-streaming, only model/messages/tools with one bash tool; tool calls on every step."""
    bash: dict[str, Any] = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
    body = {
        "model": "gpt-5-mini",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            user("Please solve this issue: the tests fail. " * 70),
            {"role": "assistant", "content": "Look first.", "tool_calls": [call("call_m1", "bash", {"command": "ls"})]},
            {"role": "tool", "tool_call_id": "call_m1", "content": "README.md\nsrc\n"},
        ],
        "tools": [bash],
    }
    r = parse(body, {"user-agent": "OpenAI/Python 2.8.0"})
    assert not r.stream and not r.include_usage and r.tool_choice is None and r.extras == {}
    assert r.tools == (ToolSpec("bash", "Run a bash command.", bash["function"]["parameters"]),)
    assert r.messages[2].parts == (TextPart("Look first."), ToolCallPart("call_m1", "bash", '{"command": "ls"}'))
    assert r.messages[3].parts[0] == ToolResultPart("call_m1", (TextPart("README.md\nsrc\n"),))
    assert r.sampling.max_tokens is None
    assert_round_trips(r)


def test_hermes_request_with_parallel_calls_and_reasoning() -> None:
    """max_tokens 65536, 17 tools, stream_options; a turn with two parallel calls and `reasoning` echoed back."""
    names = [f"tool_{i}" for i in range(14)] + ["terminal", "execute_code", "patch"]
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "You are an agent with tools. " * 230},
            user("check both files"),
            {
                "role": "assistant",
                "content": None,
                "reasoning": "Read both at once.",
                "tool_calls": [
                    call("call_h1", "terminal", {"cmd": "cat a"}),
                    call("call_h2", "terminal", {"cmd": "cat b"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_h1", "content": "A"},
            {"role": "tool", "tool_call_id": "call_h2", "content": "B"},
        ],
        "tools": [fn_tool(n) for n in names],
        "max_tokens": 65536,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = parse(body, {"user-agent": "OpenAI/Python 2.24.0"})
    assert len(r.tools) == 17 and r.sampling.max_tokens == 65536
    assistant = r.messages[2]
    assert assistant.parts == (
        ReasoningPart("Read both at once.", ProviderState("chat", {"field": "reasoning"})),
        ToolCallPart("call_h1", "terminal", '{"cmd": "cat a"}'),
        ToolCallPart("call_h2", "terminal", '{"cmd": "cat b"}'),
    )
    assert [m.parts[0] for m in r.messages[3:]] == [
        ToolResultPart("call_h1", (TextPart("A"),)),
        ToolResultPart("call_h2", (TextPart("B"),)),
    ]
    rendered = DIALECT.render_request(r)["messages"][2]
    assert rendered["reasoning"] == "Read both at once." and "reasoning_content" not in rendered
    assert_round_trips(r)


def test_opencode_openai_compatible_request() -> None:
    """ai-sdk openai-compatible: tool_choice auto, sampling values, reasoning_content echoed, a session header."""
    body = {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "You are opencode, a coding agent."},
            {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
            {"role": "assistant", "content": "Done.", "reasoning_content": "The bug is on line 3."},
            user("thanks"),
        ],
        "tools": [fn_tool("read"), fn_tool("edit")],
        "tool_choice": "auto",
        "temperature": 0.55,
        "top_p": 1,
        "max_tokens": 32000,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"User-Agent": "opencode/1.18.33", "x-session-affinity": "ses_abc123", "Authorization": "Bearer k"}
    r = parse(body, headers)
    assert r.tool_choice == ToolChoiceMode("auto")
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.max_tokens) == (0.55, 1.0, 32000)
    assert r.messages[1].parts == (TextPart("fix the bug"),)
    assert r.messages[2].parts == (ReasoningPart("The bug is on line 3."), TextPart("Done."))
    assert r.identity.headers == {"x-session-affinity": "ses_abc123"}  # never the credentials
    assert_round_trips(r)


# --------------------------------------------------------------------------------------------------- quirks


def test_empty_tools_drop_tool_choice() -> None:
    for choice in ("auto", "required", {"type": "function", "function": {"name": "gone"}}):
        r = parse({"model": "m", "messages": [user("hi")], "tools": [], "tool_choice": choice})
        assert r.tools == () and r.tool_choice is None
        assert "tools" not in DIALECT.render_request(r) and "tool_choice" not in DIALECT.render_request(r)


def test_stream_options_ignored_when_not_streaming() -> None:
    body = {"model": "m", "messages": [user("hi")], "stream": False, "stream_options": {"include_usage": True}}
    assert parse(body).include_usage is False
    assert parse({**body, "stream_options": {"include_usage": "yes"}}).include_usage is False  # not even checked
    assert parse({**body, "stream": True}).include_usage is True


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    body = {"model": "m", "messages": [user("hi")], "max_tokens": 100, "max_completion_tokens": 50}
    assert parse(body).sampling.max_tokens == 50
    assert parse({**body, "max_completion_tokens": None}).sampling.max_tokens == 100
    with pytest.raises(ConversionError, match="at least 1"):
        parse({**body, "max_completion_tokens": 0})


def test_metadata_user_id_json_string_gives_session_id() -> None:
    user_id = json.dumps({"device_id": "dev1", "account_uuid": "", "session_id": "sess-42"})
    r = parse({"model": "m", "messages": [user("hi")], "metadata": {"user_id": user_id}, "user": "u-7"})
    assert r.identity.session_id == "sess-42" and r.identity.user_id == "u-7"
    assert (
        parse({"model": "m", "messages": [user("hi")], "metadata": {"user_id": "{not json"}}).identity.session_id
        is None
    )
    assert parse({"model": "m", "messages": [user("hi")], "metadata": {"session_id": "s1"}}).identity.session_id == "s1"


def test_identity_hints_from_headers_and_body() -> None:
    headers = {"Session_Id": "s-1", "X-Client-Request-Id": "r-1", "User-Agent": "ua", "Authorization": "Bearer secret"}
    r = parse({"model": "m", "messages": [user("hi")], "prompt_cache_key": "ses_9"}, headers)
    assert r.identity.headers == {"session_id": "s-1", "x-client-request-id": "r-1"}
    assert (r.identity.prompt_cache_key, r.identity.user_agent) == ("ses_9", "ua")


def test_tool_result_content_as_text_blocks_or_json() -> None:
    history = [
        user("go"),
        {"role": "assistant", "tool_calls": [call("c1", "f", {}), call("c2", "f", {}), call("c3", "f", {})]},
        {"role": "tool", "tool_call_id": "c1", "content": "plain"},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "tool", "tool_call_id": "c3", "content": {"ok": True, "lines": [1, 2]}},
    ]
    r = parse({"model": "m", "messages": history})
    results = [m.parts[0] for m in r.messages[2:]]
    assert [p.content for p in results if isinstance(p, ToolResultPart)] == [
        (TextPart("plain"),),
        (TextPart("a"), TextPart("b")),
        (TextPart('{"ok": true, "lines": [1, 2]}'),),
    ]


def test_custom_tools_and_calls() -> None:
    grammar = {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}
    body = {
        "model": "m",
        "messages": [
            user("run it"),
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "exec", "input": "ls"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [{"type": "custom", "custom": {"name": "exec", "description": "Run code.", "format": grammar}}],
        "tool_choice": {"type": "custom", "custom": {"name": "exec"}},
    }
    r = parse(body)
    assert r.tools == (
        ToolSpec("exec", "Run code.", kind="custom", provider_state=ProviderState("chat", {"format": grammar})),
    )
    assert r.tool_choice == ToolChoiceNamed("exec")
    assert r.messages[1].parts == (ToolCallPart("c1", "exec", "ls", "custom"),)
    assert r.messages[2].parts == (ToolResultPart("c1", (TextPart("ok"),), kind="custom"),)
    assert DIALECT.render_request(r)["tool_choice"] == {"type": "custom", "custom": {"name": "exec"}}
    assert_round_trips(r)


def test_unknown_tool_kind_is_kept_and_rendered_back() -> None:
    hosted = {"type": "web_search", "search_context_size": "low"}
    r = parse({"model": "m", "messages": [user("hi")], "tools": [hosted, fn_tool("read")]})
    assert r.tools[0] == ToolSpec("web_search", kind="builtin", provider_state=ProviderState("chat", hosted))
    assert DIALECT.render_request(r)["tools"][0] == hosted


def test_images_by_url_and_data_url() -> None:
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://img.test/cat.png", "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    r = parse({"model": "m", "messages": [{"role": "user", "content": content}]})
    assert r.messages[0].parts == (
        TextPart("what is this?"),
        ImagePart("url", "https://img.test/cat.png"),
        ImagePart("base64", "iVBORw0KGgo=", "image/png"),
    )
    assert (
        DIALECT.render_request(r)["messages"][0]["content"][2]["image_url"]["url"]
        == "data:image/png;base64,iVBORw0KGgo="
    )


def test_sampling_and_output_format() -> None:
    body = {
        "model": "m",
        "messages": [user("hi")],
        "temperature": 0,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "stop": "END",
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "n": 1,
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "title", "schema": OBJ, "strict": True}},
    }
    r = parse(body)
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.stop, s.seed) == (0.0, 0.9, 20, 0.05, ("END",), 7)
    assert (s.presence_penalty, s.frequency_penalty, r.parallel_tool_calls) == (0.5, -0.5, False)
    assert r.output_format == JsonSchemaFormat(OBJ, "title", True)
    assert parse({**body, "stop": ["a", "b"]}).sampling.stop == ("a", "b")
    assert parse({**body, "response_format": {"type": "json_object"}}).output_format == JsonObjectFormat()
    assert parse({**body, "response_format": {"type": "text"}}).output_format == TextFormat()
    assert parse({**body, "reasoning_effort": "none"}).reasoning == ReasoningRequest(enabled=False, effort="none")


def test_message_name_refusal_and_annotations_are_kept() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "refusal": "I can't help with that.",
            "audio": None,
            "function_call": None,
        },
        {
            "role": "assistant",
            "content": "See the docs.",
            "annotations": [{"type": "url_citation", "url_citation": {}}],
        },
    ]
    r = parse({"model": "m", "messages": messages})
    assert r.messages[0].provider_state == ProviderState("chat", {"name": "alice"})
    assert r.messages[1] == Message("assistant", (), ProviderState("chat", {"refusal": "I can't help with that."}))
    assert r.messages[2].provider_state == ProviderState("chat", {"annotations": messages[2]["annotations"]})
    assert_round_trips(r)


def test_text_part_extras_are_kept_and_rendered_back() -> None:
    part = {"type": "text", "text": "long system prompt", "cache_control": {"type": "ephemeral"}}
    r = parse({"model": "m", "messages": [{"role": "system", "content": [part]}]})
    assert r.messages[0].parts == (
        TextPart("long system prompt", provider_state=ProviderState("chat", {"cache_control": {"type": "ephemeral"}})),
    )
    assert DIALECT.render_request(r)["messages"][0]["content"] == [part]


def test_unknown_fields_are_logged_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    fields = UnknownFields()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "x_tag": 1}], "repetition_penalty": 1.1}
    with caplog.at_level(logging.INFO, logger="harnessrl.converters"):
        parse(body, fields=fields)
        parse(body, fields=fields)
    assert fields.seen == {"chat.repetition_penalty", "messages.user.x_tag"}
    assert sum("chat.repetition_penalty" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"n": 2}, "n=2 is not supported"),
        ({"functions": [{"name": "f"}]}, "legacy `functions`"),
        ({"audio": {"voice": "alloy"}}, "audio output"),
        ({"modalities": ["text", "audio"]}, "only text output"),
        ({"modalities": [{"x": 1}]}, "only text output"),
        ({"messages": []}, "at least one message"),
        ({"messages": [{"role": "function", "content": "x"}]}, "unsupported role"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "'input_audio'"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]}, "'file'"),
        ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": "https://x"}]}]}, "image_url"),
        ({"messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]}, "'refusal'"),
        ({"messages": [{"role": "assistant", "audio": {"id": "a1"}}]}, "assistant `audio`"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x,abc"}}]}]},
            "base64",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id: field required"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "'allowed_tools' is not supported"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
        ({"tool_choice": "sometimes"}, "unknown tool_choice"),
        ({"response_format": {"type": "grammar"}}, "'grammar' is not supported"),
        ({"temperature": "hot"}, "temperature: expected integer or number"),
        ({"stream": "yes"}, "stream: expected boolean"),
        ({"stop": [1]}, "array of strings"),
        ({"model": None}, "model: field required"),
    ],
)
def test_unsupported_requests_are_400(change: dict[str, Any], match: str) -> None:
    body = {"model": "m", "messages": [user("hi")], "tools": [fn_tool("read")], **change}
    with pytest.raises(ConversionError, match=match) as info:
        parse(body)
    assert info.value.status == 400 and info.value.kind == "invalid_request"


def test_malformed_bodies_are_400() -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(ConversionError) as info:
            DIALECT.parse_request(raw, ROUTE)
        assert info.value.status == 400

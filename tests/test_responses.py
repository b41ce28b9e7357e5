"""Tests for converters.responses: Responses request bodies <-> canonical requests.

* Harness-shaped fixtures (written here, short made-up text; shapes from the reference notes) for Codex with a
  custom provider and with the built-in provider, OpenCode/Kilo's openai provider and Pi: parsed without loss.
* Quirks: empty tools, stream_options without stream, token-limit field names, strict functions, parallel
  calls, additional_tools, instructions, previous_response_id, unknown fields, unsupported content.
* A hypothesis round trip: ``parse_request(render_request(r)) == r`` for requests the format can express.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converters import dialect_for
from converters.base import Route, UnknownFields
from converters.canonical import (
    ConversionError,
    IdentityHints,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    OutputFormat,
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
from converters.responses import DIALECT, parse_request, render_request

ROUTE = Route("responses", "/v1/responses")
CallKind = Literal["function", "custom"]
INPUT_ROLES: tuple[Role, ...] = ("user", "system", "developer")
CALL_KINDS: tuple[CallKind, ...] = ("function", "custom")


def ps(data: dict[str, Any]) -> ProviderState:
    return ProviderState("responses", data)


def parse(body: dict[str, Any], headers: dict[str, str] | None = None, **kw: Any) -> ModelRequest:
    return parse_request(json.dumps(body).encode(), ROUTE, headers, UnknownFields(), **kw)


def text_item(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def fn_tool(name: str, props: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    schema = {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}
    return {"type": "function", "name": name, "description": f"{name} tool", "strict": strict, "parameters": schema}


def filler(n: int, seed: str) -> str:
    """Made-up prompt text of exactly ``n`` characters (the size the harness's real prompt has)."""
    base = f"{seed}: follow the rules, keep edits small, run the tests. "
    return (base * (n // len(base) + 1))[:n]


# --------------------------------------------------------------------------------------------------- fixtures

CODEX_HEADERS = {
    "Session-Id": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    "Thread-Id": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    "X-Client-Request-Id": "0199a1b2-ffff-7e5f-8a9b-0c1d2e3f4a5b",
    "X-Codex-Window-Id": "w-1",
    "X-Codex-Turn-Metadata": json.dumps({"installation_id": "inst-1", "session_id": "sess-turn", "turn_id": "t-1"}),
    "X-Codex-Beta-Features": "remote_compaction_v2",
    "Originator": "codex_exec",
    "User-Agent": "codex_exec/0.171.0 (Linux; x86_64)",
    "Authorization": "Bearer sk-dummy",
}
CODEX_TOOLS = [
    fn_tool("exec_command", {"cmd": {"type": "string"}}),
    fn_tool("write_stdin", {"session_id": {"type": "integer"}, "chars": {"type": "string"}}),
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [fn_tool("spawn_agent", {"task": {"type": "string"}}), fn_tool("wait_agent", {})],
    },
    fn_tool("update_goal", {"goal": {"type": "string"}}),
    fn_tool("get_goal", {}),
    {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {"type": "text"}},
    fn_tool("update_plan", {"plan": {"type": "array", "items": {"type": "string"}}}),
    fn_tool("view_image", {"path": {"type": "string"}}),
    {"type": "web_search", "external_web_access": False},
]


def codex_custom_body(turn: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        text_item("developer", filler(16979, "codex")),
        text_item("developer", "<skills>none</skills>"),
        text_item("user", "<environment_context><cwd>/repo</cwd></environment_context>"),
        text_item("user", "List the files."),
    ]
    if turn == 2:
        items += [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "I should run ls."}],
                "encrypted_content": "gAAAAB-opaque-blob",
            },
            {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc\n"},
        ]
    return {
        "model": "gpt-6.2-sol",
        "stream": True,
        "input": items,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "client_metadata": {"x-codex-installation-id": "inst-1"},
    }


def test_codex_custom_provider_first_and_second_turn() -> None:
    req = parse(codex_custom_body(1), CODEX_HEADERS)
    assert [m.role for m in req.messages] == ["developer", "developer", "user", "user"]
    assert req.messages[3] == Message("user", (TextPart("List the files."),))
    assert len(req.messages[0].text) == 16979
    assert [t.name for t in req.tools] == [
        "exec_command",
        "write_stdin",
        "multi_agent_v1",
        "update_goal",
        "get_goal",
        "apply_patch",
        "update_plan",
        "view_image",
        "web_search",
    ]
    assert req.tools[5].kind == "custom" and req.tools[5].provider_state == ps({"format": {"type": "text"}})
    exec_tool = req.tools[0]
    assert exec_tool.kind == "function" and exec_tool.strict is False
    assert exec_tool.parameters is not None and exec_tool.parameters["properties"] == {"cmd": {"type": "string"}}
    namespace = req.tools[2]
    assert namespace.kind == "namespace" and [t.name for t in namespace.tools] == ["spawn_agent", "wait_agent"]
    assert req.tools[8].kind == "builtin"
    assert req.tools[8].provider_state == ps({"tool": {"type": "web_search", "external_web_access": False}})
    assert req.tool_choice == ToolChoiceMode("auto") and req.parallel_tool_calls is True
    assert req.stream is True
    assert req.reasoning == ReasoningRequest(include_in_output=True)
    assert req.extras == {
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "client_metadata": {"x-codex-installation-id": "inst-1"},
    }
    assert req.identity.prompt_cache_key == "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    assert req.identity.session_id == CODEX_HEADERS["Session-Id"]
    assert req.identity.user_agent == CODEX_HEADERS["User-Agent"]
    assert set(req.identity.headers) == {
        "session-id",
        "thread-id",
        "x-client-request-id",
        "x-codex-window-id",
        "x-codex-turn-metadata",
        "originator",
    }
    assert render_request(req) == codex_custom_body(1)

    req2 = parse(codex_custom_body(2), CODEX_HEADERS)
    assistant, tool = req2.messages[4:]
    reasoning, call = assistant.parts
    assert isinstance(reasoning, ReasoningPart) and reasoning.text == "I should run ls."
    assert reasoning.provider_state is not None
    assert reasoning.provider_state.data["item"]["encrypted_content"] == "gAAAAB-opaque-blob"
    assert call == ToolCallPart("call_1", "exec_command", '{"cmd":"ls"}')
    assert tool == Message("tool", (ToolResultPart("call_1", (TextPart("README.md\nsrc\n"),)),))
    assert render_request(req2) == codex_custom_body(2)


EXEC_GRAMMAR = {"type": "grammar", "syntax": "lark", "definition": "start: /[\\s\\S]+/"}


def codex_builtin_body() -> dict[str, Any]:
    carrier = {
        "type": "additional_tools",
        "role": "developer",
        "tools": [
            {
                "type": "namespace",
                "name": "functions",
                "description": "Code mode.",
                "tools": [
                    {"type": "custom", "name": "exec", "description": "Run JavaScript.", "format": EXEC_GRAMMAR},
                    fn_tool("wait", {"ms": {"type": "integer"}}),
                ],
            },
            {"type": "namespace", "name": "clock", "tools": [fn_tool("now", {})]},
            {"type": "namespace", "name": "collaboration", "tools": [fn_tool("ask_user", {"q": {"type": "string"}})]},
        ],
    }
    developer = [text_item("developer", filler(n, f"part {i}")) for i, n in enumerate((25900, 3500, 2400, 300))]
    developer[0]["internal_chat_message_metadata_passthrough"] = {"turn_id": "t-1"}
    return {
        "model": "gpt-6.2-sol",
        "stream": True,
        "input": [
            carrier,
            *developer,
            text_item("user", "Add a test."),
            {"type": "custom_tool_call", "call_id": "ct_1", "name": "exec", "input": "await tools.exec_command('ls')"},
            {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "README.md"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "context": "all_turns"},
        "text": {"verbosity": "low"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "sess-2",
    }


def test_codex_builtin_provider_additional_tools_and_custom_exec() -> None:
    sink = UnknownFields()
    req = parse_request(codex_builtin_body(), ROUTE, {"session-id": "s2"}, sink)
    assert [t.name for t in req.tools] == ["functions", "clock", "collaboration"]
    exec_tool = req.tools[0].tools[0]
    assert exec_tool.kind == "custom" and exec_tool.provider_state == ps({"format": EXEC_GRAMMAR})
    assert req.extras["input.additional_tools"] == [{"position": 0, "count": 3, "role": "developer"}]
    assert req.extras["text.verbosity"] == "low" and req.extras["reasoning.context"] == "all_turns"
    assert req.reasoning == ReasoningRequest(effort="low")
    assert req.parallel_tool_calls is False
    assert [m.role for m in req.messages] == ["developer"] * 4 + ["user", "assistant", "tool"]
    assert [len(m.text) for m in req.messages[:4]] == [25900, 3500, 2400, 300]
    assert req.messages[5].parts == (ToolCallPart("ct_1", "exec", "await tools.exec_command('ls')", kind="custom"),)
    assert req.messages[6].parts == (ToolResultPart("ct_1", (TextPart("README.md"),), kind="custom"),)
    assert "input.message.internal_chat_message_metadata_passthrough" in sink.seen
    assert render_request(req) == codex_builtin_body()


def test_previous_response_id_needs_history() -> None:
    follow_up = {
        "model": "gpt-6.2-sol",
        "previous_response_id": "resp_1",
        "input": [{"type": "custom_tool_call_output", "call_id": "ct_1", "output": "done"}],
    }
    with pytest.raises(ConversionError) as info:
        parse(follow_up)
    assert info.value.status == 400 and info.value.param == "previous_response_id"
    history = parse(codex_builtin_body()).messages
    req = DIALECT.parse_request(follow_up, ROUTE, history=history)
    assert req.messages[: len(history)] == history
    assert req.messages[-1] == Message("tool", (ToolResultPart("ct_1", (TextPart("done"),), kind="custom"),))
    assert render_request(req) == follow_up
    with_instructions = {**follow_up, "instructions": "Be brief."}
    assert render_request(parse(with_instructions, history=history)) == with_instructions


OPENCODE_PROMPT = filler(9000, "opencode")
OPENCODE_TOOLS = (
    "bash", "edit", "glob", "grep", "list", "read", "write", "task", "webfetch", "todowrite", "todoread",
    "patch", "multiedit", "lsp_hover", "lsp_diagnostics", "skill",
)  # fmt: skip


def opencode_body() -> dict[str, Any]:
    return {
        "model": "gpt-5",
        "input": [
            {"role": "developer", "content": OPENCODE_PROMPT},
            {"role": "user", "content": [{"type": "input_text", "text": "what is in src?"}]},
            {"type": "function_call", "call_id": "call_x", "name": "glob", "arguments": '{"pattern":"src/*"}'},
            {"type": "function_call_output", "call_id": "call_x", "output": "src/a.py"},
        ],
        "tools": [fn_tool(name, {"pattern": {"type": "string"}}) for name in OPENCODE_TOOLS],
        "tool_choice": "auto",
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "ses_abc123",
        "reasoning": {"effort": "medium", "summary": "auto"},
        "stream": True,
    }


def test_opencode_and_kilo_openai_provider() -> None:
    headers = {"originator": "opencode", "session-id": "ses_abc123", "x-title": "Kilo Code", "user-agent": "ai-sdk"}
    req = parse(opencode_body(), headers)
    assert req.messages[0] == Message(
        "developer", (TextPart(OPENCODE_PROMPT),), ps({"untyped": True, "string_content": True})
    )
    assert req.messages[1] == Message("user", (TextPart("what is in src?"),), ps({"untyped": True}))
    assert req.messages[2].parts == (ToolCallPart("call_x", "glob", '{"pattern":"src/*"}'),)
    assert [t.name for t in req.tools] == list(OPENCODE_TOOLS) and len(req.tools) == 16
    assert req.reasoning == ReasoningRequest(effort="medium", include_in_output=True)
    assert req.identity.session_id == "ses_abc123" and req.identity.prompt_cache_key == "ses_abc123"
    assert req.identity.headers == {"originator": "opencode", "session-id": "ses_abc123"}
    assert render_request(req) == opencode_body()
    title = {
        "model": "gpt-5.4-nano",
        "input": [{"role": "user", "content": "Title for: fix the bug"}],
        "reasoning": {"effort": "none"},
        "temperature": 0.5,
        "tools": [],
        "tool_choice": "auto",
    }
    req = parse(title)
    assert req.reasoning == ReasoningRequest(enabled=False, effort="none")
    assert req.sampling.temperature == 0.5
    assert req.tools == () and req.tool_choice is None


def pi_body() -> dict[str, Any]:
    return {
        "model": "gpt-5.1-codex",
        "input": [
            {"role": "developer", "content": filler(2453, "pi")},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi!", "annotations": []}],
                "status": "completed",
                "id": "msg_01",
            },
            {"role": "user", "content": [{"type": "input_text", "text": "read a.txt"}]},
            {
                "type": "function_call",
                "id": "fc_01",
                "call_id": "call_01",
                "name": "read",
                "arguments": '{"path":"a.txt"}',
            },
            {"type": "function_call_output", "call_id": "call_01", "output": "contents"},
        ],
        "tools": [
            fn_tool(name, {"path": {"type": "string"}}, strict=True) for name in ("read", "bash", "edit", "write")
        ],
        "stream": True,
        "prompt_cache_key": "pi-sess-9",
        "store": False,
        "max_output_tokens": 32000,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
    }


def test_pi_responses() -> None:
    req = parse(pi_body(), {"session_id": "pi-sess-9", "x-client-request-id": "pi-sess-9"})
    assert req.sampling == SamplingParams(max_tokens=32000)
    assert [(t.name, t.strict) for t in req.tools] == [(n, True) for n in ("read", "bash", "edit", "write")]
    assert len(req.messages[0].text) == 2453
    assert [m.role for m in req.messages] == ["developer", "user", "assistant", "user", "assistant", "tool"]
    hi = req.messages[2].parts[0]
    assert isinstance(hi, TextPart) and hi.text == "Hi!" and hi.provider_state is not None
    assert req.messages[4].parts[0] == ToolCallPart(
        "call_01", "read", '{"path":"a.txt"}', provider_state=ps({"extra": {"id": "fc_01"}})
    )
    assert req.identity.session_id == "pi-sess-9"
    assert req.identity.headers == {"session_id": "pi-sess-9", "x-client-request-id": "pi-sess-9"}
    assert render_request(req) == pi_body()


def test_session_id_falls_back_to_codex_turn_metadata() -> None:
    meta = {"X-Codex-Turn-Metadata": json.dumps({"session_id": "from-meta", "turn_id": "t"}), "User-Agent": "ua"}
    req = parse({"model": "m", "input": "x"}, meta)
    assert req.identity.session_id == "from-meta" and req.identity.user_agent == "ua"
    assert req.identity.headers == {"x-codex-turn-metadata": meta["X-Codex-Turn-Metadata"]}
    assert parse({"model": "m", "input": "x"}, {"x-codex-turn-metadata": "{not json"}).identity.session_id is None


# --------------------------------------------------------------------------------------------------- quirks


def test_instructions_become_a_marked_leading_system_message() -> None:
    body = {"model": "m", "instructions": "Be terse.", "input": [text_item("developer", "more rules")]}
    req = parse(body)
    assert req.messages[0] == Message("system", (TextPart("Be terse."),), ps({"source": "instructions"}))
    assert req.messages[1] == Message("developer", (TextPart("more rules"),))
    assert render_request(req) == body


def test_empty_tools_drop_tool_choice() -> None:
    req = parse({"model": "m", "input": "x", "tools": [], "tool_choice": "required"})
    assert req.tools == () and req.tool_choice is None


def test_stream_options_without_stream_is_accepted() -> None:
    req = parse({"model": "m", "input": "x", "stream": False, "stream_options": {"include_obfuscation": False}})
    assert req.stream is False and req.include_usage is False


def test_token_limit_names() -> None:
    sink = UnknownFields()
    req = parse_request({"model": "m", "input": "x", "max_tokens": 5, "max_completion_tokens": 6}, ROUTE, None, sink)
    assert req.sampling.max_tokens is None
    assert {"body.max_tokens", "body.max_completion_tokens"} <= sink.seen
    assert parse({"model": "m", "input": "x", "max_output_tokens": 7}).sampling.max_tokens == 7


def test_unknown_fields_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    sink = UnknownFields()
    body = {"model": "m", "input": "x", "frobnicate": 1}
    with caplog.at_level(logging.INFO, logger="harnessrl.converters"):
        parse_request(body, ROUTE, None, sink)
        parse_request(body, ROUTE, None, sink)
    assert [r.getMessage() for r in caplog.records].count("ignoring unknown request field body.frobnicate") == 1


def test_named_tool_choice_and_parallel_calls() -> None:
    body = {
        "model": "m",
        "input": [
            text_item("user", "go"),
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": '{"x":1}'},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call_output", "call_id": "b", "output": "2"},
        ],
        "tools": [fn_tool("f", {}, strict=True), {"type": "custom", "name": "g"}],
        "tool_choice": {"type": "custom", "name": "g"},
        "parallel_tool_calls": True,
    }
    req = parse(body)
    assert req.tool_choice == ToolChoiceNamed("g")
    assert [p.id for p in req.messages[1].parts if isinstance(p, ToolCallPart)] == ["a", "b"]
    assert [m.role for m in req.messages[2:]] == ["tool", "tool"]
    assert render_request(req) == body


def test_structured_output_formats() -> None:
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    text = {"format": {"type": "json_schema", "name": "title", "schema": schema, "strict": True, "description": "d"}}
    req = parse({"model": "m", "input": "x", "text": text})
    assert req.output_format == JsonSchemaFormat(schema, name="title", strict=True)
    assert req.extras == {"text.format.description": "d"}
    assert render_request(req)["text"] == text
    assert parse({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}).output_format == (
        JsonObjectFormat()
    )
    assert parse({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).output_format == TextFormat()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "JSON object"),
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"model": "m", "input": "x", "background": True}, "background"),
        ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "at least 1"),
        (
            {"model": "m", "input": "x", "tools": [fn_tool("f", {})], "tool_choice": {"type": "function", "name": "g"}},
            "'g'",
        ),
        ({"model": "m", "input": "x", "tools": [{"name": "f"}]}, "string type"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "name"),
        (
            {"model": "m", "input": "x", "tools": [fn_tool("f", {})], "tool_choice": {"type": "allowed_tools"}},
            "tool_choice",
        ),
        ({"model": "m", "input": "x", "text": {"format": {"type": "grammar"}}}, "grammar"),
        ({"model": "m", "input": [{"type": "mcp_call", "id": "x"}]}, "'mcp_call'"),
    ],
)
def test_invalid_requests_are_400s(body: Any, needle: str) -> None:
    with pytest.raises(ConversionError) as info:
        parse_request(body if isinstance(body, bytes) else json.dumps(body).encode(), ROUTE)
    assert info.value.status == 400 and needle in info.value.message


# --------------------------------------------------------------------------------------------------- round trip

SAFE_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)  # no lone surrogates: bodies are UTF-8
NAMES = st.text("abcdefghij_", min_size=1, max_size=6)
JSON_LEAF = st.none() | st.booleans() | st.integers(-5, 5) | SAFE_TEXT
SCHEMAS = st.dictionaries(NAMES, JSON_LEAF, max_size=3)


def plain_text_parts(n: int = 3) -> st.SearchStrategy[list[TextPart]]:
    return st.lists(st.builds(TextPart, SAFE_TEXT), min_size=1, max_size=n)


IMAGES = st.one_of(
    st.builds(ImagePart, st.just("url"), st.sampled_from(["https://x.test/a.png", "http://y.test/b"])),
    st.builds(ImagePart, st.just("base64"), st.sampled_from(["iVBORw0K", "AAAA"]), st.sampled_from(["image/png"])),
    st.builds(ImagePart, st.just("file_id"), st.sampled_from(["file-1", "file-2"])),
)


@st.composite
def input_messages(draw: st.DrawFn) -> Message:
    role: Role = draw(st.sampled_from(INPUT_ROLES))
    shape = draw(st.sampled_from(["plain", "string", "untyped", "id", "images"]))
    if shape == "string":
        return Message(role, (TextPart(draw(SAFE_TEXT)),), ps({"string_content": True, "untyped": True}))
    if shape == "images":
        parts = tuple(draw(st.lists(IMAGES | st.builds(TextPart, SAFE_TEXT), min_size=1, max_size=3)))
        details = [draw(st.sampled_from([None, "low", "high"])) for p in parts if isinstance(p, ImagePart)]
        return Message("user", parts, ps({"image_detail": details}) if any(details) else None)
    parts = tuple(draw(plain_text_parts()))
    state: dict[str, dict[str, Any] | None] = {
        "plain": None,
        "untyped": {"untyped": True},
        "id": {"extra": {"id": "msg_1", "status": "completed"}},
    }
    chosen = state[shape]
    return Message(role, parts, ps(chosen) if chosen else None)


@st.composite
def assistant_parts(draw: st.DrawFn) -> list[Any]:
    kind = draw(st.sampled_from(["reasoning", "encrypted", "text", "text+item", "call", "custom", "call+id"]))
    text = draw(SAFE_TEXT)
    if kind == "reasoning":
        return [ReasoningPart(text)]
    if kind == "encrypted":
        item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": draw(NAMES)}
        return [ReasoningPart("", provider_state=ps({"item": item}))]
    if kind == "text":
        return draw(plain_text_parts(2))
    if kind == "text+item":
        return [TextPart(text, provider_state=ps({"item": {"extra": {"id": draw(NAMES)}}}))]
    call_id, name = draw(NAMES), draw(NAMES)
    extra = ps({"extra": {"id": "fc_1"}}) if kind == "call+id" else None
    return [ToolCallPart(call_id, name, text, kind="custom" if kind == "custom" else "function", provider_state=extra)]


@st.composite
def tool_messages(draw: st.DrawFn) -> Message:
    shape = draw(st.sampled_from(["string", "array1", "blocks", "empty"]))
    kind: CallKind = draw(st.sampled_from(CALL_KINDS))
    state: dict[str, Any] | None = None
    if shape == "string":
        content: tuple[Any, ...] = (TextPart(draw(SAFE_TEXT)),)
    elif shape == "array1":
        content, state = (TextPart(draw(SAFE_TEXT)),), {"array": True}
    elif shape == "blocks":
        content = (TextPart(draw(SAFE_TEXT)), draw(IMAGES))
    else:
        content = ()
    return Message(
        "tool", (ToolResultPart(draw(NAMES), content, kind=kind, provider_state=ps(state) if state else None),)
    )


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["input", "assistant", "tool"]))
        if kind == "assistant" and (not out or out[-1].role != "assistant"):  # adjacent turns would merge
            parts = [p for _ in range(draw(st.integers(1, 3))) for p in draw(assistant_parts())]
            out.append(Message("assistant", tuple(parts)))
        elif kind == "tool":
            out.append(draw(tool_messages()))
        else:
            out.append(draw(input_messages()))
    return out


def function_tools() -> st.SearchStrategy[ToolSpec]:
    return st.builds(
        ToolSpec,
        name=NAMES,
        description=SAFE_TEXT,
        parameters=st.none() | SCHEMAS,
        kind=st.just("function"),
        strict=st.none() | st.booleans(),
    )


def custom_tools() -> st.SearchStrategy[ToolSpec]:
    fmt = st.sampled_from([None, {"format": EXEC_GRAMMAR}, {"format": {"type": "text"}}])
    return st.builds(
        lambda n, d, f: ToolSpec(n, d, kind="custom", provider_state=ps(f) if f else None), NAMES, SAFE_TEXT, fmt
    )


LEAF_TOOLS = function_tools() | custom_tools()
TOOLS = st.one_of(
    LEAF_TOOLS,
    st.builds(lambda n, ts: ToolSpec(n, kind="namespace", tools=tuple(ts)), NAMES, st.lists(LEAF_TOOLS, max_size=3)),
    st.builds(
        lambda t: ToolSpec(t, kind="builtin", provider_state=ps({"tool": {"type": t, "search_context_size": "low"}})),
        st.sampled_from(["web_search", "file_search", "image_generation"]),
    ),
)


def _leaves(tools: tuple[ToolSpec, ...]) -> list[ToolSpec]:
    return [x for t in tools for x in (_leaves(t.tools) if t.kind == "namespace" else [t])]


@st.composite
def requests(draw: st.DrawFn) -> ModelRequest:
    extras: dict[str, Any] = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "store": st.booleans(),
                "include": st.just(["reasoning.encrypted_content"]),
                "client_metadata": st.dictionaries(NAMES, SAFE_TEXT, max_size=2),
                "metadata": st.dictionaries(NAMES, SAFE_TEXT, max_size=2),
                "text.verbosity": st.sampled_from(["low", "high"]),
                "service_tier": st.just("auto"),
            },
        )
    )
    messages = draw(conversations())
    if not messages and draw(st.booleans()):
        messages = [Message("user", (TextPart(draw(SAFE_TEXT)),), ps({"source": "input_string"}))]
    top, carried = draw(st.lists(TOOLS, max_size=3)), draw(st.lists(st.lists(TOOLS, max_size=2), max_size=2))
    is_string = bool(messages) and messages[0].provider_state == ps({"source": "input_string"})
    if carried and not is_string:
        n_items = sum(len(DIALECT.render_request(ModelRequest("responses", "m", (m,)))["input"]) for m in messages)
        slots = sorted(
            draw(st.sets(st.integers(0, n_items + len(carried) - 1), min_size=len(carried), max_size=len(carried)))
        )
        positions = [min(p, n_items + i) for i, p in enumerate(slots)]
        if len(set(positions)) == len(positions):
            extras["input.additional_tools"] = [
                {"position": p, "count": len(ts), "role": "developer"} for p, ts in zip(positions, carried, strict=True)
            ]
            top = top + [t for ts in carried for t in ts]
    if draw(st.booleans()):
        messages.insert(0, Message("system", (TextPart(draw(SAFE_TEXT)),), ps({"source": "instructions"})))
    tools = tuple(top)
    choice: ToolChoice | None = draw(
        st.none() | st.sampled_from([ToolChoiceMode("auto"), ToolChoiceMode("required"), ToolChoiceMode("none")])
    )
    named = draw(st.booleans())
    callable_names = [t.name for t in _leaves(tools) if t.kind in ("function", "custom")]
    if callable_names and named:
        choice = ToolChoiceNamed(draw(st.sampled_from(callable_names)))
    reasoning = draw(
        st.none()
        | st.builds(
            lambda e, s: ReasoningRequest(enabled=False if e == "none" else None, effort=e, include_in_output=s),
            st.sampled_from([None, "none", "low", "high"]),
            st.sampled_from([None, True]),
        )
    )
    if reasoning is not None and reasoning.include_in_output and draw(st.booleans()):
        extras["reasoning.summary"] = "detailed"
    formats: st.SearchStrategy[OutputFormat] = st.one_of(
        st.sampled_from([TextFormat(), JsonObjectFormat()]),
        st.builds(JsonSchemaFormat, SCHEMAS, NAMES, st.none() | st.booleans()),
    )
    output_format = draw(formats)
    return ModelRequest(
        format="responses",
        model=draw(NAMES),
        messages=tuple(messages),
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=draw(st.none() | st.booleans()),
        sampling=SamplingParams(
            max_tokens=draw(st.none() | st.integers(1, 100000)),
            temperature=draw(st.none() | st.floats(0, 2, allow_nan=False)),
            top_p=draw(st.none() | st.floats(0, 1, allow_nan=False)),
        ),
        stream=draw(st.booleans()),
        output_format=output_format,
        reasoning=reasoning,
        identity=IdentityHints(prompt_cache_key=draw(st.none() | NAMES), user_id=draw(st.none() | NAMES)),
        extras=extras,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_round_trip_identity(req: ModelRequest) -> None:
    body = json.dumps(render_request(req), ensure_ascii=False).encode()
    assert parse_request(body, ROUTE) == req


def test_dialect_is_registered_and_delegates() -> None:
    dialect = dialect_for("responses")
    assert dialect is DIALECT and dialect.format == "responses"
    body = pi_body()
    assert dialect.render_request(dialect.parse_request(body, ROUTE)) == body

"""Gemini routes and request parsing: harness-shaped fixtures, bodies built by the google-genai SDK itself,
quirks, and the 400s for what cannot be represented."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

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
)
from converters.gemini import DIALECT, parse_route
from tests import gemini_fixtures

ROUTE = Route("gemini", "/v1beta/models/gem-x:generateContent", model="gem-x", stream=False, sse=False)


def parse(body: dict[str, Any], fields: UnknownFields | None = None, route: Route = ROUTE) -> ModelRequest:
    return DIALECT.parse_request(body, route, {}, fields)


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def rejects(body: dict[str, Any], *words: str, kind: str = "invalid_request", route: Route = ROUTE) -> None:
    with pytest.raises(ConversionError) as info:
        parse(body, route=route)
    assert info.value.kind == kind
    for word in words:
        assert word in info.value.message


def test_dialect_registered() -> None:
    assert dialect_for("gemini") is DIALECT and DIALECT.format == "gemini"


# --------------------------------------------------------------------------------------------------- routes


@pytest.mark.parametrize(
    ("path", "query", "model", "stream", "sse"),
    [
        ("/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "sse"}, "gemini-3.5-pro", True, True),
        ("/v1beta/models/gemini-3.5-pro:streamGenerateContent", {}, "gemini-3.5-pro", True, False),
        ("/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "SSE"}, "gemini-3.5-pro", True, True),
        ("/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "json"}, "gemini-3.5-pro", True, False),
        ("/v1beta/models/gemini-3.5-flash-lite:generateContent", {}, "gemini-3.5-flash-lite", False, False),
        ("/v1/models/gem:generateContent", {}, "gem", False, False),
        ("/v1alpha/models/my%2Fmodel:generateContent", {}, "my/model", False, False),
        ("/v1beta/models/gem:streamGenerateContent?alt=sse", {"alt": "sse"}, "gem", True, True),
    ],
)
def test_parse_route_recognises_model_calls(
    path: str, query: dict[str, str], model: str, stream: bool, sse: bool
) -> None:
    route = parse_route(path, query)
    assert route is not None
    assert (route.format, route.model, route.stream, route.sse) == ("gemini", model, stream, sse)
    assert route.path == path.split("?")[0] and route.query == query


@pytest.mark.parametrize(
    "path",
    [
        "/v1beta/models/gem:countTokens",
        "/v1beta/models/gem",
        "/v1beta/models",
        "/v1beta/files/abc:generateContent",
        "/v1/chat/completions",
        "/v1beta/models/gem:generateContentX",
        "/v2/models/gem:generateContent",
    ],
)
def test_parse_route_ignores_other_paths(path: str) -> None:
    assert parse_route(path, {}) is None


# --------------------------------------------------------------------------------------------------- fixtures


def parse_fixture(name: str, fields: UnknownFields | None = None) -> ModelRequest:
    path, query, headers, body = gemini_fixtures.ALL[name]()
    route = parse_route(path, query)
    assert route is not None
    return DIALECT.parse_request(json.dumps(body).encode(), route, headers, fields)


def test_gemini_cli_main_turn_parses_without_loss() -> None:
    fields = UnknownFields()
    req = parse_fixture("gemini_cli_main", fields)
    assert fields.seen == frozenset()
    assert (req.format, req.model, req.stream) == ("gemini", "gemini-3.5-pro", True)
    assert [m.role for m in req.messages] == ["system", "user", "user", "assistant", "tool"]
    assert len(req.messages[0].text) > 30_000
    assert req.messages[3].parts == (
        ReasoningPart("I will look for *.py files."),
        ToolCallPart(
            "glob-1764-0",
            "glob",
            '{"pattern":"**/*.py"}',
            provider_state=ProviderState("gemini", {"thoughtSignature": "skip_thought_signature_validator"}),
        ),
    )
    (result,) = req.messages[4].parts
    assert isinstance(result, ToolResultPart)
    assert (result.call_id, result.name) == ("glob-1764-0", "glob")
    # {"output": text} is how a plain-text result travels in Gemini; it reads back as that text.
    assert result.text == "Found 2 files:\n/work/demo/a.py\n/work/demo/ü.py"
    assert [t.name for t in req.tools] == gemini_fixtures._CLI_TOOLS
    assert req.tools[1].parameters == gemini_fixtures._schema("read_file")
    assert all(t.kind == "function" and t.provider_state is None for t in req.tools)
    assert req.tool_choice is None
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (1.0, 0.95, 64, None)
    assert req.reasoning == ReasoningRequest(effort="high", include_in_output=True)
    assert req.output_format == TextFormat()
    ident = req.identity
    assert ident.headers == {
        k: v for k, v in gemini_fixtures.CLI_HEADERS.items() if k.startswith(("x-goog-api-c", "x-ge", "user"))
    }
    assert "x-goog-api-key" not in ident.headers
    assert ident.user_id == "0b7c6a52-1111-4c2e-9d0e-5a7e2f3b9c10"
    assert ident.user_agent == "GeminiCLI-tui/0.61.0/gemini-3.5-pro"


def test_gemini_cli_classifier_parses_without_loss() -> None:
    req = parse_fixture("gemini_cli_classifier")
    assert (req.model, req.stream) == ("gemini-3.5-flash-lite", False)
    assert [m.role for m in req.messages] == ["system", "user", "user"]
    assert req.output_format == JsonSchemaFormat(gemini_fixtures.CLASSIFIER_SCHEMA)
    assert (req.sampling.temperature, req.sampling.max_tokens) == (0.0, 1024)
    assert req.reasoning == ReasoningRequest(enabled=True, budget_tokens=512)
    assert req.extras == {}


def test_pi_parallel_calls_and_results_parse_without_loss() -> None:
    req = parse_fixture("pi_google")
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    calls = req.messages[2].parts
    assert [(c.id, c.name, c.parsed_arguments()) for c in calls if isinstance(c, ToolCallPart)] == [
        ("toolu_1", "read", {"path": "README.md"}),
        ("toolu_2", "bash", {"command": "git status"}),
    ]
    results = [p for p in req.messages[3].parts if isinstance(p, ToolResultPart)]
    assert [(r.call_id, r.name, r.text, r.is_error) for r in results] == [
        ("toolu_1", "read", "# Demo", False),
        ("toolu_2", "bash", "not a repo", True),
    ]
    assert [t.name for t in req.tools] == ["read", "bash", "edit", "write"]
    assert req.tools[1].parameters == {
        "type": "OBJECT",
        "properties": {"command": {"type": "STRING"}},
        "required": ["command"],
    }
    assert all(t.provider_state == ProviderState("gemini", {"parametersKey": "parameters"}) for t in req.tools)
    assert req.sampling.max_tokens == 32000
    assert req.reasoning == ReasoningRequest(effort="high", include_in_output=True)
    assert req.identity.user_id is None and (req.identity.user_agent or "").startswith("google-genai-sdk/")


# --------------------------------------------------------------------------------------------------- SDK-built


def test_bodies_built_by_the_google_genai_sdk_parse() -> None:
    captured: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(500, json={"error": {"code": 500, "message": "capture only", "status": "INTERNAL"}})

    options = types.HttpOptions(
        base_url="http://gemini.test", api_version="v1beta", client_args={"transport": httpx.MockTransport(handler)}
    )
    client = genai.Client(api_key="test-key", http_options=options)
    contents = [
        types.Content(role="user", parts=[types.Part(text="hello")]),
        types.Content(
            role="model", parts=[types.Part(function_call=types.FunctionCall(id="c1", name="f", args={"a": 1}))]
        ),
        types.Content(role="user", parts=[types.Part.from_function_response(name="f", response={"ok": True})]),
    ]
    config = types.GenerateContentConfig(
        system_instruction="be brief",
        temperature=0.3,
        top_p=0.9,
        top_k=20,
        max_output_tokens=99,
        stop_sequences=["END"],
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        candidate_count=1,
        response_mime_type="application/json",
        response_json_schema={"type": "object"},
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=-1),
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(name="f", description="d", parameters_json_schema={"type": "object"})
                ]
            )
        ],
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(
                mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=["f"]
            )
        ),
        safety_settings=[
            types.SafetySetting(
                category=types.HarmCategory.HARM_CATEGORY_HARASSMENT, threshold=types.HarmBlockThreshold.BLOCK_NONE
            )
        ],
    )
    with pytest.raises(genai.errors.ServerError):
        client.models.generate_content(model="gem-x", contents=contents, config=config)
    (request,) = captured
    route = parse_route(request.url.path, dict(request.url.params))
    assert route is not None and route.model == "gem-x" and route.stream is False
    fields = UnknownFields()
    req = DIALECT.parse_request(request.content, route, dict(request.headers), fields)
    assert fields.seen == frozenset()
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[0].text == "be brief"
    assert req.messages[2].parts == (ToolCallPart("c1", "f", '{"a":1}'),)
    assert req.messages[3].parts == (ToolResultPart("", (TextPart('{"ok":true}'),), name="f"),)
    s = req.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop, s.seed) == (0.3, 0.9, 20, 99, ("END",), 7)
    assert (s.presence_penalty, s.frequency_penalty) == (0.1, 0.2)
    assert req.output_format == JsonSchemaFormat({"type": "object"})
    assert req.reasoning == ReasoningRequest(enabled=True, budget_tokens=-1, include_in_output=True)
    assert req.tool_choice == ToolChoiceNamed("f") and req.tools[0].parameters == {"type": "object"}
    assert req.extras["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]
    assert req.extras["generationConfig"] == {"candidateCount": 1}
    assert req.identity.headers["x-goog-api-client"].startswith("google-genai-sdk/")


# --------------------------------------------------------------------------------------------------- parts


def test_thought_signatures_travel_in_provider_state() -> None:
    sig = ProviderState("gemini", {"thoughtSignature": "c2ln"})
    req = parse(
        {
            "contents": [
                user({"text": "hi"}),
                {
                    "role": "model",
                    "parts": [
                        {"text": "plan", "thought": True, "thoughtSignature": "c2ln"},
                        {"text": "answer", "thoughtSignature": "c2ln"},
                        {"thoughtSignature": "c2ln"},
                        {"text": "plain", "thought": False},
                    ],
                },
            ]
        }
    )
    assert req.messages[1].parts == (
        ReasoningPart("plan", sig),
        TextPart("answer", provider_state=sig),
        ReasoningPart("", sig),
        TextPart("plain"),
    )


def test_images_and_missing_ids() -> None:
    req = parse(
        {
            "contents": [
                user(
                    {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                    {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://files.test/a.jpg"}},
                    {"fileData": {"fileUri": "gs://bucket/b"}},
                ),
                {"role": "model", "parts": [{"functionCall": {"name": "shot", "args": {}}}]},
                {
                    "role": "function",
                    "parts": [
                        {
                            "functionResponse": {
                                "name": "shot",
                                "response": {"output": "ok"},
                                "parts": [{"inlineData": {"mimeType": "image/webp", "data": "UklGRg=="}}],
                            }
                        }
                    ],
                },
            ]
        }
    )
    assert req.messages[0].parts == (
        ImagePart("base64", "iVBORw0KGgo=", "image/png"),
        ImagePart("url", "https://files.test/a.jpg", "image/jpeg"),
        ImagePart("url", "gs://bucket/b", None),
    )
    assert req.messages[1].parts == (ToolCallPart("", "shot", "{}"),)
    assert req.messages[2] == Message(
        "tool",
        (ToolResultPart("", (TextPart("ok"), ImagePart("base64", "UklGRg==", "image/webp")), name="shot"),),
    )


def test_mixed_user_content_stays_a_user_message() -> None:
    req = parse(
        {"contents": [user({"functionResponse": {"id": "a", "name": "f", "response": {}}}, {"text": "and also"})]}
    )
    assert req.messages[0].role == "user"
    assert req.messages[0].parts == (ToolResultPart("a", (TextPart("{}"),), name="f"), TextPart("and also"))


def test_system_instruction_as_string_and_as_parts() -> None:
    assert parse({"contents": [user({"text": "x"})], "systemInstruction": "short"}).messages[0] == Message(
        "system", (TextPart("short"),)
    )
    req = parse({"contents": [user({"text": "x"})], "systemInstruction": {"parts": [{"text": "a"}, {"text": "b"}]}})
    assert req.messages[0] == Message("system", (TextPart("a"), TextPart("b")))


# --------------------------------------------------------------------------------------------------- tools


def test_builtin_tools_are_kept_for_the_record() -> None:
    req = parse(
        {
            "contents": [user({"text": "x"})],
            "tools": [
                {"functionDeclarations": [{"name": "f", "description": "d"}], "googleSearch": {}},
                {"codeExecution": {}},
            ],
        }
    )
    assert [(t.name, t.kind) for t in req.tools] == [
        ("f", "function"),
        ("googleSearch", "builtin"),
        ("codeExecution", "builtin"),
    ]
    assert req.tools[0].parameters is None
    assert req.tools[1].provider_state == ProviderState("gemini", {"googleSearch": {}})


@pytest.mark.parametrize(
    ("config", "choice", "kept"),
    [
        ({"functionCallingConfig": {"mode": "AUTO"}}, ToolChoiceMode("auto"), False),
        ({"functionCallingConfig": {"mode": "NONE"}}, ToolChoiceMode("none"), False),
        ({"functionCallingConfig": {"mode": "ANY"}}, ToolChoiceMode("required"), False),
        ({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}}, ToolChoiceNamed("f"), False),
        (
            {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f", "g"]}},
            ToolChoiceMode("required"),
            True,
        ),
        ({"functionCallingConfig": {"mode": "VALIDATED"}}, ToolChoiceMode("auto"), True),
        ({"functionCallingConfig": {"mode": "any"}}, ToolChoiceMode("required"), True),
        ({}, None, False),
    ],
)
def test_tool_config_modes(config: dict[str, Any], choice: Any, kept: bool) -> None:
    tools = [{"functionDeclarations": [{"name": "f"}, {"name": "g"}]}]
    req = parse({"contents": [user({"text": "x"})], "tools": tools, "toolConfig": config})
    assert req.tool_choice == choice
    assert req.extras.get("toolConfig") == (config if kept else None)


def test_empty_tools_drop_the_tool_config() -> None:
    body = {"contents": [user({"text": "x"})], "tools": [], "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}
    req = parse(body)
    assert req.tools == () and req.tool_choice is None and "toolConfig" not in req.extras


# --------------------------------------------------------------------------------------------------- generation config


def test_generation_config_maps_onto_sampling_and_output() -> None:
    req = parse(
        {
            "contents": [user({"text": "x"})],
            "generationConfig": {
                "maxOutputTokens": 256,
                "temperature": 0.5,
                "topP": 1,
                "topK": 40.0,
                "stopSequences": ["a", "b"],
                "seed": 3,
                "presencePenalty": 0.5,
                "frequencyPenalty": -0.5,
                "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT"},
                "responseModalities": ["TEXT"],
                "thinkingConfig": {"thinkingBudget": 0},
            },
            "cachedContent": "cachedContents/abc",
            "labels": {"team": "demo"},
        }
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop) == (256, 0.5, 1.0, 40, ("a", "b"))
    assert (s.seed, s.presence_penalty, s.frequency_penalty) == (3, 0.5, -0.5)
    assert isinstance(s.top_k, int) and isinstance(s.top_p, float)
    assert req.output_format == JsonSchemaFormat({"type": "OBJECT"})
    assert req.reasoning == ReasoningRequest(enabled=False, budget_tokens=0)
    assert req.extras == {
        "responseSchema": {"type": "OBJECT"},
        "generationConfig": {"responseModalities": ["TEXT"]},
        "cachedContent": "cachedContents/abc",
        "labels": {"team": "demo"},
    }


@pytest.mark.parametrize(
    ("config", "fmt"),
    [
        ({"responseMimeType": "application/json"}, JsonObjectFormat()),
        ({"responseMimeType": "text/plain"}, TextFormat()),
        ({}, TextFormat()),
        (
            {"responseMimeType": "application/json", "_responseJsonSchema": {"type": "array"}},
            JsonSchemaFormat({"type": "array"}),
        ),
    ],
)
def test_output_formats(config: dict[str, Any], fmt: Any) -> None:
    assert parse({"contents": [user({"text": "x"})], "generationConfig": config}).output_format == fmt


# --------------------------------------------------------------------------------------------------- quirks


def test_unknown_fields_are_logged_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    fields = UnknownFields(logging.getLogger("test.gemini"))
    body = {
        "contents": [user({"text": "x", "videoMetadata": {}}), user({"text": "y", "videoMetadata": {}})],
        "futureTopLevel": 1,
        "generationConfig": {"newKnob": True},
    }
    with caplog.at_level(logging.INFO, logger="test.gemini"):
        req = parse(body, fields)
        parse(body, fields)
    assert req.messages[0].parts == (TextPart("x"),)
    assert fields.seen == {"body.futureTopLevel", "contents.parts.videoMetadata", "generationConfig.newKnob"}
    assert len([r for r in caplog.records if "videoMetadata" in r.getMessage()]) == 1


def test_snake_case_field_names_are_read_too() -> None:
    """Proto3 JSON accepts both spellings, and google-genai for Python sends some keys in snake_case."""
    snake = {
        "system_instruction": {"parts": [{"text": "sys"}]},
        "contents": [
            user({"inline_data": {"mime_type": "image/png", "data": "AAAA"}}),
            {
                "role": "model",
                "parts": [{"function_call": {"id": "c", "name": "f", "args": {"k_v": 1}}, "thought_signature": "s"}],
            },
            user({"function_response": {"id": "c", "name": "f", "response": {"o_k": True}}}),
        ],
        "tools": [
            {"function_declarations": [{"name": "f", "parameters_json_schema": {"type": "object"}}]},
            {"google_search": {}},
        ],
        "tool_config": {"function_calling_config": {"mode": "ANY", "allowed_function_names": ["f"]}},
        "generation_config": {
            "max_output_tokens": 5,
            "top_k": 3,
            "stop_sequences": ["x"],
            "response_mime_type": "application/json",
            "thinking_config": {"thinking_budget": 0, "include_thoughts": False},
        },
    }
    fields = UnknownFields()
    req = parse(snake, fields)
    assert fields.seen == frozenset()
    camel = {
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "contents": [
            user({"inlineData": {"mimeType": "image/png", "data": "AAAA"}}),
            {
                "role": "model",
                "parts": [{"functionCall": {"id": "c", "name": "f", "args": {"k_v": 1}}, "thoughtSignature": "s"}],
            },
            user({"functionResponse": {"id": "c", "name": "f", "response": {"o_k": True}}}),
        ],
        "tools": [
            {"functionDeclarations": [{"name": "f", "parametersJsonSchema": {"type": "object"}}]},
            {"googleSearch": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "generationConfig": {
            "maxOutputTokens": 5,
            "topK": 3,
            "stopSequences": ["x"],
            "responseMimeType": "application/json",
            "thinkingConfig": {"thinkingBudget": 0, "includeThoughts": False},
        },
    }
    assert req == parse(camel)
    assert req.sampling.max_tokens == 5 and req.tool_choice == ToolChoiceNamed("f")
    assert req.messages[2].parts[0] == ToolCallPart(
        "c", "f", '{"k_v":1}', provider_state=ProviderState("gemini", {"thoughtSignature": "s"})
    )


def test_model_comes_from_the_route_and_bytes_are_accepted() -> None:
    route = Route("gemini", "/v1beta/models/a:streamGenerateContent", model="a", stream=True, sse=True)
    req = DIALECT.parse_request(b'{"contents":[{"role":"user","parts":[{"text":"x"}]}],"model":"ignored"}', route)
    assert (req.model, req.stream) == ("a", True)


X = user({"text": "x"})
F = [{"functionDeclarations": [{"name": "f"}]}]
BAD_REQUESTS: list[tuple[dict[str, Any], list[str]]] = [
    ({"contents": [user({"inlineData": {"mimeType": "application/pdf", "data": "JVBE"}})]}, ["application/pdf"]),
    ({"contents": [user({"fileData": {"mimeType": "video/mp4", "fileUri": "gs://v"}})]}, ["video/mp4"]),
    ({"contents": [user({"executableCode": {"code": "print(1)"}})]}, ["executableCode"]),
    ({"contents": [user({"codeExecutionResult": {"output": "1"}})]}, ["codeExecutionResult"]),
    ({"contents": [user({})]}, ["part has no data"]),
    ({"contents": [user({"text": 3})]}, ["text", "expected string"]),
    ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, ["role"]),
    ({"contents": []}, ["contents"]),
    ({}, ["contents", "required"]),
    ({"contents": {"role": "user"}}, ["contents", "expected array"]),
    ({"contents": [X], "generationConfig": {"candidateCount": 2}}, ["candidateCount"]),
    ({"contents": [X], "generationConfig": {"temperature": "hot"}}, ["temperature"]),
    ({"contents": [X], "generationConfig": {"topK": 1.5}}, ["topK"]),
    ({"contents": [X], "generationConfig": {"maxOutputTokens": True}}, ["maxOutputTokens", "boolean"]),
    ({"contents": [X], "generationConfig": {"responseMimeType": "text/x.enum"}}, ["text/x.enum"]),
    ({"contents": [X], "systemInstruction": {"parts": [{"functionCall": {"name": "f"}}]}}, ["systemInstruction"]),
    ({"contents": [X], "systemInstruction": {"parts": True}}, ["systemInstruction.parts", "expected array"]),  # fuzz
    ({"contents": [X], "tools": F, "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}}, ["SOMETIMES"]),
    (
        {
            "contents": [X],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {}, "parametersJsonSchema": {}}]}],
        },
        ["not both"],
    ),
    ({"contents": [user({"functionResponse": {"response": {}}})]}, ["name", "required"]),
    ({"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": "x=1"}}]}]}, ["args", "object"]),
    ({"contents": [user({"functionResponse": {"name": "f", "response": {}, "parts": [{"text": "t"}]}})]}, ["parts"]),
]


@pytest.mark.parametrize(("body", "words"), BAD_REQUESTS)
def test_unsupported_or_malformed_requests_are_400(body: dict[str, Any], words: list[str]) -> None:
    rejects(body, *words)


def test_invalid_json_and_missing_model() -> None:
    with pytest.raises(ConversionError) as info:
        DIALECT.parse_request(b"{not json", ROUTE)
    assert info.value.status == 400
    no_model = Route("gemini", "/v1beta/models/:generateContent")
    rejects({"contents": [user({"text": "x"})]}, "no model", kind="not_found", route=no_model)

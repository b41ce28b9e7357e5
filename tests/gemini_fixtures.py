"""Gemini request fixtures shaped like real harness traffic (see /work/shared/reference/harnesses.md).

Written for these tests: the field names, header names, sizes and generation settings follow what the harnesses
were seen to send; every prompt, tool description and file name is made up. Each fixture is
``(path, query, headers, body)`` as the proxy would see it.
"""

from __future__ import annotations

from typing import Any

Fixture = tuple[str, dict[str, str], dict[str, str], dict[str, Any]]

CLI_HEADERS = {
    "content-type": "application/json",
    "x-goog-api-key": "test-key-not-a-secret",
    "x-goog-api-client": "google-genai-sdk/1.30.0 gl-node/v20.20.2",
    "x-gemini-api-privileged-user-id": "0b7c6a52-1111-4c2e-9d0e-5a7e2f3b9c10",
    "user-agent": "GeminiCLI-tui/0.61.0/gemini-3.5-pro",
}

_CLI_TOOLS = ["list_directory", "read_file", "search_file_content", "glob", "read_many_files", "google_web_search",
              "web_fetch", "save_memory"]  # fmt: skip


def _schema(name: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"path": {"type": "string", "description": f"Where {name} looks."}, "limit": {"type": "integer"}},
        "required": ["path"],
    }


def gemini_cli_main() -> Fixture:
    """Gemini CLI's main turn after one tool round: SSE stream, ~30k-char system instruction, 8 read-only tools
    declared with ``parametersJsonSchema``, thoughts replayed with a ``thoughtSignature`` on the call."""
    system = "You are a careful made-up command-line helper. Keep answers short and cite files. " * 370
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Context: today is a made-up day; the folder is /work/demo."}]},
            {"role": "user", "parts": [{"text": "Which Python files are here?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "I will look for *.py files.", "thought": True},
                    {
                        "functionCall": {"id": "glob-1764-0", "name": "glob", "args": {"pattern": "**/*.py"}},
                        "thoughtSignature": "skip_thought_signature_validator",
                    },
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "id": "glob-1764-0",
                            "name": "glob",
                            "response": {"output": "Found 2 files:\n/work/demo/a.py\n/work/demo/ü.py"},
                        }
                    }
                ],
            },
        ],
        "systemInstruction": {"role": "user", "parts": [{"text": system}]},
        "tools": [
            {
                "functionDeclarations": [
                    {"name": n, "description": f"Made-up description of {n}.", "parametersJsonSchema": _schema(n)}
                    for n in _CLI_TOOLS
                ]
            }
        ],
        "generationConfig": {
            "temperature": 1,
            "topP": 0.95,
            "topK": 64,
            "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
        },
    }
    return "/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "sse"}, CLI_HEADERS, body


CLASSIFIER_SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "model_choice": {"type": "string", "enum": ["flash", "pro"]}},
    "required": ["reasoning", "model_choice"],
}


def gemini_cli_classifier() -> Fixture:
    """Gemini CLI's router call: non-streaming ``generateContent`` that must answer JSON (``responseJsonSchema``)."""
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Which Python files are here?"}]},
            {"role": "user", "parts": [{"text": "Classify the request above. Answer with the JSON schema."}]},
        ],
        "systemInstruction": {"role": "user", "parts": [{"text": "You route requests to a made-up model tier."}]},
        "generationConfig": {
            "temperature": 0,
            "maxOutputTokens": 1024,
            "responseMimeType": "application/json",
            "responseJsonSchema": CLASSIFIER_SCHEMA,
            "thinkingConfig": {"thinkingBudget": 512},
        },
    }
    return "/v1beta/models/gemini-3.5-flash-lite:generateContent", {}, CLI_HEADERS, body


PI_HEADERS = {
    "content-type": "application/json",
    "x-goog-api-key": "test-key-not-a-secret",
    "x-goog-api-client": "google-genai-sdk/1.30.0 gl-node/v22.11.0",
    "user-agent": "google-genai-sdk/1.30.0 gl-node/v22.11.0",
}


def pi_google() -> Fixture:
    """Pi's google provider: SSE, a short system prompt, 4 tools, ``thinkingLevel: HIGH``; the second turn has
    two parallel calls answered in one user content. (Which schema key Pi uses is not recorded; this fixture
    uses the OpenAPI ``parameters`` key so the other spelling is covered too.)"""
    tools = [
        {"name": n, "description": f"Made-up {n} tool.", "parameters": {"type": "OBJECT", "properties": {}}}
        for n in ("read", "bash", "edit", "write")
    ]
    tools[1]["parameters"] = {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}, "required": ["command"]}
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Show the readme and the git status."}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"id": "toolu_1", "name": "read", "args": {"path": "README.md"}}},
                    {"functionCall": {"id": "toolu_2", "name": "bash", "args": {"command": "git status"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": "toolu_1", "name": "read", "response": {"output": "# Demo"}}},
                    {"functionResponse": {"id": "toolu_2", "name": "bash", "response": {"error": "not a repo"}}},
                ],
            },
        ],
        "systemInstruction": {"parts": [{"text": "You are a made-up coding assistant. " * 68}]},
        "tools": [{"functionDeclarations": tools}],
        "generationConfig": {
            "maxOutputTokens": 32000,
            "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
        },
    }
    return "/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "sse"}, PI_HEADERS, body


ALL = {"gemini_cli_main": gemini_cli_main, "gemini_cli_classifier": gemini_cli_classifier, "pi_google": pi_google}

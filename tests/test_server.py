"""addon/server.py: naming the caller from its User-Agent (the HTTP routes are driven end to end in test_capture)."""

from __future__ import annotations

import pytest

from addon.server import harness_from_user_agent


@pytest.mark.parametrize(
    ("ua", "expected"),
    [
        ("claude-cli/2.1.197 (external, sdk-cli)", ("claude-code", "2.1.197")),
        ("GeminiCLI-tui/0.61.0/gemini-3.5-pro (linux; x64)", ("gemini-cli", "0.61.0")),
        ("codex_exec/0.171.0 (Debian 12; x86_64) xterm", ("codex", "0.171.0")),
        ("QwenCode/0.15.10 (linux; x64)", ("qwen-code", "0.15.10")),
        ("opencode/1.18.33 ai-sdk/provider-utils/3.0.1", ("opencode", "1.18.33")),
        ("Anthropic/JS 0.91.1", ("anthropic-js-sdk", "0.91.1")),  # Pi sends only its SDK's agent
        ("OpenAI/Python 2.24.0", ("openai-python-sdk", "2.24.0")),
        ("kilo-code/latest", ("kilo", None)),
        ("curl/8.5.0", ("curl", None)),
        ("", ("unknown", None)),
    ],
)
def test_harness_from_user_agent(ua: str, expected: tuple[str, str | None]) -> None:
    assert harness_from_user_agent(ua) == expected

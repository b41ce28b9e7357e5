"""addon/serving/routes.py: every route a harness was seen to use is classified as the right answer kind."""

from __future__ import annotations

import pytest

from addon.serving.routes import (
    CountTokens,
    LocalAnswer,
    ModelCall,
    ModelList,
    WebSocketRefused,
    classify,
    split_session_prefix,
)


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("/v1/messages", "anthropic"),
        ("/v1/messages?beta=true", "anthropic"),
        ("/anthropic/v1/messages", "anthropic"),  # hermes' base URL ends in /anthropic
        ("/v1/chat/completions", "chat"),
        ("/compatible-mode/v1/chat/completions", "chat"),
        ("/v1/responses", "responses"),
        ("/v1/responses/", "responses"),
    ],
)
def test_model_routes_by_suffix(path: str, fmt: str) -> None:
    d = classify("POST", path, {}, {})
    assert isinstance(d, ModelCall) and d.route.format == fmt
    assert d.route.path == path.split("?")[0].rstrip("/")


def test_gemini_methods_carry_model_and_stream_shape() -> None:
    d = classify("POST", "/v1beta/models/gemini-3.5-pro:streamGenerateContent", {"alt": "sse"}, {})
    assert isinstance(d, ModelCall)
    assert (d.route.format, d.route.model, d.route.stream, d.route.sse) == ("gemini", "gemini-3.5-pro", True, True)
    d = classify("POST", "/v1beta/models/flash:streamGenerateContent", {}, {})
    assert isinstance(d, ModelCall) and d.route.sse is False  # the JSON-array stream
    d = classify("POST", "/v1beta/models/flash:generateContent", {}, {})
    assert isinstance(d, ModelCall) and d.route.stream is False
    d = classify("POST", "/v1beta/models/flash:countTokens", {}, {})
    assert isinstance(d, CountTokens) and d.route.model == "flash"
    assert isinstance(classify("POST", "/v1beta/models/flash:embedContent", {}, {}), LocalAnswer)


def test_auxiliary_routes() -> None:
    assert isinstance(classify("POST", "/v1/messages/count_tokens", {}, {}), CountTokens)
    listing = classify("GET", "/v1/models", {}, {"anthropic-version": "2023-06-01"})
    assert listing == ModelList("anthropic")
    assert classify("GET", "/v1/models", {}, {}) == ModelList("chat")
    assert classify("GET", "/v1/models/gpt-x", {}, {}) == ModelList("chat", model_id="gpt-x")
    assert classify("GET", "/v1beta/models", {}, {}) == ModelList("gemini")
    ws = classify("GET", "/v1/responses", {}, {"upgrade": "websocket"})
    assert isinstance(ws, WebSocketRefused)


def test_other_paths_get_harmless_local_answers() -> None:
    telemetry = classify("POST", "/api/event_logging/v2/batch", {}, {})
    assert isinstance(telemetry, LocalAnswer) and telemetry.status == 200
    flags = classify("GET", "/api/claude_code/settings", {}, {})
    assert isinstance(flags, LocalAnswer) and flags.status == 404
    assert classify("HEAD", "/", {}, {}) == LocalAnswer(200, "HEAD probe answered locally")


def test_session_prefix() -> None:
    assert split_session_prefix("/s/rollout-7/v1/messages") == ("rollout-7", "/v1/messages")
    assert split_session_prefix("/v1/messages") == (None, "/v1/messages")
    assert split_session_prefix("/s/bad session/v1") == (None, "/s/bad session/v1")

"""addon/serving/admission.py: the one check both front doors run — route, body size, session — and the refusals it
renders in the caller's wire format (validated with the vendors' SDK error models where they have one)."""

from __future__ import annotations

import json

import anthropic.types
import openai.types
import pytest

from addon.generation.sessions import UNATTRIBUTED
from addon.serving.admission import Admitted, Arrival, Local, Refused, admit, unavailable
from addon.serving.routes import CountTokens, LocalAnswer, ModelList, WebSocketRefused

ALL = ("proxyauth", "prefix", "header", "api_key")


def arrival(target: str, method: str = "POST", **kw) -> Arrival:
    headers = kw.pop("headers", {})
    return Arrival(method, target, headers, **kw)


@pytest.mark.parametrize(
    ("target", "fmt", "path"),
    [
        ("/v1/chat/completions", "chat", "/v1/chat/completions"),
        ("/s/rollout-7/v1/messages?beta=true", "anthropic", "/v1/messages"),
        ("/v1/responses", "responses", "/v1/responses"),
        (
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            "gemini",
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
        ),
    ],
)
def test_a_model_call_is_admitted_with_its_route_and_the_path_without_the_prefix(target, fmt, path) -> None:
    verdict = admit(arrival(target, body_length=10), ALL, max_body=100)
    assert isinstance(verdict, Admitted)
    assert verdict.call.route.format == fmt and verdict.path == path
    assert verdict.original == target.removeprefix("/s/rollout-7")


def test_the_gemini_stream_mode_and_model_come_from_the_path_and_query() -> None:
    verdict = admit(arrival("/v1beta/models/g-1:streamGenerateContent?alt=sse"), ALL, max_body=100)
    assert isinstance(verdict, Admitted)
    route = verdict.call.route
    assert (route.model, route.stream, route.sse, dict(route.query)) == ("g-1", True, True, {"alt": "sse"})


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (("proxyauth", "prefix", "header", "api_key"), ("from-auth", "proxyauth")),
        (("prefix", "proxyauth"), ("from-prefix", "prefix")),
        (("header",), ("from-header", "header")),
        (("api_key",), ("sk-key", "api_key")),
        ((), (UNATTRIBUTED, None)),
    ],
)
def test_the_session_comes_from_the_first_configured_source_that_has_one(sources, expected) -> None:
    a = arrival(
        "/s/from-prefix/v1/messages",
        headers={"x-api-key": "sk-key"},
        proxyauth_user="from-auth",
        header_session="from-header",
    )
    verdict = admit(a, sources, max_body=100)
    assert isinstance(verdict, Admitted)
    assert (verdict.session, verdict.source) == expected


def test_a_body_over_the_limit_is_refused_in_the_callers_format() -> None:
    verdict = admit(arrival("/v1/messages", body_length=101), ALL, max_body=100)
    assert isinstance(verdict, Refused) and verdict.status == 413
    # the real API's 413 type, which the SDK's error models do not list (tests/test_sdk_conformance.py allows it)
    body = json.loads(verdict.body)
    assert body["type"] == "error" and body["error"]["type"] == "request_too_large"
    assert "100 bytes" in body["error"]["message"]
    chat = admit(arrival("/v1/chat/completions", body_length=101), ALL, max_body=100)
    assert isinstance(chat, Refused) and chat.status == 413
    openai.types.ErrorObject.model_validate(json.loads(chat.body)["error"])
    # at the limit, or of unknown length (checked again once read), it is admitted
    assert isinstance(admit(arrival("/v1/messages", body_length=100), ALL, max_body=100), Admitted)
    assert isinstance(admit(arrival("/v1/messages"), ALL, max_body=100), Admitted)


@pytest.mark.parametrize(
    ("method", "target", "headers", "kind"),
    [
        ("POST", "/v1/messages/count_tokens", {}, CountTokens),
        ("GET", "/v1/models", {"anthropic-version": "2023-06-01"}, ModelList),
        ("GET", "/v1/responses", {"upgrade": "websocket"}, WebSocketRefused),
        ("POST", "/api/event_logging/batch", {}, LocalAnswer),
        ("GET", "/nowhere", {}, LocalAnswer),
    ],
)
def test_everything_else_is_answered_locally_whatever_its_size(method, target, headers, kind) -> None:
    verdict = admit(Arrival(method, target, headers, body_length=10**9), ALL, max_body=100)
    assert isinstance(verdict, Local) and isinstance(verdict.decision, kind)


@pytest.mark.parametrize(
    ("target", "headers", "fmt"),
    [
        ("/v1/messages", {}, "anthropic"),
        ("/v1beta/models/g:generateContent", {}, "gemini"),
        ("/v1/models", {"anthropic-version": "2023-06-01"}, "anthropic"),
        ("/api/telemetry", {"x-goog-api-client": "genai-js"}, "gemini"),
        ("/v1/chat/completions", {}, "chat"),
    ],
)
def test_unavailable_is_a_503_with_retry_after_in_the_format_the_request_implies(target, headers, fmt) -> None:
    refused = unavailable(Arrival("POST", target, headers), "the proxy is starting", retry_after=1.0)
    assert refused.status == 503 and refused.headers.get("retry-after") == "1"
    body = json.loads(refused.body)
    if fmt == "anthropic":
        assert anthropic.types.ErrorResponse.model_validate(body).error.message == "the proxy is starting"
    elif fmt == "gemini":
        assert body["error"]["code"] == 503 and body["error"]["status"] == "UNAVAILABLE"
    else:
        assert openai.types.ErrorObject.model_validate(body["error"]).message == "the proxy is starting"

"""Fuzzing: every request parser, stream encoder, the engine-stream reader, the output parser and the router take
arbitrary input without an unexpected exception (hypothesis); and a corpus of malformed requests sent through a real
mitmdump + capture proxy (against the fake engine) gets a vendor-shaped 4xx for every format, quickly.

Short form (``make test``): a few hundred examples per property. The long form is ``benchmarks/fuzz.py``, which
runs the same properties with many more examples (``HARNESSRL_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon import launch
from addon.engine.client import EngineError, stream_event_chunks
from addon.generation.parser import OutputParser
from addon.serving.routes import (
    CountTokens,
    LocalAnswer,
    ModelCall,
    ModelList,
    WebSocketRefused,
    classify,
    split_session_prefix,
)
from benchmarks import fake_engine
from benchmarks.faults import vendor_shaped
from benchmarks.sessions import FORMATS, HOST, Conversation, make_script, path_for
from converters import dialect_for
from converters.base import Route, WireFormat
from converters.canonical import (
    ConversionError,
    Finish,
    ModelRequest,
    ReasoningDelta,
    StreamStart,
    TextDelta,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
)

EXAMPLES = int(os.environ.get("HARNESSRL_FUZZ_EXAMPLES", "150"))
# The short form (make test) is derandomized so CI is repeatable; the long form (make bench) explores at random.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="HARNESSRL_FUZZ_EXAMPLES" not in os.environ,
)

ROUTES: dict[str, Route] = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini": Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=True),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=25,
)


def _valid_body(format: str) -> dict[str, Any]:
    conv = Conversation(make_script(3, 0, format, calls=3, scale=0.02))  # type: ignore[arg-type]
    return dialect_for(format).render_request(conv.request())  # type: ignore[arg-type]


VALID = {f: _valid_body(f) for f in FORMATS}


def _mutate(obj: Any, path: list[int], value: Any) -> Any:
    """Replace the node reached by following ``path`` (indices into keys/items, modulo their count) with ``value``."""
    if not path or not isinstance(obj, dict | list) or not obj:
        return value
    if isinstance(obj, dict):
        key = sorted(obj)[path[0] % len(obj)]
        return {**obj, key: _mutate(obj[key], path[1:], value)}
    i = path[0] % len(obj)
    return [*obj[:i], _mutate(obj[i], path[1:], value), *obj[i + 1 :]]


def _parses_or_400(format: str, body: Any) -> None:
    body = body if isinstance(body, bytes) else json.dumps(body).encode()  # the proxy always hands over bytes
    try:
        result = dialect_for(format).parse_request(body, ROUTES[format], {})  # type: ignore[arg-type]
    except ConversionError as e:
        assert 400 <= e.status < 500, e
        return
    assert isinstance(result, ModelRequest)


@pytest.mark.parametrize("format", FORMATS)
@FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=6), value=json_values)
def test_parsers_take_any_mutation_of_a_valid_body(format: str, path: list[int], value: Any) -> None:
    _parses_or_400(format, _mutate(VALID[format], path, value))


@pytest.mark.parametrize("format", FORMATS)
@FUZZ
@given(body=st.dictionaries(st.text(max_size=12), json_values, max_size=6) | st.binary(max_size=200))
def test_parsers_take_arbitrary_bodies(format: str, body: Any) -> None:
    _parses_or_400(format, body if isinstance(body, bytes) else json.dumps(body).encode())


_events = st.one_of(
    st.builds(TextDelta, st.text(max_size=20)),
    st.builds(ReasoningDelta, st.text(max_size=20)),
    st.builds(ToolCallStarted, st.integers(0, 2), st.text(max_size=8), st.text(min_size=1, max_size=8)),
    st.builds(ToolCallDelta, st.integers(0, 2), st.text(max_size=20)),
    st.builds(ToolCallEnded, st.integers(0, 2)),
    st.builds(Finish, st.sampled_from(["stop", "length", "tool_calls", "error"]), st.builds(Usage)),
)


@pytest.mark.parametrize("format", FORMATS)
@FUZZ
@given(events=st.lists(_events, max_size=12))
def test_stream_encoders_emit_bytes_or_refuse_impossible_orders(format: str, events: list[Any]) -> None:
    encoder = dialect_for(format).stream_encoder(ROUTES[format], None)  # type: ignore[arg-type]
    out = [encoder.feed(StreamStart("id", "m", 0, 3))]
    try:
        out += [encoder.feed(e) for e in events]
    except ValueError:
        pass  # an impossible order is refused by contract
    try:
        out.append(encoder.error(ConversionError("overloaded", "x")))
    except ValueError:
        pass  # so is an error after the stream finished
    assert all(isinstance(b, bytes) for b in out)


@FUZZ
@given(data=json_values.map(json.dumps) | st.text(max_size=80))
def test_engine_stream_events_parse_or_raise_engine_errors(data: str) -> None:
    try:
        stream_event_chunks(data)
    except EngineError:
        pass


@FUZZ
@given(
    chunks=st.lists(
        st.sampled_from(["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "f"', "x"])
        | st.text(max_size=10),
        max_size=20,
    )
)
def test_output_parser_takes_any_text(chunks: list[str]) -> None:
    parser = OutputParser(allowed={"f": "function"})
    for c in chunks:
        parser.feed(c)
    parser.finish("stop", Usage(1, len(chunks)))


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    path=st.text(max_size=60),
    query=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)
def test_router_classifies_any_path(method: str, path: str, query: dict[str, str]) -> None:
    session, rest = split_session_prefix("/" + path)
    if session is not None:  # the prefix is taken off whole, and what is left is still a path
        assert ("/" + path) == f"/s/{session}{rest}" and rest.startswith("/")
    decision = classify(method, rest, query, {"upgrade": "websocket"} if "ws" in path else {})
    if isinstance(decision, ModelCall | CountTokens):  # only a POST generates or counts, in a known format
        assert method == "POST" and decision.route.format in get_args(WireFormat)
        assert dict(decision.route.query) == query
    elif isinstance(decision, WebSocketRefused | ModelList):
        assert method == "GET"
    else:
        assert isinstance(decision, LocalAnswer) and decision.status in (200, 404) and decision.reason


# ------------------------------------------------------------------------------------------ through the real proxy

_BIG = 100 * 1024 * 1024


def _corpus(format: str) -> dict[str, bytes]:
    valid = json.dumps(VALID[format]).encode()
    return {
        "bad_json": b'{"model": "m", "messages": [',
        "not_object": b"[1, 2, 3]",
        "wrong_types": json.dumps({**VALID[format], "tools": "oops"}).encode(),  # tools must be an array
        "huge_number": valid[:-1] + b', "max_tokens": ' + b"9" * 5000 + b"}",
        "nan": valid[:-1] + b', "temperature": NaN}',
        "invalid_utf8": valid[:20] + b"\xff\xfe" + valid[20:],
        "deep_nesting": b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        "truncated": valid[: len(valid) // 2],
        "empty": b"",
        "100mb": b'{"model": "m", "pad": "' + b"x" * _BIG + b'"}',
    }


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path):
    engine = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port())
    work = tmp_path_factory.mktemp("fuzz-proxy")
    handle = launch.start(
        launch.ProxyConfig(engine.url, work, options=(f"harnessrl_model_dir={smollm2_tokenizer_dir}",))
    )
    try:
        yield handle
    finally:
        handle.stop()
        engine.stop()


@pytest.mark.parametrize("format", FORMATS)
def test_malformed_corpus_gets_vendor_shaped_4xx_through_the_proxy(proxy: launch.ProxyHandle, format: str) -> None:
    failures: list[str] = []
    with httpx.Client(proxy=proxy.url(f"fuzz-{format}"), verify=proxy.ssl_context(), timeout=60) as client:
        for name, body in _corpus(format).items():
            t0 = time.monotonic()
            r = client.post(
                f"https://{HOST[format]}{path_for(format)}", content=body, headers={"content-type": "application/json"}
            )
            took = time.monotonic() - t0
            if not (400 <= r.status_code < 500 and vendor_shaped(format, r.text) and took < 30):
                failures.append(f"{name}: {r.status_code} in {took:.1f}s {r.text[:200]!r}")
        # the proxy is still healthy afterwards: a valid call completes
        ok = client.post(f"https://{HOST[format]}{path_for(format)}", content=json.dumps(VALID[format]).encode())
        assert ok.status_code == 200, ok.text[:300]
    assert not failures, failures

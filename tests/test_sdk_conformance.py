"""Strict SDK conformance: every answer the proxy renders validates against the installed SDKs' own models.

Contract
--------
For each wire format this module drives the dialect's real code path over one corpus of canonical completions
(plain text, reasoning, one tool call, several, text + tool call, a length cut, a stop-sequence finish, content
filter, an error finish, an empty answer, a custom tool call where the format has them) and every ``ErrorKind``:
``dialect_for(fmt).render_completion`` for bodies, ``stream_encoder(route, request)`` fed canonical events (deltas
split into small pieces) for streams, whose bytes are parsed back into events, ``render_error`` for error bodies and
``StreamEncoder.error`` for in-stream errors (before the start and mid-stream). Every body and every stream event
is validated with the SDK's pydantic model:

* openai: ``ChatCompletion``, ``ChatCompletionChunk``, ``Response`` and each Responses stream event by its own
  class (found from its ``type`` in the ``ResponseStreamEvent`` union); an error's ``error`` object as
  ``openai.types.ErrorObject`` (``APIError`` reads the body's ``error``, and in a stream ``data["error"]``).
* anthropic: ``Message``, each ``RawMessageStreamEvent`` class by ``type``, ``ErrorResponse`` for error bodies and
  ``event: error``.
* google-genai: ``GenerateContentResponse`` for the body and each stream element (SSE and JSON array); errors,
  for which the SDK has no model, by :class:`GoogleStatus` (the ``google.rpc.Status`` JSON that
  ``errors.APIError`` reads: ``error.code``, ``error.message``, ``error.status``) and by the SDK's own
  ``APIError.raise_error``, which must raise the client/server class carrying those values.

Strictness, decided per SDK. The clients themselves never validate: openai and anthropic build response models
with ``construct`` (a missing required field passes silently, which is how issue 15's missing
``cache_write_tokens`` went unseen), and google-genai's ``_from_response`` drops unknown keys first. So
:func:`validate` validates each object itself, as the JSON it is on the wire, in pydantic's strict mode
(``Model.model_validate_json(text, strict=True)``: ``model_validate`` without the lax coercions, so ``"5"`` is
not an integer; JSON strings still fill enums):

* openai / anthropic: pydantic raises on a missing required field, a wrong type or a value outside a ``Literal``.
  Unknown keys are allowed (the models say ``extra="allow"``), as the SDKs allow them.
* google-genai: every field is optional, so required fields cannot be missing; its models say ``extra="forbid"``,
  so validating the raw camelCase wire JSON (the models alias every field to camelCase) raises on a wrong type and
  on a misspelt or unknown key, which the SDK would silently drop. The result must also equal what the SDK's own
  parse path (``_GenerateContentResponse_from_mldev`` then ``_from_response``) makes of the same JSON.

``test_validation_is_strict`` breaks one rendered object per model (a required key deleted, an unknown key
added, a wrong value) and requires the same judge to raise, so the corpus tests fail when a new SDK release adds
a required field (``make test-sdk-latest`` runs this module against the newest releases).

Known gaps (:data:`KNOWN_GAPS`): values the proxy sends on purpose that an SDK's model does not list, each with
its reason. A gap excuses exactly those values at one location of one model; any other error still fails.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated, Any, get_args

import anthropic.types as anthropic_types
import pydantic
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from google.genai.models import _GenerateContentResponse_from_mldev
from openai.types import ErrorObject
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseFailedEvent, ResponseStreamEvent

from converters import dialect_for
from converters.base import Route
from converters.canonical import (
    Completion,
    ConversionError,
    ErrorKind,
    FinishReason,
    Message,
    ModelRequest,
    ReasoningDelta,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    Usage,
    WireFormat,
    completion_events,
)

Obj = dict[str, Any]
Model = type[pydantic.BaseModel]

# --------------------------------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class KnownGap:
    """Values the proxy sends at ``loc`` (a pydantic error location, ``fnmatch`` pattern) that ``model`` lacks."""

    model: Model
    loc: str
    values: frozenset[str]
    why: str


KNOWN_GAPS: tuple[KnownGap, ...] = (
    KnownGap(
        ResponseFailedEvent,
        "response.error.code",
        frozenset(
            "invalid_request_error invalid_api_key permission_denied model_not_found request_too_large "
            "context_length_exceeded service_unavailable server_is_overloaded timeout".split()
        ),
        "the SDK's Literal lists only the documented response.error codes; the live API sends more and Codex acts "
        "on them (context_length_exceeded, server_is_overloaded), so response.failed carries the HTTP error's code",
    ),
    KnownGap(
        ChatCompletionChunk,
        "choices.*.delta.tool_calls.*.type",
        frozenset({"custom"}),
        "ChoiceDeltaToolCall.type is Literal['function'], although the API streams custom tool calls and the "
        "non-streamed ChatCompletion models them (docs/wire-formats.md: known SDK limit)",
    ),
    KnownGap(
        anthropic_types.ErrorResponse,
        "error.*.type",
        frozenset({"request_too_large"}),
        "Anthropic documents 413 request_too_large; the SDK has ContentTooLargeError for the status but its "
        "ErrorResponse union has no object for that type",
    ),
)


def _excused(model: Model, error: Any) -> bool:
    loc = ".".join(str(part) for part in error["loc"])
    return any(
        gap.model is model
        and fnmatch.fnmatchcase(loc, gap.loc)
        and error["type"] == "literal_error"
        and error.get("input") in gap.values
        for gap in KNOWN_GAPS
    )


def validate(model: Model, obj: Any) -> pydantic.BaseModel:
    """``obj`` validated as wire JSON by ``model`` in strict mode; ``ValidationError`` unless every error is a
    known gap."""
    try:
        return model.model_validate_json(json.dumps(obj), strict=True)
    except pydantic.ValidationError as e:
        if all(_excused(model, err) for err in e.errors()):
            return model.model_construct(**obj)
        raise


def classes_by_type(union: Any) -> dict[str, Model]:
    """Each member class of an SDK event union, keyed by its ``type`` literal (the union's discriminator)."""
    members = get_args(union)
    if typing.get_origin(union) is Annotated:  # Annotated[Union[...], PropertyInfo(discriminator="type")]
        members = get_args(members[0])
    table: dict[str, Model] = {}
    for cls in members:
        for literal in get_args(cls.model_fields["type"].annotation):
            table[literal] = cls
    return table


RESPONSES_EVENTS = classes_by_type(ResponseStreamEvent)
ANTHROPIC_EVENTS = classes_by_type(anthropic_types.RawMessageStreamEvent)


class GoogleStatus(pydantic.BaseModel):
    """``google.rpc.Status`` as JSON: what ``google.genai.errors.APIError`` reads (the SDK has no model)."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    code: int
    message: str
    status: str
    details: list[dict[str, Any]] | None = None


class GoogleError(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    error: GoogleStatus


# --------------------------------------------------------------------------------------------------- judges


def judge_gemini_response(obj: Obj) -> None:
    validated = validate(genai_types.GenerateContentResponse, obj)
    # The SDK's own path (renaming, then dropping keys it does not know) must see every field we sent.
    sdk = genai_types.GenerateContentResponse._from_response(
        response=_GenerateContentResponse_from_mldev(copy.deepcopy(obj)), kwargs={}
    )
    assert sdk == validated


def judge_body(fmt: WireFormat, body: Obj) -> None:
    match fmt:
        case "chat":
            validate(ChatCompletion, body)
        case "responses":
            validate(Response, body)
        case "anthropic":
            validate(anthropic_types.Message, body)
        case "gemini":
            judge_gemini_response(body)


def judge_error_body(fmt: WireFormat, status: int, body: Obj) -> None:
    match fmt:
        case "chat" | "responses":
            assert set(body) == {"error"}
            validate(ErrorObject, body["error"])
        case "anthropic":
            validate(anthropic_types.ErrorResponse, body)
        case "gemini":
            judge_google_error(status, body)


def judge_google_error(status: int, body: Obj) -> None:
    wire = GoogleError.model_validate(body).error
    assert wire.code == status
    assert all(isinstance(detail.get("@type"), str) for detail in wire.details or []), "google.rpc details are typed"
    # In a stream the SDK raises with error.code as the status; for a body, with the HTTP status.
    with pytest.raises(genai_errors.APIError) as raised:
        genai_errors.APIError.raise_error(wire.code, body, None)
    expected = genai_errors.ClientError if status < 500 else genai_errors.ServerError
    assert type(raised.value) is expected
    assert (raised.value.code, raised.value.status, raised.value.message) == (status, wire.status, wire.message)


def judge_event(fmt: WireFormat, name: str | None, data: Obj) -> None:
    """One parsed stream event, by the class the SDK would give it."""
    match fmt:
        case "chat":
            if "error" in data:
                judge_error_body("chat", 0, data)
            else:
                validate(ChatCompletionChunk, data)
        case "responses":
            assert name == data["type"]
            validate(RESPONSES_EVENTS[data["type"]], data)
            if data["type"] == "error":  # the SDK raises APIError(body=data["error"])
                validate(ErrorObject, data["error"])
        case "anthropic":
            assert name == data["type"]
            model = anthropic_types.ErrorResponse if data["type"] == "error" else ANTHROPIC_EVENTS[data["type"]]
            validate(model, data)
        case "gemini":
            if "error" in data:
                judge_google_error(data["error"]["code"], data)
            else:
                judge_gemini_response(data)


# --------------------------------------------------------------------------------------------------- streams

DONE = "[DONE]"


def parse_stream(route: Route, data: bytes) -> list[tuple[str | None, Obj | str]]:
    """The stream's events as ``(event name, JSON data)``; chat's terminator stays the string ``[DONE]``."""
    if route.format == "gemini" and not route.sse:
        return [(None, element) for element in json.loads(data)]
    events: list[tuple[str | None, Obj | str]] = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        payload = fields["data"]
        events.append((fields.get("event"), payload if payload == DONE else json.loads(payload)))
    return events


def judge_stream(route: Route, data: bytes) -> list[tuple[str | None, Obj | str]]:
    events = parse_stream(route, data)
    assert events, "a stream sends at least one event"
    for i, (name, payload) in enumerate(events):
        if isinstance(payload, str):
            assert route.format == "chat" and i == len(events) - 1, "only chat ends with [DONE], and last"
        else:
            judge_event(route.format, name, payload)
    return events


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def fragmented(completion: Completion) -> Iterator[StreamEvent]:
    """``completion_events`` with every delta split into small pieces, as an engine streams them."""
    for event in completion_events(completion):
        if isinstance(event, TextDelta | ReasoningDelta):
            yield from (replace(event, text=p) for p in pieces(event.text))
        elif isinstance(event, ToolCallDelta):
            yield from (replace(event, arguments=p) for p in pieces(event.arguments))
        else:
            yield event


# --------------------------------------------------------------------------------------------------- corpus

ROUTES: dict[str, Route] = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini-sse": Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=True),
    "gemini-array": Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=False),
}
FORMATS: tuple[WireFormat, ...] = ("chat", "responses", "anthropic", "gemini")

CACHED = Usage(prompt_tokens=120, completion_tokens=37, cached_tokens=64, reasoning_tokens=11)
PLAIN = Usage(prompt_tokens=12, completion_tokens=7)

READ = ToolCall("call_1", "read_file", '{"path": "/tmp/ä.txt"}')
GREP = ToolCall("call_b", "grep", '{"pattern": "x", "opts": {"n": true, "k": [1, 2]}}')
LIST = ToolCall("call_c", "list_directory", "")  # no arguments at all
PATCH = ToolCall("call_x", "apply_patch", "*** Begin Patch\n*** End Patch", kind="custom")
CALLS: FinishReason = "tool_calls"

CORPUS: dict[str, Completion] = {
    "text": Completion("c-text", "m", text="Hello, wörld — ✓ done. 你好 🚀", usage=PLAIN, created=1700000000),
    "reasoning": Completion("c-think", "m", text="It is 4.", reasoning="2+2… is 4 🤔", usage=CACHED, created=1),
    "one tool": Completion("c-tool", "m", tool_calls=(READ,), finish_reason=CALLS, usage=CACHED),
    "several tools": Completion(
        "c-tools",
        "m",
        reasoning="two reads, a listing",
        tool_calls=(READ, GREP, LIST),
        finish_reason=CALLS,
        usage=CACHED,
    ),
    "text and tool": Completion("c-text-tool", "m", text="Let me look.", tool_calls=(GREP,), finish_reason=CALLS),
    "length": Completion("c-len", "m", text="cut sho", finish_reason="length", usage=Usage(5, 64)),
    # The canonical model carries no stop sequence: the engine stops before it and reports a plain "stop".
    "stop sequence": Completion("c-stop", "m", text="line one\n", finish_reason="stop", usage=PLAIN),
    "content filter": Completion("c-filter", "m", text="I can", finish_reason="content_filter", usage=PLAIN),
    "error finish": Completion("c-err", "m", text="partial", finish_reason="error", usage=PLAIN),
    "empty": Completion("c-empty", "m", usage=Usage(3, 1)),
    "custom tool": Completion("c-custom", "m", tool_calls=(PATCH,), finish_reason=CALLS, usage=PLAIN),
}
# Anthropic and Gemini have no free-text tools: a custom call cannot be rendered there.
ONLY_IN: dict[str, tuple[WireFormat, ...]] = {"custom tool": ("chat", "responses")}


def corpus_cases() -> Iterator[tuple[WireFormat, str]]:
    for name in CORPUS:
        for fmt in ONLY_IN.get(name, FORMATS):
            yield fmt, name


def stream_cases() -> Iterator[tuple[str, str]]:
    for fmt, name in corpus_cases():
        for route in ROUTES:
            if route.startswith(fmt):
                yield route, name


def stream_request(route: Route) -> ModelRequest:
    """A streaming request; include_usage makes chat send its usage chunk too."""
    messages = (Message("user", (TextPart("hi"),)),)
    return ModelRequest(route.format, "m", messages, stream=True, include_usage=True)


def encode(route: Route, events: list[StreamEvent], error: ConversionError | None = None) -> bytes:
    encoder = dialect_for(route.format).stream_encoder(route, stream_request(route))
    data = b"".join(encoder.feed(e) for e in events)
    return data + (encoder.error(error) if error is not None else b"")


ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
RETRYABLE: frozenset[ErrorKind] = frozenset({"rate_limited", "unavailable", "overloaded"})


def conversion_error(kind: ErrorKind) -> ConversionError:
    message = {
        "context_length": "prompt has 9000 tokens > 8192 maximum",
        "invalid_request": "messages.0.role: expected one of user, assistant",
    }.get(kind, f"{kind} for the test")
    param = "messages" if kind == "invalid_request" else None
    return ConversionError(kind, message, param=param, retry_after=2.5 if kind in RETRYABLE else None)


# --------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize(("fmt", "name"), list(corpus_cases()))
def test_body_conforms(fmt: WireFormat, name: str) -> None:
    judge_body(fmt, dialect_for(fmt).render_completion(CORPUS[name]))


@pytest.mark.parametrize(("route", "name"), list(stream_cases()))
def test_stream_conforms(route: str, name: str) -> None:
    completion = CORPUS[name]
    events = judge_stream(ROUTES[route], encode(ROUTES[route], list(fragmented(completion))))
    last = events[-1][1]
    match ROUTES[route].format:  # the stream was complete: its terminal event came last
        case "chat":
            assert last == DONE
        case "responses":
            assert isinstance(last, dict)
            ending = "response.failed" if completion.finish_reason == "error" else "response.completed"
            assert last["type"] == ending
        case "anthropic":
            assert isinstance(last, dict) and last["type"] == "message_stop"
        case "gemini":
            assert isinstance(last, dict) and last["candidates"][0]["finishReason"]


@pytest.mark.parametrize("kind", ERROR_KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_error_body_conforms(fmt: WireFormat, kind: ErrorKind) -> None:
    answer = dialect_for(fmt).render_error(conversion_error(kind))
    judge_error_body(fmt, answer.status, json.loads(answer.body))


@pytest.mark.parametrize("started", [False, True], ids=["before start", "mid-stream"])
@pytest.mark.parametrize("kind", ERROR_KINDS)
@pytest.mark.parametrize("route", list(ROUTES))
def test_stream_error_conforms(route: str, kind: ErrorKind, started: bool) -> None:
    before: list[StreamEvent] = [StreamStart("c-fail", "m", 0, 9), TextDelta("partial ")] if started else []
    events = judge_stream(ROUTES[route], encode(ROUTES[route], before, conversion_error(kind)))
    last = events[-1][1]
    assert isinstance(last, dict) and ("error" in last or last.get("type") == "error"), "the error ends the stream"
    if ROUTES[route].format == "gemini":  # the SDK raises with error.code as the status: it must be the HTTP one
        assert last["error"]["code"] == dialect_for("gemini").render_error(conversion_error(kind)).status


def test_responses_usage_reports_no_cache_writes() -> None:
    """Issue 15: openai >= 3 requires input_tokens_details.cache_write_tokens; the proxy writes no cache."""
    body = validate(Response, dialect_for("responses").render_completion(CORPUS["reasoning"]))
    assert isinstance(body, Response) and body.usage is not None
    details = body.usage.input_tokens_details
    assert (details.cached_tokens, details.cache_write_tokens) == (64, 0)


# --------------------------------------------------------------------------------------------------- strictness


def _body(fmt: WireFormat) -> Callable[[], Obj]:
    return lambda: dialect_for(fmt).render_completion(CORPUS["reasoning"])


def _event(route: str, wanted: str) -> Callable[[], Obj]:
    """The first event of type (chat: object) ``wanted`` in a stream of the reasoning completion."""

    def first() -> Obj:
        data = encode(ROUTES[route], completion_events(CORPUS["reasoning"]))
        events = [e for _, e in parse_stream(ROUTES[route], data) if isinstance(e, dict)]
        return next(e for e in events if e.get("type", e.get("object")) == wanted)

    return first


def _error(fmt: WireFormat, kind: ErrorKind = "rate_limited") -> Obj:
    return json.loads(dialect_for(fmt).render_error(conversion_error(kind)).body)


def _failed_event(kind: ErrorKind = "context_length") -> Obj:
    data = encode(ROUTES["responses"], [StreamStart("c", "m", 0)], conversion_error(kind))
    return next(
        e for _, e in parse_stream(ROUTES["responses"], data) if isinstance(e, dict) and e["type"] == "response.failed"
    )


DELETE = object()


@dataclass(frozen=True)
class Breakage:
    """A rendered object that passes ``judge``, and one place where breaking it must make ``judge`` raise."""

    judge: Callable[[Obj], None]
    original: Callable[[], Obj]
    path: tuple[str | int, ...]
    value: Any = DELETE


BREAKAGES: dict[str, Breakage] = {
    "responses body without cache_write_tokens": Breakage(
        partial(judge_body, "responses"), _body("responses"), ("usage", "input_tokens_details", "cache_write_tokens")
    ),
    "responses event without sequence_number": Breakage(
        partial(judge_event, "responses", "response.created"),
        _event("responses", "response.created"),
        ("sequence_number",),
    ),
    "response.failed with a code no gap excuses": Breakage(
        partial(judge_event, "responses", "response.failed"), _failed_event, ("response", "error", "code"), "made_up"
    ),
    "chat body without created": Breakage(partial(judge_body, "chat"), _body("chat"), ("created",)),
    "chat body with created as a string (lax mode would coerce it)": Breakage(
        partial(judge_body, "chat"), _body("chat"), ("created",), "1700000000"
    ),
    "chat chunk without choices.0.index": Breakage(
        partial(judge_event, "chat", None), _event("chat", "chat.completion.chunk"), ("choices", 0, "index")
    ),
    "openai error without message": Breakage(
        partial(judge_error_body, "chat", 429), partial(_error, "chat"), ("error", "message")
    ),
    "anthropic body without usage.output_tokens": Breakage(
        partial(judge_body, "anthropic"), _body("anthropic"), ("usage", "output_tokens")
    ),
    "anthropic message_delta without usage": Breakage(
        partial(judge_event, "anthropic", "message_delta"), _event("anthropic", "message_delta"), ("usage",)
    ),
    "anthropic error without error.message": Breakage(
        partial(judge_error_body, "anthropic", 429), partial(_error, "anthropic"), ("error", "message")
    ),
    "gemini body with an unknown key": Breakage(
        partial(judge_body, "gemini"), _body("gemini"), ("candidates", 0, "finishReasonn"), "STOP"
    ),
    "gemini body with a wrong type": Breakage(
        partial(judge_body, "gemini"), _body("gemini"), ("usageMetadata", "promptTokenCount"), "many"
    ),
    "gemini error without status": Breakage(
        partial(judge_error_body, "gemini", 429), partial(_error, "gemini"), ("error", "status")
    ),
}


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_validation_is_strict(name: str) -> None:
    """The judge passes the rendered object and rejects it broken in one place: a required key deleted, an unknown
    key added or a wrong value. So a required field a new SDK release adds fails the corpus tests above."""
    case = BREAKAGES[name]
    original = case.original()
    case.judge(original)
    broken = copy.deepcopy(original)
    node: Any = broken
    for key in case.path[:-1]:
        node = node[key]
    if case.value is DELETE:
        del node[case.path[-1]]
    else:
        node[case.path[-1]] = case.value
    with pytest.raises(pydantic.ValidationError):
        case.judge(broken)


def test_known_gaps_are_what_the_proxy_sends() -> None:
    """Each gap excuses exactly values the proxy renders, so the list cannot grow past what it must cover."""
    gaps = {gap.model: gap.values for gap in KNOWN_GAPS}
    failed_codes = {_failed_event(kind)["response"]["error"]["code"] for kind in ERROR_KINDS}
    assert gaps[ResponseFailedEvent] == failed_codes - {"server_error", "rate_limit_exceeded"}  # those two are listed
    anthropic_types_sent = {_error("anthropic", kind)["error"]["type"] for kind in ERROR_KINDS}
    assert gaps[anthropic_types.ErrorResponse] <= anthropic_types_sent
    custom = encode(ROUTES["chat"], completion_events(CORPUS["custom tool"]))
    sent = {
        call.get("type")
        for _, chunk in parse_stream(ROUTES["chat"], custom)
        if isinstance(chunk, dict)
        for choice in chunk.get("choices", [])
        for call in choice["delta"].get("tool_calls", [])
    }
    assert gaps[ChatCompletionChunk] <= sent
    assert all(gap.why for gap in KNOWN_GAPS)

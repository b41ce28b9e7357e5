"""vLLM's completions protocol as this project speaks it: request payloads, typed results, the error hierarchy,
and the parsers of bodies and stream events. Sans-IO: bytes and objects in, typed values out; no sockets.

Contract
--------
* :func:`completion_payload` / :func:`completion_body`: a :class:`GenerationRequest` as ``POST /v1/completions``
  JSON: ``prompt`` = token ids, ``return_token_ids``, ``logprobs: 0`` (the sampled token's own logprob), the
  sampling fields, and at most one structured-output constraint (:class:`JsonSchema`, :class:`Regex`,
  :class:`Choice`, :class:`Grammar`).
* :func:`parse_choice` / :func:`stream_event_chunks` / :func:`parse_completion`: one choice, one SSE ``data:``
  payload, or one non-streamed body -> :class:`GenerationChunk` s / a :class:`GenerationResult`; ids and logprobs
  must agree in length or :class:`MalformedResponse` is raised. A ``null`` logprob (vLLM's JSON for a non-finite
  value) becomes :data:`MISSING_LOGPROB` (NaN), never a made-up number. :func:`accumulate` folds chunks into the
  result a non-streamed call would give; :func:`coalesce` merges the chunks of one network read.
* :func:`error_from_body`: an engine error body -> the hierarchy :class:`EngineError` > :class:`EngineUnavailable`,
  :class:`EngineTimeout` > :class:`EngineConnectTimeout`, :class:`BadRequest` > :class:`ContextTooLong`,
  :class:`MalformedResponse`.

:mod:`addon.engine.client` does the I/O with these and re-exports them, so callers import from one place.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from addon.records import token_ids

EngineFinishReason = Literal["stop", "length", "abort", "error", "repetition"]
ENGINE_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "abort", "error", "repetition"})
PauseMode = Literal["abort", "wait", "keep"]


# --- structured outputs (vLLM's `structured_outputs` request field; one kind per request) ---------------------


@dataclass(frozen=True)
class JsonSchema:
    schema: Mapping[str, Any] = field(hash=False)  # a dict is not hashable; equality still compares it
    kind: Literal["json"] = field(default="json", init=False)


@dataclass(frozen=True)
class Regex:
    pattern: str
    kind: Literal["regex"] = field(default="regex", init=False)


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]
    kind: Literal["choice"] = field(default="choice", init=False)


@dataclass(frozen=True)
class Grammar:
    ebnf: str
    kind: Literal["grammar"] = field(default="grammar", init=False)


StructuredOutput = JsonSchema | Regex | Choice | Grammar


def _structured_payload(s: StructuredOutput) -> dict[str, Any]:
    match s:
        case JsonSchema():
            return {"json": dict(s.schema)}
        case Regex():
            return {"regex": s.pattern}
        case Choice():
            return {"choice": list(s.options)}
        case Grammar():
            return {"grammar": s.ebnf}


# --- requests and results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    """One sampling call. ``top_k=0`` and ``min_p=0`` disable those filters (vLLM's neutral values)."""

    prompt_ids: Sequence[int]  # a tuple, or the session graph's packed ``array('i')`` (read-only)
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    structured: StructuredOutput | None = None
    ignore_eos: bool = False
    model: str | None = None  # None: the served base model; a LoRA adapter's name samples with that adapter
    # Streams only: vLLM sends the first token at once, then every ``stream_interval`` tokens (and the rest at the
    # end), so everything downstream handles one event per N tokens. vLLM clamps it up to its --stream-interval.
    stream_interval: int = 1
    # The prompt's JSON list when the caller already has it (the generator builds it off the event loop, from the
    # session's previous prompt: token_ids.JsonIds.extending); None: formatted here when the body is made
    prompt_json: token_ids.JsonIds | None = field(default=None, repr=False, compare=False)
    _packed: array[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        # packed once, checked in C: a Python pass over 10^5 ids cost ~5 ms per call on the event loop
        object.__setattr__(self, "_packed", token_ids.pack(self.prompt_ids, "prompt_ids"))
        if self.prompt_json is not None and not (
            isinstance(self.prompt_json, token_ids.JsonIds) and self.prompt_json.lists(self._packed)
        ):
            raise ValueError("prompt_json must be a token_ids.JsonIds of prompt_ids")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {self.stream_interval}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")


@dataclass(frozen=True)
class EngineUsage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class GenerationChunk:
    """New tokens since the previous chunk. The last chunk of a choice has ``finish_reason`` set."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: EngineFinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id or string that ended it; None for EOS/length
    usage: EngineUsage | None = None


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: EngineFinishReason
    stop_reason: int | str | None
    usage: EngineUsage


@dataclass(frozen=True)
class ModelInfo:
    id: str
    root: str
    max_model_len: int | None
    parent: str | None  # set for a LoRA adapter: the base model


@dataclass(frozen=True)
class ReloadResult:
    version: str
    seconds: float


@dataclass(frozen=True)
class ClientTimeouts:
    # The connect budget is timed on the proxy's event loop, which every call of the process shares: at 384 sessions
    # on a loaded 2-core machine it ran up to 5-12 s late (benchmarks/soak.py, "loop" in the admin stats) while the
    # engine's accept queue held at most 3 connections, so 5 s failed connects the kernel had completed at once.
    # A refused connection (engine down) fails at once whatever this is; it only bounds an unreachable host.
    connect: float = 30.0
    generate: float = 600.0  # a whole non-streamed completion, or the gap between two streamed chunks
    control: float = 300.0  # pause/reload/resume and the other control endpoints


# Concurrent requests to the engine per client (one client per proxy process). httpx's default pool of 100 silently
# queued every call past the 100th inside the proxy (found by benchmarks/side_by_side.py at 192+ sessions), while
# vLLM batches hundreds; the engine, not this pool, is what should bound concurrency.
MAX_ENGINE_CONNECTIONS = 4096


# A sampled token whose logprob the engine did not give (JSON null): kept as NaN, never as a made-up number.
MISSING_LOGPROB: Final = math.nan


# --- errors -------------------------------------------------------------------------------------------------


class EngineError(Exception):
    """Anything that went wrong talking to the engine. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class EngineUnavailable(EngineError):
    """The engine cannot be reached: connection refused, or the connection dropped mid-response."""


class EngineTimeout(EngineError):
    """The engine did not answer within the configured timeout."""


class EngineConnectTimeout(EngineTimeout):
    """No connection to the engine within the connect timeout: nothing was sent, so the call may go elsewhere."""


class BadRequest(EngineError):
    """The engine rejected the request (HTTP 4xx). ``param`` names the offending field when vLLM says so."""

    def __init__(self, message: str, status: int | None = 400, param: str | None = None) -> None:
        super().__init__(message, status)
        self.param = param


class ContextTooLong(BadRequest):
    """The prompt does not fit the model's context. Numbers are parsed from vLLM's message when present."""

    def __init__(
        self, message: str, max_context: int | None, prompt_tokens: int | None, param: str | None = None
    ) -> None:
        super().__init__(message, 400, param)
        self.max_context = max_context
        self.prompt_tokens = prompt_tokens


class MalformedResponse(EngineError):
    """The engine answered, but not in the shape this client relies on (e.g. ids and logprobs disagree)."""


# --- wire helpers ---------------------------------------------------------------------------------------------

_JSON_HEADERS = {"content-type": "application/json"}
_MAX_CONTEXT = re.compile(r"maximum context length is (\d+)")
_PROMPT_TOKENS = re.compile(r"contains (?:at least )?(\d+) input tokens")


def completion_payload(req: GenerationRequest, stream: bool, *, with_prompt: bool = True) -> dict[str, Any]:
    payload: dict[str, Any] = {"prompt": list(req.prompt_ids)} if with_prompt else {}
    payload |= {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "logprobs": 0,
        "return_token_ids": True,
        "stream": stream,
    }
    if req.model is not None:
        payload["model"] = req.model
    if req.stop_token_ids:
        payload["stop_token_ids"] = list(req.stop_token_ids)
    if req.seed is not None:
        payload["seed"] = req.seed
    if req.structured is not None:
        payload["structured_outputs"] = _structured_payload(req.structured)
    if req.ignore_eos:
        payload["ignore_eos"] = True
    if stream:
        payload["stream_options"] = {"include_usage": True}
        if req.stream_interval > 1:
            payload["stream_interval"] = req.stream_interval
    return payload


def completion_body(req: GenerationRequest, stream: bool) -> bytes:
    """:func:`completion_payload` as the request body: the prompt ids are written by :func:`token_ids.json_list`
    (``json.dumps`` of 10^5 ints was the largest single cost of a call on the event loop)."""
    payload = completion_payload(req, stream, with_prompt=False)
    rest = json.dumps(payload, separators=(",", ":")).encode()
    prompt = req.prompt_json.data if req.prompt_json is not None else token_ids.json_bytes(req._packed)
    # one copy of the prompt's list: a str concatenation and its encode made four, ~0.8 ms at 131k ids on the loop
    return b"".join((b'{"prompt":', prompt, b",", memoryview(rest)[1:]))


def error_from_body(status: int, body: bytes | str) -> EngineError:
    """Map a vLLM error response (``{"error": {"message", "type", "param", "code"}}``) to the error hierarchy."""
    message, param = _error_fields(body)
    if "maximum context length" in message:
        return ContextTooLong(message, _int_match(_MAX_CONTEXT, message), _int_match(_PROMPT_TOKENS, message), param)
    if 400 <= status < 500:
        return BadRequest(message, status, param)
    return EngineError(f"engine error {status}: {message}", status)


def _error_fields(body: bytes | str) -> tuple[str, str | None]:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip() or "(empty body)", None
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        message = err.get("message") or err.get("detail") or json.dumps(err)
        param = err.get("param")
        return str(message), param if isinstance(param, str) else None
    return str(err), None


def _int_match(pattern: re.Pattern[str], text: str) -> int | None:
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def parse_choice(choice: Any) -> GenerationChunk:
    """One ``choices[i]`` of a completion or stream chunk -> a chunk (a whole completion is one big chunk)."""
    if not isinstance(choice, dict):
        raise MalformedResponse(f"choice is not an object: {choice!r}")
    ids = choice.get("token_ids")
    if ids is None:
        ids = []  # vLLM sends null when a chunk carries no new token (e.g. a finish-only chunk)
    logprobs_obj = choice.get("logprobs")
    lps = (logprobs_obj or {}).get("token_logprobs") if isinstance(logprobs_obj, dict) else None
    lps = [] if lps is None and not ids else lps
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise MalformedResponse(f"token_ids is not a list of ints: {ids!r}")
    if not isinstance(lps, list) or len(lps) != len(ids):
        raise MalformedResponse(f"{len(ids)} token ids but logprobs {lps!r}; is `logprobs: 0` honoured?")
    if not all(x is None or (isinstance(x, int | float) and not isinstance(x, bool)) for x in lps):
        raise MalformedResponse(f"a sampled token's logprob is not a number: {lps!r}")
    finish = choice.get("finish_reason")
    if finish is not None and finish not in ENGINE_FINISH_REASONS:
        raise MalformedResponse(f"unknown finish_reason {finish!r}")
    text = choice.get("text", "")
    if not isinstance(text, str):
        raise MalformedResponse(f"text is not a string: {text!r}")
    # vLLM serialises a non-finite logprob as null (pydantic writes NaN as null). The token was still sampled and
    # sent to the client, so it is kept, with NaN standing for "no logprob" (records and trainer mask it).
    logprobs = tuple(MISSING_LOGPROB if x is None else float(x) for x in lps)
    return GenerationChunk(tuple(ids), logprobs, text, finish, choice.get("stop_reason"))


def parse_usage(obj: Any) -> EngineUsage:
    if not isinstance(obj, dict):
        raise MalformedResponse(f"usage is missing or not an object: {obj!r}")
    try:
        return EngineUsage(int(obj["prompt_tokens"]), int(obj["completion_tokens"]))
    except (KeyError, TypeError, ValueError) as e:
        raise MalformedResponse(f"usage lacks token counts: {obj!r}") from e


def parse_completion(obj: Any, prompt_ids: tuple[int, ...]) -> GenerationResult:
    """A non-streamed ``/v1/completions`` body (``n=1``) -> the result."""
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list) or len(obj["choices"]) != 1:
        raise MalformedResponse(f"expected exactly one choice in {str(obj)[:300]}")
    chunk = parse_choice(obj["choices"][0])
    return accumulate([chunk, GenerationChunk((), (), "", usage=parse_usage(obj.get("usage")))], prompt_ids)


def accumulate(chunks: Iterable[GenerationChunk], prompt_ids: tuple[int, ...]) -> GenerationResult:
    """Fold chunks into a result; raises if tokens follow the finish or the finish/usage never came."""
    ids: list[int] = []
    lps: list[float] = []
    text: list[str] = []
    finish: EngineFinishReason | None = None
    stop_reason: int | str | None = None
    usage: EngineUsage | None = None
    for c in chunks:
        if finish is not None and c.token_ids:
            raise MalformedResponse("tokens arrived after the finish_reason")
        ids.extend(c.token_ids)
        lps.extend(c.logprobs)
        text.append(c.text)
        if c.finish_reason is not None:
            finish, stop_reason = c.finish_reason, c.stop_reason
        usage = c.usage or usage
    if finish is None:
        raise MalformedResponse("the completion ended without a finish_reason")
    if usage is None:
        raise MalformedResponse("the completion ended without usage")
    if usage.completion_tokens != len(ids):
        raise MalformedResponse(f"usage says {usage.completion_tokens} completion tokens, got {len(ids)} ids")
    return GenerationResult(prompt_ids, tuple(ids), tuple(lps), "".join(text), finish, stop_reason, usage)


def sse_data(line: bytes) -> bytes | None:
    """The payload of an SSE ``data:`` line; None for blank lines, comments and other fields."""
    if not line.startswith(b"data:"):
        return None
    return line[5:].removeprefix(b" ").removesuffix(b"\r")


def coalesce(chunks: list[GenerationChunk]) -> list[GenerationChunk]:
    """Chunks that arrived in one read, merged: consecutive token chunks become one (ids, logprobs and text
    joined) up to and including one that ends the choice; a usage chunk stays its own. Nothing waits for more: only
    what the engine already delivered together is merged, so a call's work per token (parser, encoder, one write to
    the client) runs once per read instead of once per token when the engine outpaces the proxy."""
    out: list[GenerationChunk] = []
    for c in chunks:
        prev = out[-1] if out else None
        if prev is not None and prev.finish_reason is None and prev.usage is None and c.usage is None:
            merged = GenerationChunk(
                prev.token_ids + c.token_ids,
                prev.logprobs + c.logprobs,
                prev.text + c.text,
                c.finish_reason,
                c.stop_reason,
            )
            out[-1] = merged
        else:
            out.append(c)
    return out


class _WireLogprobs(msgspec.Struct):
    token_logprobs: list[float | None] | None = None


class _WireChoice(msgspec.Struct):
    text: str = ""
    token_ids: list[int] | None = None
    logprobs: _WireLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class _WireUsage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int


class _WireEvent(msgspec.Struct):
    """The fields of a vLLM completions stream event this proxy reads (others are skipped unread)."""

    choices: list[_WireChoice] | msgspec.UnsetType = msgspec.UNSET
    usage: _WireUsage | None = None
    error: Any = msgspec.UNSET  # present, even as null: an in-stream error (the checked path says which)


_decode_event = msgspec.json.Decoder(_WireEvent).decode


def stream_event_chunks(data: str | bytes) -> list[GenerationChunk]:
    """One SSE ``data:`` payload -> zero or more chunks; an in-stream error raises.

    One event per sampled token (per ``stream_interval`` tokens) makes this a per-token cost: the event is decoded
    into typed structs by msgspec (~2 us for a vLLM chunk with logprobs, against ~11 us for ``json.loads`` and the
    checks of :func:`parse_choice`; py-spy put ``json.loads`` here at ~4% of a loaded proxy with a paced engine).
    Anything the typed decode refuses or that breaks a rule (an error, several choices, ids and logprobs that
    disagree, an unknown finish reason, a ``NaN`` literal) goes through the generic path, which gives the same
    chunks or the same error it always did.
    """
    try:
        event = _decode_event(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _checked_event_chunks(data)
    choices = event.choices
    if event.error is not msgspec.UNSET or not isinstance(choices, list) or len(choices) > 1:
        return _checked_event_chunks(data)
    chunks = []
    for c in choices:
        ids = c.token_ids or ()
        lps = c.logprobs.token_logprobs if c.logprobs is not None else None
        if lps is None and not ids:
            lps = []
        finish = c.finish_reason
        if lps is None or len(lps) != len(ids) or (finish is not None and finish not in ENGINE_FINISH_REASONS):
            return _checked_event_chunks(data)
        logprobs = tuple(lps) if None not in lps else tuple(MISSING_LOGPROB if x is None else x for x in lps)
        chunks.append(GenerationChunk(tuple(ids), logprobs, c.text, finish, c.stop_reason))  # type: ignore[arg-type]
    if event.usage is not None:
        chunks.append(
            GenerationChunk((), (), "", usage=EngineUsage(event.usage.prompt_tokens, event.usage.completion_tokens))
        )
    return chunks


def _checked_event_chunks(data: str | bytes) -> list[GenerationChunk]:
    """:func:`stream_event_chunks` over a generic parse: what an event the typed decoder refused is, or which error."""
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise MalformedResponse(f"stream event is not JSON: {data[:200]!r}") from e
    if not isinstance(obj, dict):
        raise MalformedResponse(f"stream event is not an object: {data[:200]!r}")
    if "error" in obj:
        err = obj["error"]
        code = err.get("code") if isinstance(err, dict) else None
        raise error_from_body(code if isinstance(code, int) else 500, data)
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) > 1:
        raise MalformedResponse(f"expected at most one choice per stream event: {data[:200]!r}")
    chunks = [parse_choice(c) for c in choices]
    if obj.get("usage") is not None:
        chunks.append(GenerationChunk((), (), "", usage=parse_usage(obj["usage"])))
    return chunks

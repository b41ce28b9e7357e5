"""One model call, end to end: wire body -> canonical request -> token ids -> engine -> sampled ids -> canonical
events -> wire bytes, and one :class:`~addon.records.schema.CallRecord`.

Contract
--------
:class:`Generator` is built once per proxy process with its collaborators (splice renderer, engine pool, record store,
session registry, stats). ``await handle(call, body, sink)`` answers one call on ``sink`` and never raises: every
failure becomes an answer in the caller's own wire format (a vendor error body before the stream starts, the
format's in-stream error event after). Streaming is real: each sampled chunk is parsed and encoded as it arrives.

Ordering guarantee: the call's record is appended to the write-ahead log (fsync'd, in a worker thread) *before* the
final event (or the whole non-streaming body) is written to the client, so a turn the client saw complete is never
lost. Blocking work — tokenizer rendering, WAL appends — runs in threads, never on the event loop.

Sampling: :class:`~addon.generation.sampling.SamplingPolicy` decides what is applied (by default top_p/top_k/min_p
and penalties neutral); both the requested and the applied values are recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from addon.engine.client import BadRequest, ContextTooLong, EngineError, GenerationRequest
from addon.engine.pool import EnginePool, NoEngine
from addon.generation.parser import OutputParser, ParserSpec
from addon.generation.sampling import SamplingPolicy, engine_sampling, forced_tool_call
from addon.generation.sessions import SessionRegistry
from addon.generation.splice import SessionGraphs, SessionState, SplicePlan, SpliceRenderer
from addon.generation.splice import plan as splice_plan
from addon.generation.splice import record as splice_record
from addon.generation.stats import Stats
from addon.records.blobs import CanonicalJson, dumps_json, pack_json_text, plain
from addon.records.schema import CallRecord, TurnTokens
from addon.records.store import RecordStore, RecordStoreError
from converters import dialect_for
from converters.accumulate import Accumulator
from converters.base import Dialect, Route, StreamEncoder, UnknownFields
from converters.canonical import (
    Completion,
    ConversionError,
    Finish,
    JsonObjectFormat,
    JsonSchemaFormat,
    ModelRequest,
    StreamEvent,
    StreamStart,
    TextDelta,
    Usage,
    completion_events,
)

BUDGET_STOP_TEXT = "The session's budget is used up ({reason}); the episode ends here."

log = logging.getLogger("harnessrl.generate")


class ResponseSink(Protocol):
    """Where an answer goes (the internal HTTP server adapts its response object to this)."""

    async def start(self, status: int, headers: Mapping[str, str]) -> None: ...
    async def write(self, data: bytes) -> None: ...
    async def end(self) -> None: ...


@dataclass(frozen=True)
class CallInfo:
    """Who made the call and when; filled in by the proxy before generation."""

    run_id: str
    session_id: str
    route: Route
    headers: Mapping[str, str]
    received_at: datetime
    harness: str = "unknown"
    harness_version: str | None = None
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class _Turn:
    """Mutable per-call state while the engine streams."""

    request: ModelRequest
    info: CallInfo
    call_index: int
    prompt_ids: Sequence[int] = ()
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    first_token_at: datetime | None = None
    engine_started: float = 0.0
    engine_done: float = 0.0
    error: str | None = None
    incomplete: bool = False
    policy_version: int | None = None
    engine_wait_ms: int | None = None  # set when the call had to wait for an engine that could take it
    malformed: int = 0
    recorded: bool = False
    plan: SplicePlan | None = None
    acc: Accumulator | None = None  # the answer so far, once generation started


class Generator:
    def __init__(
        self,
        *,
        splicer: SpliceRenderer,
        engine: EnginePool,
        store: RecordStore,
        sessions: SessionRegistry,
        stats: Stats,
        max_model_len: int,
        served_model: str,
        policy: SamplingPolicy | None = None,
        parser_spec: ParserSpec | None = None,
        fields: UnknownFields | None = None,
        force_tool_calls: bool = False,
    ) -> None:
        self.force_tool_calls = force_tool_calls
        self.splicer = splicer
        self.graphs = SessionGraphs()  # per-session prefix graphs: token-faithful splicing, cost ~ new suffix
        sessions.on_close(self.graphs.drop)  # a session the collector closed frees its graph at once, not when idle
        # Every call goes through the pool with its session id (affinity, failover). Each engine's weight version is
        # kept current by the runtime (polled, or pushed by the trainer through the admin route) instead of asked per
        # call: an extra engine round trip per call costs most under load.
        self.engine = engine
        self.store = store
        self.sessions = sessions
        self.stats = stats
        self.max_model_len = max_model_len
        self.served_model = served_model
        self.policy = policy or SamplingPolicy()
        self.parser_spec = parser_spec or ParserSpec()
        self.fields = fields or UnknownFields()
        # The record's request blob: each message and tool is JSON-encoded once while cached, not once per call.
        self.canonical_json = CanonicalJson()

    async def handle(self, info: CallInfo, body: bytes, sink: ResponseSink) -> None:
        dialect = dialect_for(info.route.format)
        t0 = time.perf_counter()
        try:
            # a harness body can be megabytes of JSON: parse it off the event loop
            request = await asyncio.to_thread(dialect.parse_request, body, info.route, info.headers, self.fields)
        except ConversionError as err:
            self.stats.error("bad_request")
            await _send_error(sink, dialect, err)
            return
        call_index, budget_stop = self.sessions.begin_call(info.session_id)
        turn = _Turn(request, info, call_index)
        try:
            if budget_stop:
                await self._budget_stop(turn, dialect, budget_stop, sink)
                return
            await self._generate(turn, dialect, sink, t0)
        except ConversionError as err:
            # A call refused after it was parsed (context too long, content the model cannot take, engine down) is
            # still a model call of this session: record it, with the prompt ids when they were rendered.
            self.stats.error(err.kind)
            if not turn.recorded:
                turn.error, turn.incomplete = f"{err.kind}: {err.message}", True
                await self._record(turn, None)
            await _send_error(sink, dialect, err)
        except (ConnectionError, asyncio.CancelledError):
            # The client went away mid-answer (a harness exiting while its side call still streams, a retry after
            # a client timeout): what the engine sampled so far is still this session's call. Leaving the engine
            # stream by this exception also closes it, so vLLM stops sampling.
            if not turn.recorded:
                turn.error, turn.incomplete = "client_disconnected", True
                self.stats.error("client_disconnected")
                await asyncio.shield(self._record(turn, turn.acc.completion if turn.acc else None))
            raise
        finally:
            self.sessions.end_call(
                info.session_id, len(turn.prompt_ids) + len(turn.completion_ids), turn.error is not None
            )

    async def _generate(self, turn: _Turn, dialect: Dialect, sink: ResponseSink, t0: float) -> None:
        request = turn.request
        # the version of the engine this call would go to; replaced by the routed engine's once it answers
        turn.policy_version = self.engine.policy_version_for(turn.info.session_id)
        state = self.graphs.get(turn.info.session_id, time.monotonic())
        aux = auxiliary_reason(request) is not None
        turn.plan = await asyncio.to_thread(_plan_locked, state, request, self.splicer, aux)
        # the packed ids when the splice built them (checked and encoded in C downstream), else the tuple
        turn.prompt_ids = turn.plan.packed if turn.plan.packed is not None else turn.plan.prompt_ids
        self.stats.splice(turn.plan.reason)
        if len(turn.prompt_ids) >= self.max_model_len:
            raise ConversionError(
                "context_length",
                f"prompt is too long: {len(turn.prompt_ids)} tokens > {self.max_model_len - 1} maximum",
            )
        turn.applied = self.policy.apply(
            request, len(turn.prompt_ids), self.max_model_len, turn.info.session_id, turn.call_index
        )
        parser = OutputParser(self.parser_spec, allowed=turn.plan.allowed_tools())
        encoder = dialect.stream_encoder(turn.info.route, request) if request.stream else None
        acc = turn.acc = Accumulator()
        start = StreamStart(_response_id(), request.model, int(time.time()), len(turn.prompt_ids))
        acc.feed(start)
        structured = forced_tool_call(request) if self.force_tool_calls else None
        gen = GenerationRequest(prompt_ids=turn.prompt_ids, structured=structured, **engine_sampling(turn.applied))
        turn.engine_started = time.perf_counter()
        self.stats.overhead_in(turn.engine_started - t0)
        started = False
        finish_reason = "stop"
        try:
            async with aclosing(self.engine.stream(turn.info.session_id, gen)) as routed_chunks:
                async for routed, chunk in routed_chunks:
                    turn.policy_version = routed.policy_version  # the engine that sampled it, when it was asked
                    if routed.waited_s and turn.engine_wait_ms is None:
                        turn.engine_wait_ms = round(routed.waited_s * 1000)
                    if turn.first_token_at is None and chunk.token_ids:
                        turn.first_token_at = _now()
                    turn.completion_ids.extend(chunk.token_ids)
                    turn.logprobs.extend(chunk.logprobs)
                    if chunk.finish_reason:
                        finish_reason = chunk.finish_reason
                    events = parser.feed(chunk.text) if chunk.text else []
                    if encoder is not None and not started:
                        await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
                        await sink.write(encoder.feed(start))
                        started = True
                    await self._emit(events, acc, encoder, sink)
        except EngineError as err:
            turn.error, turn.incomplete = f"engine: {err}", True
            if isinstance(err, NoEngine):
                turn.engine_wait_ms = round(err.waited_s * 1000)
            if not isinstance(err, BadRequest):  # the harness sees a retryable error: say which limit was hit
                log.warning(
                    "harnessrl: call %s of session %s gets a retryable error: %s",
                    turn.info.call_id,
                    turn.info.session_id,
                    err,
                )
            self.stats.error("engine")
            await self._record(turn, acc.completion)
            if not started:
                raise _engine_error(err) from err
            await sink.write(encoder.error(_engine_error(err)) if encoder else b"")
            await sink.end()
            return
        turn.engine_done = time.perf_counter()
        turn.malformed = parser.malformed_tool_calls
        usage = Usage(len(turn.prompt_ids), len(turn.completion_ids))
        tail = parser.finish(_finish_reason(finish_reason), usage)
        final = [e for e in tail if isinstance(e, Finish)]
        await self._emit([e for e in tail if not isinstance(e, Finish)], acc, encoder, sink)
        acc.feed_all(list(final))
        completion = acc.completion
        # The node must exist before the client sees the end of this turn: its next call extends it.
        await asyncio.to_thread(
            _record_locked, state, turn, completion, final[0].reason if final else completion.finish_reason
        )
        if not await self._record(turn, completion):
            if encoder is not None and started:
                await sink.write(encoder.error(_store_failed()))
                await sink.end()
                return
            raise _store_failed()
        if encoder is None:
            body = dumps_body(dialect.render_completion(completion))
            await sink.start(200, {"content-type": "application/json"})
            await sink.write(body)
        else:
            if not started:
                await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
                await sink.write(encoder.feed(start))
            for event in final:
                await sink.write(encoder.feed(event))
        await sink.end()
        self.stats.call_done(time.perf_counter() - turn.engine_done, len(turn.completion_ids))

    async def _emit(
        self, events: list[StreamEvent], acc: Accumulator, encoder: StreamEncoder | None, sink: ResponseSink
    ) -> None:
        for event in events:
            acc.feed(event)
            if encoder is not None:
                data = encoder.feed(event)
                if data:
                    await sink.write(data)

    async def _budget_stop(self, turn: _Turn, dialect: Dialect, reason: str, sink: ResponseSink) -> None:
        """Answer with a normal final message (no tool calls) so the harness ends the episode."""
        req = turn.request
        completion = Completion(
            id=_response_id(),
            model=req.model,
            text=BUDGET_STOP_TEXT.format(reason=reason),
            finish_reason="stop",
            created=int(time.time()),
        )
        if not await self._record(turn, completion, budget_stop=reason):
            raise _store_failed()
        self.stats.error("budget_stop")
        if not req.stream:
            await sink.start(200, {"content-type": "application/json"})
            await sink.write(dumps_body(dialect.render_completion(completion)))
        else:
            encoder = dialect.stream_encoder(turn.info.route, req)
            await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
            for event in completion_events(completion):
                await sink.write(encoder.feed(event))
        await sink.end()

    async def _record(self, turn: _Turn, completion: Completion | None, budget_stop: str | None = None) -> bool:
        """Build and durably append the call's row; False when the store refused it (the caller then answers an
        error instead of the final event). Never raises a store error: a failing disk must not crash a call."""
        missing = sum(1 for x in turn.logprobs if x != x)  # NaN: a token vLLM gave no logprob for
        if missing:
            self.stats.missing_logprobs(missing)
            log.info("harnessrl: call %s: %d sampled tokens without a logprob", turn.info.call_id, missing)
            if missing == len(turn.logprobs):
                # every token NaN means NaN logits, not a rare value: the usual cause is a context served past the
                # model's position table (VLLM_ALLOW_LONG_MAX_MODEL_LEN); the answer is noise, so say so loudly
                log.warning(
                    "harnessrl: call %s: the engine gave no logprob for any of its %d tokens (NaN logits); is the "
                    "prompt (%d tokens) past the model's position table? see docs/engine.md",
                    turn.info.call_id,
                    missing,
                    len(turn.prompt_ids),
                )
        # building the row (canonical request JSON + zstd) and the fsync'd append both run off the event loop
        try:
            await asyncio.to_thread(self._build_and_append, turn, completion, budget_stop)
        except RecordStoreError as e:
            log.error("harnessrl: call %s of session %s not stored: %s", turn.info.call_id, turn.info.session_id, e)
            self.stats.error("record_store")
            turn.recorded = True  # nothing more can be stored for it; the error paths must not try again
            return False
        turn.recorded = True
        return True

    def _build_and_append(self, turn: _Turn, completion: Completion | None, budget_stop: str | None) -> None:
        self.store.append(build_record(turn, completion, self.served_model, budget_stop, self.canonical_json))


# --------------------------------------------------------------------------------------------------- helpers


def build_record(
    turn: _Turn,
    completion: Completion | None,
    served_model: str,
    budget_stop: str | None,
    canonical_json: CanonicalJson | None = None,
) -> CallRecord:
    """The call's row. With ``canonical_json`` (the Generator's, shared by all sessions) its cost follows the new
    suffix: the request's messages and tools are JSON-encoded once per distinct value; without it the whole request
    is encoded (same text). The token ids are packed once, in :class:`TurnTokens`."""
    req, info = turn.request, turn.info
    request_json = canonical_json.request(req) if canonical_json is not None else dumps_json(plain(req))
    aux = auxiliary_reason(req)
    names = tuple(c.name for c in completion.tool_calls) if completion else ()
    return CallRecord(
        run_id=info.run_id,
        session_id=info.session_id,
        call_index=turn.call_index,
        call_id=info.call_id,
        harness=info.harness,
        harness_version=info.harness_version,
        wire_format=req.format,
        route=info.route.path,
        model=req.model,
        served_model=served_model,
        policy_version=turn.policy_version,
        received_at=info.received_at,
        first_token_at=turn.first_token_at,
        done_at=_now(),
        tokens=TurnTokens(
            turn.prompt_ids,  # type: ignore[arg-type]  # packed ids are kept, stored as a tuple
            tuple(turn.completion_ids),
            tuple(turn.logprobs),
        ),
        finish_reason=completion.finish_reason if completion and not turn.incomplete else None,
        tool_call_names=names,
        auxiliary=aux is not None,
        auxiliary_reason=aux,
        sampling_requested=plain(req.sampling),
        sampling_applied=turn.applied,
        request_canonical=pack_json_text(request_json),
        completion_canonical=pack_json_text(dumps_json(plain(completion))) if completion else None,
        error=turn.error or (f"malformed_tool_calls={turn.malformed}" if turn.malformed else None),
        budget_stop=budget_stop,
        incomplete=turn.incomplete,
        identity_hints=_identity(req),
        parent_call_id=turn.plan.parent_call_id if turn.plan else None,
        fork_reason=turn.plan.fork_reason if turn.plan else None,
        prompt_reused_tokens=turn.plan.reused_tokens if turn.plan else 0,
        engine_wait_ms=turn.engine_wait_ms,
    )


def _plan_locked(state: SessionState, request: ModelRequest, splicer: SpliceRenderer, auxiliary: bool) -> SplicePlan:
    with state.lock:
        return splice_plan(state, request, splicer, auxiliary=auxiliary)


def _record_locked(state: SessionState, turn: _Turn, completion: Completion, finish: Any) -> None:
    assert turn.plan is not None
    with state.lock:
        splice_record(state, turn.info.call_id, turn.request, turn.plan, completion, turn.completion_ids, finish)


def auxiliary_reason(request: ModelRequest) -> str | None:
    """A side request (title generation, classifiers, memory extraction) asks for structured output and offers no
    tools; it is recorded but excluded from training by default. Detected from the request, never the model name."""
    if isinstance(request.output_format, JsonSchemaFormat | JsonObjectFormat) and not request.tools:
        return "structured_output"
    return None


def _identity(req: ModelRequest) -> dict[str, str]:
    ident = req.identity
    out = {f"header:{k}": v for k, v in ident.headers.items()}
    for name in ("user_id", "session_id", "prompt_cache_key", "user_agent"):
        value = getattr(ident, name)
        if value:
            out[name] = value
    return out


def _finish_reason(engine_reason: str) -> Any:
    return {"length": "length", "stop": "stop", "abort": "error"}.get(engine_reason, "stop")


def _store_failed() -> ConversionError:
    """Sent instead of a turn's final event when its record could not be made durable (disk full, I/O error): the
    client must not see as complete a turn that is not stored; 529/503 with retry-after makes the harness retry."""
    return ConversionError("overloaded", "the proxy could not store this call's record; retry shortly", retry_after=1.0)


def _engine_error(err: EngineError) -> ConversionError:
    if isinstance(err, ContextTooLong):
        return ConversionError("context_length", str(err))
    if isinstance(err, BadRequest):
        return ConversionError("invalid_request", f"the model engine refused the call: {err}")
    return ConversionError("overloaded", f"the model engine is unavailable: {err}", retry_after=1.0)


async def _send_error(sink: ResponseSink, dialect: Dialect, err: ConversionError) -> None:
    response = dialect.render_error(err)
    await sink.start(response.status, dict(response.headers))
    await sink.write(response.body)
    await sink.end()


def dumps_body(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _response_id() -> str:
    return uuid.uuid4().hex[:24]


def _now() -> datetime:
    return datetime.now(UTC)


__all__ = ["CallInfo", "Generator", "ResponseSink", "SamplingPolicy", "TextDelta", "auxiliary_reason"]

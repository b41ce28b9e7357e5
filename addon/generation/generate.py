"""One model call, end to end: wire body -> canonical request -> token ids -> engine -> sampled ids -> canonical
events -> wire bytes, and one :class:`~addon.records.schema.CallRecord`.

Contract
--------
:class:`Generator` is built once per proxy process with its collaborators (splice renderer, engine pool, record store,
session registry, stats). ``await handle(call, body, sink)`` answers one call on ``sink`` and never raises: every
failure becomes an answer in the caller's own wire format (a vendor error body before the stream starts, the
format's in-stream error event after). Streaming is real: each sampled chunk is parsed, encoded and written as it
arrives, but the engine's read that ends the answer, which goes out in one write with the final events once the
record is durable (the client could not see the answer complete before then anyway).

Ordering guarantee: the call's record is appended to the write-ahead log (fsync'd, in a worker thread) *before* the
final event (or the whole non-streaming body) is written to the client, so a turn the client saw complete is never
lost. Blocking work — tokenizer rendering, WAL appends — runs in threads, never on the event loop.

Worker-thread hops per call (a hop costs ~150 us of CPU on an idle loop, ~50 us each among 32 at once: the
executor's queue, a thread's wake-up, the loop's): two. The first parses (against the session's previous
request: only the conversation items after the first changed byte are decoded and parsed, :mod:`converters.delta`)
and plans (the splice plan, and the prompt as the engine's JSON formatted from the session's previous prompt, so only
new ids), hands the plan to the loop at once (the engine is asked while the thread goes on) and then builds the row's
first half (:mod:`addon.generation.recording`: request JSON + zstd, prompt ids packed) alongside the engine. The
second, after the engine, adds the session-graph node, finishes the row and appends it durably (the WAL frame,
:mod:`addon.records.frames`). A lone call (no other call in flight) of a session seen before makes one hop: it is
parsed and planned on the loop, and its node and row are made there too; only the fsync'd append goes to a thread
(:mod:`addon.generation.planning` says why and when).

Sampling: :class:`~addon.generation.sampling.SamplingPolicy` decides what is applied (by default top_p/top_k/min_p
and penalties neutral); both the requested and the applied values are recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Any, Protocol

from addon.engine.client import BadRequest, ContextTooLong, EngineError, GenerationRequest
from addon.engine.pool import EnginePool, NoEngine
from addon.generation.parser import OutputParser, ParserSpec
from addon.generation.planning import Planned, Planner
from addon.generation.recording import CallInfo, RecordPrelude, Turn, auxiliary_reason, build_record
from addon.generation.sampling import SamplingPolicy, engine_sampling, forced_tool_call
from addon.generation.sessions import SessionRegistry
from addon.generation.splice import SessionGraphs, SessionState, SpliceRenderer
from addon.generation.splice import record as splice_record
from addon.generation.stats import Stats
from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson
from addon.records.store import RecordStore, RecordStoreError
from converters import dialect_for
from converters.accumulate import Accumulator
from converters.base import Dialect, StreamEncoder, UnknownFields
from converters.canonical import (
    Completion,
    ConversionError,
    Finish,
    StreamEvent,
    StreamStart,
    TextDelta,
    Usage,
    completion_events,
)

BUDGET_STOP_TEXT = "The session's budget is used up ({reason}); the episode ends here."

log = logging.getLogger("harnessrl.generate")


class ResponseSink(Protocol):
    """Where an answer goes (the internal HTTP server adapts its response object to this). ``end(data)`` sends the
    answer's last bytes with its end in one write: through mitmproxy each write is a read, a TLS record and an
    event of its own, on the path to the client's last byte."""

    async def start(self, status: int, headers: Mapping[str, str]) -> None: ...
    async def write(self, data: bytes) -> None: ...
    async def end(self, data: bytes = b"") -> None: ...


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
        stream_interval: int = 1,
    ) -> None:
        self.force_tool_calls = force_tool_calls
        self.stream_interval = stream_interval  # tokens per engine event after the first (vLLM's stream_interval)
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
        sessions.on_close(self.canonical_json.forget)
        self.request_frames = RequestFrames()  # and its zstd frames: a call compresses only what is new
        sessions.on_close(self.request_frames.forget)
        self.planner = Planner(splicer, stats, self.fields, self.canonical_json, self.request_frames)
        self.in_flight = 0  # calls being answered now

    async def handle(self, info: CallInfo, body: bytes, sink: ResponseSink) -> None:
        self.in_flight += 1
        try:
            await self._handle(info, body, sink)
        finally:
            self.in_flight -= 1

    async def _handle(self, info: CallInfo, body: bytes, sink: ResponseSink) -> None:
        dialect = dialect_for(info.route.format)
        t0 = time.perf_counter()
        state = self.graphs.get(info.session_id, time.monotonic())
        # no other call in flight: planned and recorded on the loop (addon.generation.planning)
        lone = self.in_flight == 1
        try:
            request, planned, ahead = await self.planner.start(dialect, body, info, state, lone=lone)
        except ConversionError as err:
            self.stats.error("bad_request")
            await _send_error(sink, dialect, err)
            return
        call_index, budget_stop = self.sessions.begin_call(info.session_id)
        turn = Turn(request, info, call_index, lone=lone)
        try:
            if budget_stop:
                await self._budget_stop(turn, dialect, budget_stop, sink)
                return
            await self._generate(turn, dialect, sink, t0, planned, ahead)
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

    async def _generate(
        self,
        turn: Turn,
        dialect: Dialect,
        sink: ResponseSink,
        t0: float,
        planned: Planned,
        ahead: Awaitable[RecordPrelude | None],
    ) -> None:
        request = turn.request
        # the version of the engine this call would go to; replaced by the routed engine's once it answers
        turn.policy_version = self.engine.policy_version_for(turn.info.session_id)
        state = self.graphs.get(turn.info.session_id, time.monotonic())
        if isinstance(planned, ConversionError):
            raise planned
        plan, prompt_json = planned
        turn.plan = plan
        # FrozenIds over the array the splice built (the engine request and the row read that array), else a tuple
        turn.prompt_ids = plan.prompt_ids
        # The row's first half (request JSON + zstd, these prompt ids packed), built by the thread that planned the
        # call while the engine samples; a call refused below (context too long) is recorded with it too.
        turn.prelude = ahead
        self.stats.splice(plan.reason)
        if len(turn.prompt_ids) >= self.max_model_len:
            raise ConversionError(
                "context_length",
                f"prompt is too long: {len(turn.prompt_ids)} tokens > {self.max_model_len - 1} maximum",
            )
        turn.applied = self.policy.apply(
            request, len(turn.prompt_ids), self.max_model_len, turn.info.session_id, turn.call_index
        )
        parser = OutputParser(self.parser_spec, allowed=plan.allowed_tools())
        encoder = dialect.stream_encoder(turn.info.route, request) if request.stream else None
        acc = turn.acc = Accumulator()
        start = StreamStart(_response_id(), request.model, int(time.time()), len(turn.prompt_ids))
        acc.feed(start)
        structured = forced_tool_call(request) if self.force_tool_calls else None
        gen = GenerationRequest(
            prompt_ids=turn.prompt_ids,
            structured=structured,
            prompt_json=prompt_json,
            stream_interval=self.stream_interval,
            **engine_sampling(turn.applied),
        )
        turn.engine_started = time.perf_counter()
        self.stats.overhead_in(turn.engine_started - t0)
        started = ended = False  # the answer's headers sent; the engine done
        finish_reason = "stop"
        # Encoded, not yet written: the stream's opening until the first write, and from the engine's read that ended
        # its answer on, everything, written with the final events once the record is durable: the client would not
        # see the answer complete before then anyway, and one write is one relay through mitmproxy instead of two
        # racing the record's thread for the GIL (round18.md).
        held: list[bytes] = [encoder.feed(start)] if encoder is not None else []
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
                        finish_reason, ended = chunk.finish_reason, True
                    events = parser.feed(chunk.text) if chunk.text else []
                    if encoder is None:
                        acc.feed_all(events)
                        continue
                    held.append(_encode(events, acc, encoder))  # one write per engine read, not per event
                    if ended:
                        continue  # the engine is done: the rest goes out after the record
                    if not started:
                        await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
                        started = True
                    await sink.write(b"".join(held))
                    held.clear()
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
            await sink.end(b"".join(held) + (encoder.error(_engine_error(err)) if encoder else b""))
            return
        turn.engine_done = time.perf_counter()
        turn.malformed = parser.malformed_tool_calls
        usage = Usage(len(turn.prompt_ids), len(turn.completion_ids))
        tail = parser.finish(_finish_reason(finish_reason), usage)
        final = [e for e in tail if isinstance(e, Finish)]
        held.append(_encode([e for e in tail if not isinstance(e, Finish)], acc, encoder))
        acc.feed_all(list(final))
        completion = acc.completion
        # The node must exist before the client sees the end of this turn (its next call extends it): added in the
        # same worker-thread hop as the row's append.
        finish = final[0].reason if final else completion.finish_reason
        if not await self._record(turn, completion, graph=(state, finish)):
            if encoder is not None and started:
                await sink.end(b"".join(held) + encoder.error(_store_failed()))
                return
            raise _store_failed()
        if encoder is None:
            body = dumps_body(dialect.render_completion(completion))
            await sink.start(200, {"content-type": "application/json"})
            await sink.end(body)
        else:
            if not started:
                await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
            await sink.end(b"".join(held + [encoder.feed(event) for event in final]))
        self.stats.call_done(time.perf_counter() - turn.engine_done, len(turn.completion_ids))

    async def _budget_stop(self, turn: Turn, dialect: Dialect, reason: str, sink: ResponseSink) -> None:
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
            await sink.end(dumps_body(dialect.render_completion(completion)))
        else:
            encoder = dialect.stream_encoder(turn.info.route, req)
            await sink.start(200, {"content-type": encoder.content_type, "cache-control": "no-cache"})
            await sink.end(b"".join(encoder.feed(event) for event in completion_events(completion)))

    async def _record(
        self,
        turn: Turn,
        completion: Completion | None,
        budget_stop: str | None = None,
        graph: tuple[SessionState, Any] | None = None,
    ) -> bool:
        """Build and durably append the call's row (first adding its node to the session graph when ``graph`` is
        given: ``(state, finish reason)``); False when the store refused it (the caller then answers an error instead
        of the final event). Never raises a store error: a failing disk must not crash a call."""
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
        prepared: RecordPrelude | None = None
        if turn.prelude is not None:
            try:
                prepared = await turn.prelude
            except ValueError:
                prepared = None  # build_record raises the same error in the thread below
        try:
            state, finish = graph if graph is not None else (None, None)
            # Still alone (and the session graph free: a side call of the session may be planning): the node and
            # the row on the loop, only the fsync'd append in a thread. In a thread their Python holds the GIL all
            # the same, and through mitmproxy that thread started only once the loop had relayed the answer's
            # first chunk (0.6-0.7 ms after the hand-off; round17.md).
            alone = turn.lone and self.in_flight == 1
            free = alone and (
                state is None or completion is None or _record_locked(state, turn, completion, finish, False)
            )
            if free:
                row = build_record(turn, completion, self.served_model, budget_stop, self.canonical_json, prepared)
                await asyncio.to_thread(self.store.append, row)
            else:  # finishing the row and the fsync'd append run off the event loop, in one hop
                await asyncio.to_thread(self._build_and_append, turn, completion, budget_stop, prepared, graph)
        except RecordStoreError as e:
            log.error("harnessrl: call %s of session %s not stored: %s", turn.info.call_id, turn.info.session_id, e)
            self.stats.error("record_store")
            turn.recorded = True  # nothing more can be stored for it; the error paths must not try again
            return False
        turn.recorded = True
        return True

    def _build_and_append(
        self,
        turn: Turn,
        completion: Completion | None,
        budget_stop: str | None,
        prepared: RecordPrelude | None,
        graph: tuple[SessionState, Any] | None,
    ) -> None:
        if graph is not None and completion is not None:
            _record_locked(graph[0], turn, completion, graph[1])
        row = build_record(turn, completion, self.served_model, budget_stop, self.canonical_json, prepared)
        self.store.append(row)


# --------------------------------------------------------------------------------------------------- helpers


def _record_locked(state: SessionState, turn: Turn, completion: Completion, finish: Any, wait: bool = True) -> bool:
    """The call's node in its session graph; False (nothing done) when ``wait`` is False and the lock is held."""
    assert turn.plan is not None
    if not state.lock.acquire(blocking=wait):
        return False
    try:
        splice_record(state, turn.info.call_id, turn.request, turn.plan, completion, turn.completion_ids, finish)
    finally:
        state.lock.release()
    return True


def _encode(events: list[StreamEvent], acc: Accumulator, encoder: StreamEncoder | None) -> bytes:
    """``events`` folded into ``acc`` and, when streaming, encoded as one piece: the events of one engine read reach
    the client in one write (a write per event cost a syscall each here, and a relayed chunk each in mitmproxy)."""
    acc.feed_all(events)
    if encoder is None:
        return b""
    return b"".join([encoder.feed(event) for event in events])


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
    await sink.end(response.body)


def dumps_body(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _response_id() -> str:
    return uuid.uuid4().hex[:24]


def _now() -> datetime:
    return datetime.now(UTC)


_Turn = Turn  # the name benchmarks/stage_costs.py and older callers use

__all__ = [
    "CallInfo",
    "Generator",
    "ResponseSink",
    "SamplingPolicy",
    "TextDelta",
    "Turn",
    "auxiliary_reason",
    "build_record",
]

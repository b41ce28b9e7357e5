"""A call's parse and plan, and the row's first half: in the planning thread, or on the loop for a lone call.

Contract
--------
``await Planner.start(dialect, body, info, state, lone=...)`` returns ``(request, planned, ahead)``: the canonical
request, its :data:`Planned` (the splice plan with the prompt as the engine's JSON list, or the ConversionError that
refused the plan, raised later by the caller once the call is counted in its session), and ``ahead``, a future of
the row's first half (:func:`~addon.generation.recording.prelude`; None when no plan was made) that nobody may
await (a call that fails first): an error left in it is marked seen, never logged as never retrieved. A request that
cannot be parsed raises ConversionError.

Where the work runs:

* **the planning thread** (any call while another is in flight, a session's first call): one worker-thread hop
  parses (against the session's previous request: only what is new, :mod:`converters.delta`), plans, hands the plan
  to the loop at once (the engine is asked while the thread goes on) and then builds the row's first half. A harness
  body can be megabytes and a new root a full render: none of it may hold up the other calls' relays.
* **the loop, for a lone call** (``lone``: no other call in flight in this process) of a session seen before: the
  parse and a plan that extends or retries an earlier call (:func:`~addon.generation.splice.plan_without_root`:
  the new suffix rendered and tokenised, ~1 ms at 8k tokens) run on the loop, and the row's first half runs there
  too once the call's task waits for the engine. With nothing else in flight there is nothing to hold up, and the
  two hand-offs cost more than they save: a sleeping worker thread took 0.35 ms to start and the plan 0.47 ms to
  reach the loop on this VM (``benchmarks/results/round16.md``). A call that needs a new root is planned in the
  thread as above (its parse stays done; the row's first half is built in a thread too: a root's history is new
  to the caches, so encoding it is O(context)), and so is one whose session's lock is held (a call whose client left
  may still be planning in a thread): the loop never waits for a lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from addon.generation.recording import CallInfo, RecordPrelude, auxiliary_reason, prelude
from addon.generation.splice import SessionState, SplicePlan, SpliceRenderer, plan_without_root
from addon.generation.splice import plan as splice_plan
from addon.generation.stats import Stats
from addon.records import token_ids
from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson
from converters.base import Dialect, UnknownFields
from converters.canonical import ConversionError, ModelRequest
from converters.delta import ListReuse

T = TypeVar("T")
# a call's splice plan and its prompt as the engine's JSON list, or the error that refused the plan
Planned = tuple[SplicePlan, token_ids.JsonIds | None] | ConversionError


class Planner:
    def __init__(
        self,
        splicer: SpliceRenderer,
        stats: Stats,
        fields: UnknownFields,
        canonical_json: CanonicalJson,
        frames: RequestFrames,
    ) -> None:
        self.splicer = splicer
        self.stats = stats
        self.fields = fields
        self.canonical_json = canonical_json
        self.frames = frames

    async def start(
        self, dialect: Dialect, body: bytes, info: CallInfo, state: SessionState, *, lone: bool
    ) -> tuple[ModelRequest, Planned, asyncio.Future[RecordPrelude | None]]:
        loop = asyncio.get_running_loop()
        if lone and state.request_memo is not None:
            request, auxiliary = self._parse(dialect, body, info, state)
            planned = None if auxiliary else self._plan_on_loop(state, request)
            if planned is not None:
                return request, planned, _background(self._prelude_soon(loop, request, planned, info))
            # a new root (a full render) or a held lock: planned in the thread, and the row's first half there too
            # (a root's history is new to the JSON cache and the request frames: encoding it is O(context))
            planned = await asyncio.to_thread(self._plan, state, request, auxiliary)
            return request, planned, _background(asyncio.to_thread(self._prelude, request, planned, info))
        planned_at: asyncio.Future[tuple[ModelRequest, Planned]] = loop.create_future()
        ahead = _background(asyncio.to_thread(self._in_thread, dialect, body, info, state, (loop, planned_at)))
        request, planned = await planned_at
        return request, planned, ahead

    def _parse(self, dialect: Dialect, body: bytes, info: CallInfo, state: SessionState) -> tuple[ModelRequest, bool]:
        """The canonical request (a ConversionError here is a bad request, raised) and whether it is a side call."""
        reuse = ListReuse(state.request_memo)
        request = dialect.parse_request(body, info.route, info.headers, self.fields, reuse=reuse)
        auxiliary = auxiliary_reason(request) is not None
        if not auxiliary:  # a side call (a title, a summary) is not what the session's next call extends
            state.request_memo = reuse.memo()
        self.stats.items_parsed(reuse.parsed, reuse.reused)
        return request, auxiliary

    def _plan(self, state: SessionState, request: ModelRequest, auxiliary: bool) -> Planned:
        """The splice plan and the engine's JSON list, or the ConversionError that refused the plan."""
        try:
            return plan_locked(state, request, self.splicer, auxiliary)
        except ConversionError as err:
            return err

    def _plan_on_loop(self, state: SessionState, request: ModelRequest) -> Planned | None:
        """:meth:`_plan` of a call that extends or retries an earlier one; None when it needs a new root or the
        session's lock is held (:func:`plan_without_wait`)."""
        try:
            return plan_without_wait(state, request, self.splicer)
        except ConversionError as err:
            return err

    def _in_thread(
        self,
        dialect: Dialect,
        body: bytes,
        info: CallInfo,
        state: SessionState,
        handover: tuple[asyncio.AbstractEventLoop, asyncio.Future[tuple[ModelRequest, Planned]]],
    ) -> RecordPrelude | None:
        """In a worker thread: parse and plan, the outcome handed to the loop (``handover``) as soon as it is known,
        then the row's first half of a planned call."""
        loop, planned_at = handover
        try:
            request, auxiliary = self._parse(dialect, body, info, state)
            planned = self._plan(state, request, auxiliary)
        except BaseException as e:
            loop.call_soon_threadsafe(_settle, planned_at, None, e)
            return None
        loop.call_soon_threadsafe(_settle, planned_at, (request, planned), None)
        return self._prelude(request, planned, info)

    def _prelude(self, request: ModelRequest, planned: Planned | None, info: CallInfo) -> RecordPrelude | None:
        if planned is None or isinstance(planned, ConversionError):
            return None
        return prelude(request, planned[0].prompt_ids, self.canonical_json, info.session_id, self.frames)

    def _prelude_soon(
        self, loop: asyncio.AbstractEventLoop, request: ModelRequest, planned: Planned, info: CallInfo
    ) -> asyncio.Future[RecordPrelude | None]:
        """The row's first half, built on the loop at its next turn: after the call's task has sent the engine
        request and waits for the answer."""
        future: asyncio.Future[RecordPrelude | None] = loop.create_future()

        def build() -> None:
            try:
                _settle(future, self._prelude(request, planned, info), None)
            except Exception as e:  # ValueError: prompt ids that are not token ids, raised again by the row
                _settle(future, None, e)

        loop.call_soon(build)
        return future


def plan_locked(
    state: SessionState, request: ModelRequest, splicer: SpliceRenderer, auxiliary: bool
) -> tuple[SplicePlan, token_ids.JsonIds | None]:
    """The splice plan, and the prompt as the engine's JSON list formatted from the session's previous prompt: only
    the new ids (None when the plan's ids are not packed)."""
    with state.lock:
        return _with_engine_prompt(state, splice_plan(state, request, splicer, auxiliary=auxiliary))


def plan_without_wait(
    state: SessionState, request: ModelRequest, splicer: SpliceRenderer
) -> tuple[SplicePlan, token_ids.JsonIds | None] | None:
    """:func:`plan_locked` for the loop: None instead of a new root, and None when the session's lock is held (a call
    whose client left may still be planning in a thread: the loop must not wait for it), so that the caller plans
    in a thread."""
    if not state.lock.acquire(blocking=False):
        return None
    try:
        found = plan_without_root(state, request, splicer)
        return None if found is None else _with_engine_prompt(state, found)
    finally:
        state.lock.release()


def _with_engine_prompt(state: SessionState, plan: SplicePlan) -> tuple[SplicePlan, token_ids.JsonIds | None]:
    """``plan`` with the engine's JSON list of its ids (the caller holds ``state.lock``)."""
    if plan.packed is None or not len(plan.packed):
        return plan, None
    state.engine_prompt = token_ids.JsonIds.extending(plan.packed, state.engine_prompt)
    return plan, state.engine_prompt


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: an outcome into ``future``, unless its call is gone (the future cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _background(work: Awaitable[T]) -> asyncio.Future[T]:
    """``work`` started now; its result (or error) is read later by whoever awaits it, maybe nobody (a call that
    failed first), so an error left unread is marked seen instead of logged as never retrieved."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


__all__ = ["Planned", "Planner", "plan_locked", "plan_without_wait"]

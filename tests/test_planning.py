"""addon/generation/planning.py: where a call is parsed and planned (the planning thread, or the loop for a lone
call of a known session), and that both places make the same plan and the same row's first half.

Real parts: the SmolLM2 tokenizer and template, each format's dialect, the session graph.
"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from addon.generation.planning import Planner
from addon.generation.recording import CallInfo
from addon.generation.render import PromptRenderer
from addon.generation.splice import SessionState, SpliceRenderer, record
from addon.generation.stats import Stats
from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson, unpack_json
from converters import dialect_for
from converters.base import UnknownFields
from converters.canonical import ConversionError
from tests.test_splice import ROUTES, completion, first_body, next_body, sampled


@pytest.fixture(scope="module")
def splicer(smollm2_tokenizer_dir) -> SpliceRenderer:
    return SpliceRenderer(PromptRenderer.from_pretrained(smollm2_tokenizer_dir))


def _planner(splicer: SpliceRenderer) -> Planner:
    return Planner(splicer, Stats(), UnknownFields(), CanonicalJson(), RequestFrames())


class _Where:
    """Which threads rendered a template (a splice's suffix, or a new root in full)."""

    def __init__(self, splicer: SpliceRenderer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.splices: list[bool] = []  # True: on the loop's (main) thread
        self.roots: list[bool] = []
        apply, render = splicer.apply, splicer.renderer.render
        on_loop = threading.main_thread

        def spy_apply(*a: Any, **k: Any) -> str:
            self.splices.append(threading.current_thread() is on_loop())
            return apply(*a, **k)

        def spy_render(*a: Any, **k: Any) -> Any:
            self.roots.append(threading.current_thread() is on_loop())
            return render(*a, **k)

        monkeypatch.setattr(splicer, "apply", spy_apply)
        monkeypatch.setattr(splicer, "where", self, raising=False)
        monkeypatch.setattr(splicer.renderer, "render", spy_render)


async def _tool_loop(
    planner: Planner, splicer: SpliceRenderer, fmt: str, session: str, *, lone: bool, turns: int = 3
) -> tuple[SessionState, dict[str, Any], list[Any]]:
    """A session's calls through ``planner.start``, each recorded in the graph as the generator would (the test's
    own renders of the sampled ids are left out of what a :class:`_Where` saw)."""
    state, body, out = SessionState(session), first_body(fmt), []
    for i in range(turns):
        info = CallInfo("run", session, ROUTES[fmt], {}, datetime.now(UTC), call_id=f"{session}{i}")
        request, planned, ahead = await planner.start(
            dialect_for(fmt), json.dumps(body).encode(), info, state, lone=lone
        )
        assert not isinstance(planned, ConversionError)
        prelude = await ahead
        assert prelude is not None
        comp = completion(i)
        spy = getattr(splicer, "where", None)
        seen = len(spy.splices) if spy is not None else 0
        ids = sampled(splicer, comp)
        if spy is not None:
            del spy.splices[seen:]
        record(state, info.call_id, request, planned[0], comp, ids, comp.finish_reason)
        out.append((planned, prelude))
        body = next_body(fmt, body, dialect_for(fmt).render_completion(comp), comp.tool_calls[0], f"line {i}\n")
    return state, body, out


@pytest.mark.parametrize("fmt", list(ROUTES))
async def test_a_lone_call_is_planned_on_the_loop_and_gets_what_the_thread_gives(
    fmt: str, splicer: SpliceRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _Where(splicer, monkeypatch)
    planner = _planner(splicer)
    _, _, lone = await _tool_loop(planner, splicer, fmt, "a", lone=True)
    # the first call (no earlier request) is rendered in full in the thread; the others splice on the loop
    assert where.roots == [False] and where.splices and all(where.splices)
    where.splices.clear()
    _, _, busy = await _tool_loop(planner, splicer, fmt, "b", lone=False)
    assert where.roots == [False, False] and where.splices and not any(where.splices)
    for (plan_a, pre_a), (plan_b, pre_b) in zip(lone, busy, strict=True):
        assert plan_a[0].prompt_ids == plan_b[0].prompt_ids and plan_a[0].reason == plan_b[0].reason
        assert plan_a[1] is not None and plan_b[1] is not None and plan_a[1].data == plan_b[1].data
        assert unpack_json(pre_a.request_canonical) == unpack_json(pre_b.request_canonical)
        assert pre_a.tokens == pre_b.tokens
    assert [p[0].reason for p, _ in lone] == ["first_call", "extends", "extends"]


async def test_a_lone_call_that_needs_a_new_root_is_rendered_in_the_thread(
    splicer: SpliceRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = _planner(splicer)
    state, body, _ = await _tool_loop(planner, splicer, "anthropic", "a", lone=True, turns=2)
    where = _Where(splicer, monkeypatch)
    compacted = {**body, "messages": [{"role": "user", "content": "Summary so far: read mod0."}, *body["messages"][3:]]}
    info = CallInfo("run", "a", ROUTES["anthropic"], {}, datetime.now(UTC), call_id="a9")
    _, planned, ahead = await planner.start(
        dialect_for("anthropic"), json.dumps(compacted).encode(), info, state, lone=True
    )
    assert not isinstance(planned, ConversionError) and planned[0].reason == "history_rewritten"
    assert where.roots == [False]  # the full render ran off the loop
    assert await ahead is not None


async def test_a_lone_call_s_row_half_is_built_once_the_task_waits_and_a_bad_body_raises(
    splicer: SpliceRenderer,
) -> None:
    planner = _planner(splicer)
    state, body, _ = await _tool_loop(planner, splicer, "chat", "a", lone=True, turns=1)
    info = CallInfo("run", "a", ROUTES["chat"], {}, datetime.now(UTC), call_id="a5")
    body["messages"].append({"role": "user", "content": "and then?"})
    _, _, ahead = await planner.start(dialect_for("chat"), json.dumps(body).encode(), info, state, lone=True)
    assert not ahead.done()  # built at the loop's next turn, while the engine request is on its way
    await asyncio.sleep(0)
    assert ahead.done() and ahead.result() is not None
    with pytest.raises(ConversionError):
        await planner.start(dialect_for("chat"), b'{"model": "m", "messages": 7}', info, state, lone=True)


async def test_a_lone_call_whose_session_lock_is_held_is_planned_in_the_thread(
    splicer: SpliceRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose client left may still be planning in a thread, holding its session's lock: the loop must not
    wait for it, so the next lone call of that session is planned in a thread (once the lock is free), the same."""
    planner = _planner(splicer)
    state, body, _ = await _tool_loop(planner, splicer, "chat", "a", lone=True, turns=2)
    where = _Where(splicer, monkeypatch)
    info = CallInfo("run", "a", ROUTES["chat"], {}, datetime.now(UTC), call_id="a7")
    state.lock.acquire()
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, state.lock.release)  # the other call's planning ends
    _, planned, _ = await planner.start(dialect_for("chat"), json.dumps(body).encode(), info, state, lone=True)
    assert not isinstance(planned, ConversionError) and planned[0].reason == "extends"
    assert where.splices and not any(where.splices)  # rendered in the thread, after the lock was released

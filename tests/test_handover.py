"""addon/generation/handover.py: a worker thread's work after a hand-over waits for the loop's release (or for
whoever awaits its result), never longer than HOLD_MAX_S, and the hand-over reaches the loop first."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from addon.generation import handover
from addon.generation.handover import Held, Hold, background, settle


def _thread(loop: asyncio.AbstractEventLoop, plan: asyncio.Future, hold: Hold, log: list[str]) -> str:
    loop.call_soon_threadsafe(settle, plan, "plan", None)
    hold.wait()
    log.append("held work")
    return "row"


async def test_the_held_work_starts_only_once_the_loop_has_released_it():
    loop = asyncio.get_running_loop()
    log: list[str] = []
    plan, hold = loop.create_future(), Hold()
    held = Held(asyncio.to_thread(_thread, loop, plan, hold, log), hold)
    assert await plan == "plan"
    await asyncio.sleep(0.05)  # the thread is waiting, not working
    log.append("engine asked")
    held.release()
    assert await held == "row"
    assert log == ["engine asked", "held work"]


async def test_awaiting_the_held_result_releases_it():
    loop = asyncio.get_running_loop()
    log: list[str] = []
    plan, hold = loop.create_future(), Hold()
    held = Held(asyncio.to_thread(_thread, loop, plan, hold, log), hold)
    await plan
    t0 = time.monotonic()
    assert await asyncio.wait_for(held, 5) == "row"  # no release() call: the await is one
    assert time.monotonic() - t0 < handover.HOLD_MAX_S and log == ["held work"]


async def test_a_hold_nobody_releases_lets_the_work_go_after_its_bound(monkeypatch):
    monkeypatch.setattr(handover, "HOLD_MAX_S", 0.02)
    hold = Hold()
    t0 = time.monotonic()
    await asyncio.to_thread(hold.wait)
    assert 0.015 <= time.monotonic() - t0 < 2


async def test_settle_leaves_a_cancelled_call_alone_and_background_marks_errors_seen():
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    gone.cancel()
    settle(gone, "late", None)  # no InvalidStateError: the call went away first
    failing = loop.create_future()
    settle(failing, None, ValueError("bad body"))
    with pytest.raises(ValueError, match="bad body"):
        await failing

    async def boom() -> None:
        raise RuntimeError("nobody reads this")

    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        for spawn in (background, asyncio.ensure_future):  # ours, then asyncio's own, which does report it
            task = spawn(boom())
            await asyncio.sleep(0)
            del task
            gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert [c["message"] for c in reported] == ["Task exception was never retrieved"]

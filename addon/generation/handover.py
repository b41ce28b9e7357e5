"""How a call's work crosses between the event loop and the worker thread that plans it.

Contract
--------
A call is parsed and planned in a worker thread, which hands the plan to the loop at once (:func:`settle`, through
``call_soon_threadsafe``) and then goes on to build the call's row's first half while the engine samples. That later
work waits in the thread (:meth:`Hold.wait`) until the loop lets it go: :meth:`Held.release` once the engine request
is on its way, or awaiting the :class:`Held` result (whoever needs the row's first half releases it first), and at
the latest after :data:`HOLD_MAX_S`, a bound for a path that forgot to release.

Why hold it back: CPython's GIL. A thread that hands a result to the loop and goes straight on with pure-Python
work keeps the GIL, and the loop, woken by ``call_soon_threadsafe``, waits for it until that work ends (or the
interpreter's 5 ms switch interval passes). Measured in process: a hand-over followed by 0.7 / 3.4 ms of Python
work reached the loop after 0.84 / 3.54 ms, and after 0.04 / 0.05 ms when the work waited for the loop's release.
On a call's path that put the row's first half (~0.7 / 1.2 / 3.4 ms at 8k / 32k / 128k tokens) in front of the
engine request, where it was meant to run alongside the engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The longest a thread's held work waits for the loop's release: the loop releases within a millisecond on every
# path it knows; this bounds one it does not (the work then runs late, never not at all).
HOLD_MAX_S = 0.25


class Hold:
    """The gate between a hand-over and the work after it: the thread waits, the loop releases."""

    def __init__(self) -> None:
        self._go = threading.Event()

    def wait(self) -> None:
        """In the worker thread: block (the GIL released) until the loop lets the held work go."""
        self._go.wait(HOLD_MAX_S)

    def release(self) -> None:
        self._go.set()


class Held(Generic[T]):
    """The result of a worker thread's work that runs after a :class:`Hold`: started now, awaited later (maybe by
    nobody: a call that failed first); awaiting it releases the hold first, so it can never wait on itself."""

    def __init__(self, work: Awaitable[T], hold: Hold) -> None:
        self._task = background(work)
        self._hold = hold

    def release(self) -> None:
        self._hold.release()

    def __await__(self) -> Generator[Any, None, T]:
        self._hold.release()
        return self._task.__await__()


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: a worker thread's outcome into ``future``, unless its call is gone (the future cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def background(work: Awaitable[T]) -> asyncio.Future[T]:
    """``work`` started now; its result (or error) is read later by whoever awaits it, maybe nobody (a call that
    failed first), so an error left unread is marked seen instead of logged as never retrieved."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task

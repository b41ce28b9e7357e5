"""Background tasks on the proxy's event loop, kept referenced so they are not garbage-collected mid-flight.

``spawn(coro, name)`` is the only way the addon starts a background task (ruff bans raw ``asyncio.create_task``);
exceptions are logged, never lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("harnessrl.aio")
_tasks: set[asyncio.Task[Any]] = set()  # strong references until done; the loop only keeps weak ones


def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    task = asyncio.create_task(coro, name=name)  # noqa: TID251 - this is the one sanctioned place
    _tasks.add(task)
    task.add_done_callback(_done)
    return task


def _done(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())

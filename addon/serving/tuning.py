"""Process-wide tuning of the proxy's collector and C allocator, applied once by the runtime.

Contract
--------
:class:`ProcessTuning` (from the ``harnessrl_gc_young``, ``harnessrl_malloc_arenas`` and ``harnessrl_trim_every``
options) is applied in two steps, each returning what it did, for the log: :func:`apply_allocator` first thing
when the runtime starts, :func:`apply_collector` when it has bound (tokenizer loaded):

- ``gc_young`` > 0: the collector's youngest-generation threshold (Python's default is 700) and a
  :func:`gc.freeze` of everything alive at start-up (modules, the tokenizer, the chat template). A long
  conversation's request parses into many containers at once, so at 700 the collector ran again and again while
  parsing and promoted live request objects into the old generations; its full passes then walked the start-up
  heap again each time (measured, 192 sessions x 120 s: 11.4 s in the collector at Python's defaults, 6.2 s at
  5000, 4.5 s at 20000, which also held ~100 MiB more; docs/benchmarks.md);
- ``malloc_arenas`` > 0: glibc's ``M_ARENA_MAX`` (worker threads otherwise each get an arena that keeps its peak);
- ``trim_every`` > 0: :class:`Trimmer` returns glibc's free memory to the system (``malloc_trim``) at most that
  often, from a worker thread, when it holds more than ``trim_above_mib`` free.

Where the C library is not glibc the allocator settings are skipped and that is logged once.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time
from dataclasses import dataclass

from addon.serving import memory

log = logging.getLogger("harnessrl.tuning")

M_ARENA_MAX = -8  # glibc's mallopt parameter number


@dataclass(frozen=True)
class ProcessTuning:
    gc_young: int = 5_000
    malloc_arenas: int = 2
    trim_every: float = 30.0
    trim_above_mib: float = 64.0

    def __post_init__(self) -> None:
        if self.gc_young < 0 or self.malloc_arenas < 0 or self.trim_every < 0:
            raise ValueError("harnessrl_gc_young, harnessrl_malloc_arenas and harnessrl_trim_every must be >= 0")


def apply(tuning: ProcessTuning) -> list[str]:
    """Both settings at once (:func:`apply_allocator`, then :func:`apply_collector`)."""
    return apply_allocator(tuning) + apply_collector(tuning)


def apply_allocator(tuning: ProcessTuning) -> list[str]:
    """The arena cap: before the first worker thread allocates (each thread that allocates before it keeps its own
    arena), so the runtime applies it first thing at start."""
    if not tuning.malloc_arenas:
        return []
    lib = memory.libc()
    if lib is None:
        log.info("harnessrl: not glibc; harnessrl_malloc_arenas=%d ignored", tuning.malloc_arenas)
        return []
    if lib.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(tuning.malloc_arenas)) != 1:
        return []
    return [f"malloc arenas <= {tuning.malloc_arenas}"]


def apply_collector(tuning: ProcessTuning) -> list[str]:
    """The young threshold and the freeze: after the tokenizer loaded, so that it is frozen with the rest."""
    if not tuning.gc_young:
        return []
    gc.collect()
    gc.freeze()  # start-up objects leave the collector's generations for good
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(tuning.gc_young, older, oldest)
    return [f"gc young threshold {tuning.gc_young}, {gc.get_freeze_count()} start-up objects frozen"]


class Trimmer:
    """Call :meth:`maybe_trim` often (the runtime's one-second poll); it trims at most every ``trim_every`` s."""

    def __init__(self, tuning: ProcessTuning, clock=time.monotonic) -> None:
        self.tuning = tuning
        self._clock = clock
        self._last = clock()
        self.trims = 0
        self.returned_mib = 0.0

    async def maybe_trim(self) -> None:
        if not self.tuning.trim_every or self._clock() - self._last < self.tuning.trim_every:
            return
        self._last = self._clock()
        result = await asyncio.to_thread(self._trim_if_worth_it)  # mallinfo2 walks every arena: off the loop
        if result is not None:
            self.trims += 1
            self.returned_mib += max(0.0, result["rss_before_mib"] - result["rss_after_mib"])

    def _trim_if_worth_it(self) -> dict[str, float] | None:
        info = memory.malloc_info()
        if info is None or info["free_held_mib"] < self.tuning.trim_above_mib:
            return None
        return memory.trim()


__all__ = ["ProcessTuning", "Trimmer", "apply", "apply_allocator", "apply_collector"]

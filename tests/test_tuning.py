"""addon/serving/tuning.py: the collector and allocator settings the runtime applies at bind, and the trimmer's pacing
(the effect on time and memory is measured by benchmarks/soak.py, not here)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from addon.serving import memory, tuning
from addon.serving.tuning import ProcessTuning, Trimmer


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_apply_raises_the_young_threshold_and_freezes_the_start_up_heap(restore_gc: None) -> None:
    done = tuning.apply(ProcessTuning(gc_young=12_345, malloc_arenas=0))
    assert gc.get_threshold()[0] == 12_345
    assert gc.get_freeze_count() > 1000
    assert done[0].startswith("gc young threshold 12345")


def test_zero_leaves_the_interpreter_alone(restore_gc: None) -> None:
    before = gc.get_threshold()
    assert tuning.apply(ProcessTuning(gc_young=0, malloc_arenas=0, trim_every=0)) == []
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


@pytest.mark.skipif(memory.libc() is None, reason="glibc only")
def test_the_arena_cap_is_set_through_mallopt(restore_gc: None) -> None:
    assert tuning.apply(ProcessTuning(gc_young=0, malloc_arenas=2)) == ["malloc arenas <= 2"]


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="harnessrl_gc_young"):
        ProcessTuning(gc_young=-1)


@pytest.mark.skipif(memory.libc() is None, reason="glibc only")
def test_the_trimmer_trims_only_when_due() -> None:
    now = [0.0]
    trimmer = Trimmer(ProcessTuning(trim_every=30.0, trim_above_mib=0.0), clock=lambda: now[0])
    asyncio.run(trimmer.maybe_trim())
    assert trimmer.trims == 0  # not due yet
    now[0] = 31.0
    asyncio.run(trimmer.maybe_trim())
    assert trimmer.trims == 1 and trimmer.returned_mib >= 0.0
    now[0] = 40.0
    asyncio.run(trimmer.maybe_trim())
    assert trimmer.trims == 1  # the next one is due at 61 s
    never = Trimmer(ProcessTuning(trim_every=0.0, trim_above_mib=0.0), clock=lambda: now[0])
    now[0] = 1e6
    asyncio.run(never.maybe_trim())
    assert never.trims == 0


@pytest.mark.skipif(memory.libc() is None, reason="glibc only")
def test_the_trimmer_skips_when_little_is_held_free() -> None:
    now = [100.0]
    trimmer = Trimmer(ProcessTuning(trim_every=1.0, trim_above_mib=1e9), clock=lambda: now[0])
    now[0] = 200.0
    asyncio.run(trimmer.maybe_trim())
    assert trimmer.trims == 0

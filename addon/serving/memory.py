"""Where the proxy's memory goes: the admin ``memory`` route's report.

Contract
--------
:func:`memory_report` returns a JSON-able dict, built in the calling thread (the server runs it in a worker thread:
walking the heap takes a while):

- ``rss_mib``: the process's resident set (``/proc/self/statm``);
- ``malloc``: glibc's own view (``mallinfo2``): bytes the C allocator has handed out (``in_use_mib``), bytes it holds
  free but has not returned to the system (``free_held_mib``: fragmentation), and in how many arenas; absent where
  the C library is not glibc;
- ``mappings``: resident memory by kind of mapping (:func:`mappings`), and ``arrow``: Arrow's memory pool;
- ``python``: objects the collector tracks, by type (the ``top`` largest counts), and pymalloc's block count;
- ``structures``: what the caller's probes report (session graphs, token ids held, cached JSON, buffered records…),
  so a growth can be matched to a cap;
- ``tracemalloc``: when the process runs with tracing on (``PYTHONTRACEMALLOC=N`` in mitmdump's environment), the
  ``top`` source lines by live bytes; else ``null``.

Nothing here changes state: it reads. :func:`trim` (a separate admin action, and
:class:`addon.serving.tuning.Trimmer`) asks
glibc to return free memory to the system and reports the RSS before and after, which tells fragmentation from live
data.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

_MIB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def libc() -> ctypes.CDLL | None:
    """glibc, loaded once; None elsewhere (no ``mallinfo2``)."""
    return _LIBC


def _load_libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if lib is None or not hasattr(lib, "mallinfo2"):
        return None
    lib.mallinfo2.restype = _MallInfo2
    return lib


_LIBC = _load_libc()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MIB


def malloc_info() -> dict[str, float] | None:
    lib = libc()
    if lib is None:
        return None
    info = lib.mallinfo2()
    return {
        "in_use_mib": round((info.uordblks + info.hblkhd) / _MIB, 1),
        "free_held_mib": round(info.fordblks / _MIB, 1),
        "mmapped_mib": round(info.hblkhd / _MIB, 1),
        "arena_mib": round(info.arena / _MIB, 1),
    }


def mappings() -> dict[str, dict[str, float]]:
    """Resident memory by kind of mapping (``/proc/self/smaps``): glibc's main heap, anonymous maps (glibc's thread
    arenas, CPython's small-object arenas, large buffers, Arrow's allocator: the kernel merges adjacent ones, so they
    cannot be told apart here), file-backed maps (code, shared libraries) and the rest (stack, vdso)."""
    kinds: dict[str, list[float]] = {}
    kind = "file"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    fields = line.split()
                    name = fields[5] if len(fields) > 5 else ""
                    kind = (
                        "heap" if name == "[heap]" else "file" if name.startswith("/") else "other" if name else "anon"
                    )
                elif head == "Rss:":
                    entry = kinds.setdefault(kind, [0.0, 0.0])
                    entry[0] += int(line.split()[1]) / 1024
                    entry[1] += 1
    except OSError:
        return {}
    return {k: {"rss_mib": round(v[0], 1), "maps": int(v[1])} for k, v in sorted(kinds.items())}


def arrow_pool() -> dict[str, Any] | None:
    try:
        import pyarrow as pa
    except ImportError:
        return None
    pool = pa.default_memory_pool()
    return {
        "backend": pool.backend_name,
        "allocated_mib": round(pool.bytes_allocated() / _MIB, 1),
        "peak_mib": round(pool.max_memory() / _MIB, 1),
    }


def trim() -> dict[str, float]:
    """``malloc_trim(0)``: glibc returns the free memory it holds; RSS before and after."""
    before = rss_mib()
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)
    return {"rss_before_mib": round(before, 1), "rss_after_mib": round(rss_mib(), 1)}


def memory_report(probes: Mapping[str, Callable[[], Any]], top: int = 20, walk: bool = True) -> dict[str, Any]:
    """``walk=False`` skips the heap walk (objects by type, tracemalloc, mappings): cheap enough to sample often."""
    if not walk:
        return {"rss_mib": round(rss_mib(), 1), "malloc": malloc_info(), "structures": _probe(probes)}
    types = Counter(type(o).__name__ for o in gc.get_objects())
    structures = _probe(probes)
    traced = None
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        current, peak = tracemalloc.get_traced_memory()
        traced = {
            "traced_mib": round(current / _MIB, 1),
            "peak_mib": round(peak / _MIB, 1),
            "top": [
                {"where": str(s.traceback), "mib": round(s.size / _MIB, 2), "blocks": s.count}
                for s in snapshot.statistics("lineno")[:top]
            ],
        }
    return {
        "rss_mib": round(rss_mib(), 1),
        "malloc": malloc_info(),
        "mappings": mappings(),
        "arrow": arrow_pool(),
        "python": {"allocated_blocks": sys.getallocatedblocks(), "gc_objects_by_type": dict(types.most_common(top))},
        "structures": structures,
        "tracemalloc": traced,
    }


def _probe(probes: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    structures: dict[str, Any] = {}
    for name, probe in probes.items():
        try:
            structures[name] = probe()
        except Exception as e:  # noqa: BLE001 - a report must not fail on one probe
            structures[name] = f"error: {e!r}"
    return structures


__all__ = ["libc", "malloc_info", "memory_report", "rss_mib", "trim"]

"""Proxy statistics for the admin surface: calls, errors by kind, calls/s and p50/p99 proxy overhead.

Contract: one :class:`Stats` per proxy process, touched only from the event loop (but :meth:`items_parsed`, called
from the parsing threads under its own lock). Overhead is the proxy's own time
per call — parsing and rendering before the engine is asked, plus finishing after the engine's last token — kept in
a bounded window so memory stays flat however long the proxy runs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Stats:
    def __init__(self, window: int = 10_000, clock=time.monotonic) -> None:
        self._clock = clock
        self.started = clock()
        # the engine is bound and the tokenizer loaded: calls are answered without start-up work (a benchmark waits
        # for it, so that the ~1 s of CPU a start-up takes is not counted as the first calls' cost)
        self.ready = False
        self.calls = 0
        self.completion_tokens = 0
        self.errors: Counter[str] = Counter()
        self.missing_logprob_tokens = 0  # sampled tokens the engine sent no logprob for (recorded as NaN)
        self.missing_logprob_calls = 0
        self.splices: Counter[str] = Counter()  # "extends" or the fork reason of each spliced call
        # conversation items of the requests parsed, and those taken from the session's previous request
        self.items = {"parsed": 0, "reused": 0}
        self._items_lock = threading.Lock()
        self._overhead_in: deque[float] = deque(maxlen=window)
        self._overhead_out: deque[float] = deque(maxlen=window)
        self._done_at: deque[float] = deque(maxlen=window)

    def overhead_in(self, seconds: float) -> None:
        self._overhead_in.append(seconds)

    def call_done(self, finish_seconds: float, completion_tokens: int) -> None:
        self.calls += 1
        self.completion_tokens += completion_tokens
        self._overhead_out.append(finish_seconds)
        self._done_at.append(self._clock())

    def _forks(self) -> int:
        """Calls that could not extend an earlier call (a session's first call is not a fork)."""
        return sum(n for reason, n in self.splices.items() if reason not in ("extends", "first_call"))

    def splice(self, reason: str) -> None:
        self.splices[reason] += 1

    def missing_logprobs(self, tokens: int) -> None:
        self.missing_logprob_tokens += tokens
        self.missing_logprob_calls += 1

    def items_parsed(self, parsed: int, reused: int) -> None:
        with self._items_lock:
            self.items["parsed"] += parsed
            self.items["reused"] += reused

    def error(self, kind: str) -> None:
        self.errors[kind] += 1

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        recent = [t for t in self._done_at if now - t <= 60.0]
        total = [a + b for a, b in zip(self._overhead_in, self._overhead_out, strict=False)]
        return {
            "uptime_s": round(now - self.started, 3),
            "ready": self.ready,
            "calls": self.calls,
            "completion_tokens": self.completion_tokens,
            "calls_per_s_last_60s": round(len(recent) / 60.0, 3),
            "errors": dict(self.errors),
            "missing_logprobs": {"tokens": self.missing_logprob_tokens, "calls": self.missing_logprob_calls},
            "splice": dict(self.splices),
            "request_items": dict(self.items),
            "fork_ratio": round(self._forks() / max(1, sum(self.splices.values())), 4),
            "overhead_ms": {
                "p50": round(_percentile(total, 0.5) * 1e3, 3),
                "p99": round(_percentile(total, 0.99) * 1e3, 3),
                "before_engine_p50": round(_percentile(list(self._overhead_in), 0.5) * 1e3, 3),
                "after_engine_p50": round(_percentile(list(self._overhead_out), 0.5) * 1e3, 3),
            },
        }

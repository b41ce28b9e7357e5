"""Rollout sessions: which session a call belongs to, and each session's counters and budget.

Contract
--------
``attribute(sources, evidence)`` picks the session id from the first source in ``sources`` that has one:

* ``proxyauth`` — the user name of ``HTTPS_PROXY=http://SESSION:token@host:port`` (mitmproxy's proxyauth puts it in
  ``flow.metadata["proxyauth"]``). The default in regular mode: it works for every harness without touching its
  API key (a session id inside the key would leak into graders).
* ``prefix`` — reverse/base-URL mode: ``/s/<session>/...`` in the path.
* ``header`` — an explicit ``x-harnessrl-session`` header.
* ``api_key`` — the API key itself (opt-in only).

A call nobody attributes goes to the session ``unattributed`` and is flagged. The harness's own ids
(``x-claude-code-session-id``, ``session-id``, ``prompt_cache_key`` …) are recorded by the converters, never used here.

:class:`SessionRegistry` keeps per-session call counts, token counts and start time, and decides budget stops. It is
used only from the event loop (no locks); record I/O happens elsewhere. ``close(id)`` (the collector's
``POST .../sessions/{id}/close``) marks the session closed and runs the ``on_close`` callbacks (the generator
forgets the session's prefix graph there); a closed session that calls again is served as a new one would be
(its counters go on; its next prompt is rendered in full).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

SessionSource: TypeAlias = Literal["proxyauth", "prefix", "header", "api_key"]
SESSION_SOURCES: tuple[SessionSource, ...] = ("proxyauth", "prefix", "header", "api_key")
DEFAULT_SOURCES: tuple[SessionSource, ...] = ("proxyauth", "prefix", "header")
SESSION_HEADER = "x-harnessrl-session"
UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class Evidence:
    """What a request offers for attribution."""

    proxyauth_user: str | None = None
    prefix_session: str | None = None
    header_session: str | None = None
    api_key: str | None = None


def parse_sources(text: str) -> tuple[SessionSource, ...]:
    """Parse ``"proxyauth,prefix,header"``; raise ValueError naming the valid choices."""
    out: list[SessionSource] = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name not in SESSION_SOURCES:
            raise ValueError(f"unknown session source {name!r}; choose from {', '.join(SESSION_SOURCES)}")
        out.append(name)  # type: ignore[arg-type]  # checked just above
    if not out:
        raise ValueError("at least one session source is needed")
    return tuple(out)


def api_key(headers: Mapping[str, str]) -> str | None:
    """The caller's API key, in whichever vendor header it came (``headers`` read case-insensitively or lower-cased)."""
    value = headers.get("authorization", "")
    bearer = value[7:] if value.lower().startswith("bearer ") else None
    return headers.get("x-api-key") or headers.get("x-goog-api-key") or bearer


def attribute(sources: Iterable[SessionSource], evidence: Evidence) -> tuple[str, SessionSource | None]:
    """The session id and the source that gave it; ``(UNATTRIBUTED, None)`` when none did."""
    values: dict[SessionSource, str | None] = {
        "proxyauth": evidence.proxyauth_user,
        "prefix": evidence.prefix_session,
        "header": evidence.header_session,
        "api_key": evidence.api_key,
    }
    for source in sources:
        value = values[source]
        if value:
            return value, source
    return UNATTRIBUTED, None


@dataclass(frozen=True)
class Budget:
    """Per-session caps; ``None`` means no cap. A call past a cap gets a normal final answer (a budget stop)."""

    max_calls: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_calls", "max_tokens", "max_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"budget {name} must be positive or unset, got {value}")


@dataclass
class SessionCounters:
    id: str
    started: float
    last_active: float
    calls: int = 0
    tokens: int = 0
    errors: int = 0
    budget_stops: int = 0
    closed: bool = False
    harness: str | None = None
    formats: set[str] = field(default_factory=set)


class SessionRegistry:
    """Per-session counters. ``begin_call`` hands out call indices and says whether the budget is spent."""

    def __init__(self, budget: Budget, clock=time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._sessions: dict[str, SessionCounters] = {}
        self._on_close: list[Callable[[str], object]] = []

    def on_close(self, callback: Callable[[str], object]) -> None:
        """Call ``callback(session_id)`` whenever a session is closed (to free what is kept per session)."""
        self._on_close.append(callback)

    def get(self, session_id: str) -> SessionCounters:
        state = self._sessions.get(session_id)
        if state is None:
            now = self._clock()
            state = self._sessions[session_id] = SessionCounters(session_id, started=now, last_active=now)
        return state

    def begin_call(self, session_id: str) -> tuple[int, str | None]:
        """Return (call index, budget-stop reason or None) and count the call."""
        state = self.get(session_id)
        state.last_active = self._clock()
        index = state.calls
        state.calls += 1
        reason = self._budget_reason(state)
        if reason:
            state.budget_stops += 1
        return index, reason

    def end_call(self, session_id: str, tokens: int, error: bool = False) -> None:
        state = self.get(session_id)
        state.tokens += tokens
        state.errors += int(error)
        state.last_active = self._clock()

    def close(self, session_id: str) -> SessionCounters | None:
        state = self._sessions.get(session_id)
        if state is not None:
            state.closed = True
        for callback in self._on_close:
            callback(session_id)
        return state

    def __len__(self) -> int:
        return len(self._sessions)

    def snapshot(self) -> list[SessionCounters]:
        return list(self._sessions.values())

    def _budget_reason(self, state: SessionCounters) -> str | None:
        b = self.budget
        # The call being begun is number state.calls; more than max_calls calls is over budget.
        if b.max_calls is not None and state.calls > b.max_calls:
            return f"max_calls={b.max_calls}"
        if b.max_tokens is not None and state.tokens >= b.max_tokens:
            return f"max_tokens={b.max_tokens}"
        if b.max_seconds is not None and self._clock() - state.started >= b.max_seconds:
            return f"max_seconds={b.max_seconds:g}"
        return None

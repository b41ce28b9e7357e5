"""Several vLLM servers behind one proxy, with session affinity.

Contract
--------
* :func:`parse_engine_urls` turns the ``harnessrl_engine_url`` / ``--engine-url`` text (one or more http(s) URLs,
  comma-separated) into a tuple of distinct URLs, or raises ``ValueError`` saying what to change.
* Routing: a session's engine is the first *up* engine in the session's rendezvous order (highest-random-weight
  hashing: each ``(session, url)`` pair gets a hash score, the order is by decreasing score). So every call of a
  session reaches the same engine, whose prefix cache holds the session's growing prompt; sessions spread evenly;
  adding or removing an engine moves only the sessions whose first choice it is (about 1/N of them).
* Failover, and why not a 503: every engine serves the same model and the proxy sends token ids, so any engine
  continues a session token-faithfully; moving costs one prefix-cache miss, while refusing would stall every episode
  on that engine until it returns. An engine is *down* only after a refused or dropped connection (on a call or on
  the poll) or a call's connect timeout; its sessions go to the next up engine in their own rendezvous order (so they
  spread over the others rather than piling onto one), and come back when the poll finds it up again. Each
  transition is logged once (warning when down, info when back). A call whose engine fails before the first chunk is
  sent again to the next engine (nothing has reached the client or the record yet); a failure after the first chunk
  ends the call as with one engine (incomplete record, in-stream error).
* Busy is not dead: a poll that gets no answer within ``poll_timeout`` (vLLM's API server starved by a long prefill
  on a small machine) is logged once as *busy* and changes nothing; an engine streaming calls is alive however slow
  its poll. A busy engine's calls wait for it: the gap allowed between two chunks is ``max(wait_s, 60 s)``.
* Waiting, not refusing: when no engine can take a call (every candidate refused it, or none is verified yet) the
  call retries (0.25 s, doubling to 2 s) until ``wait_s`` (``harnessrl_engine_wait_s``) has passed since it arrived;
  down engines stay candidates, so an engine that comes back takes it. Only then does it fail with
  :class:`NoEngine` (the vendor's retryable 503/529 with ``retry-after``), whose message names that limit; the wait
  a call did is in :attr:`Routed.waited_s` (recorded as ``engine_wait_ms``).
* Model: :meth:`EnginePool.bind` asks every engine's ``/v1/models``; those answering must serve the same model id
  (else :class:`EngineError` naming each), and the context is the smallest reported. An engine not answering then is
  *unverified* and gets no call until a poll finds it serving that model; so does a down engine that comes back
  (it may have been restarted with another model, which leaves it unverified, logged once). :func:`check_engines`
  (collect) is stricter: every engine must be healthy and agree.
* Policy version: each engine has its own weight version, read from ``/weight_info`` by :meth:`EnginePool.poll`
  (the runtime runs it every second) or set for every engine by :meth:`set_policy_version` (the trainer's push after
  it synced all of them). :meth:`stream` yields with each chunk a :class:`Routed` snapshot taken when the request was
  sent, so a record carries the version of the engine that produced it.

The pool's state changes only on the proxy's event loop (no locks). Layout: URL parsing and the rendezvous order,
per-engine state, the pool, the collect-time check.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal

from addon.engine.client import (
    ClientTimeouts,
    EngineClient,
    EngineConnectTimeout,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerationChunk,
    GenerationRequest,
    ModelInfo,
)

log = logging.getLogger("harnessrl.engine_pool")

EngineStatus = Literal["up", "down", "unverified"]
POLL_TIMEOUT_S = 5.0  # a poll slower than this is logged as busy; it never marks an engine down
DEFAULT_WAIT_S = 600.0  # harnessrl_engine_wait_s
MIN_CHUNK_GAP_S = 60.0
WAIT_FIRST_RETRY_S = 0.25  # a call that found no engine retries after this, doubling up to WAIT_MAX_RETRY_S
WAIT_MAX_RETRY_S = 2.0


def parse_engine_urls(text: str) -> tuple[str, ...]:
    """``"http://a:8000, http://b:8000/"`` -> ``("http://a:8000", "http://b:8000")``."""
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    if not urls:
        raise ValueError("no engine URL given: name one, or several separated by commas")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"engine URLs must be http(s) URLs, got {', '.join(map(repr, bad))}")
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    if dupes:
        raise ValueError(f"engine URL listed twice: {', '.join(dupes)} (each replica once)")
    return urls


def rendezvous_score(session_id: str, url: str) -> int:
    digest = hashlib.blake2b(f"{session_id}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(session_id: str, urls: Sequence[str]) -> list[str]:
    """The session's preference order over ``urls``: it depends only on the session and each URL, never on the list's
    order or on which other URLs are in it."""
    return sorted(urls, key=lambda u: rendezvous_score(session_id, u), reverse=True)


@dataclass(frozen=True)
class Routed:
    """Which engine a call went to, its weight version when the request was sent, and how long the call waited for
    an engine that could take it (0 when no retry pause was needed; an immediate failover is not a wait)."""

    url: str
    policy_version: int | None
    waited_s: float = 0.0


class NoEngine(EngineUnavailable):
    """No engine took the call within the pool's wait (``harnessrl_engine_wait_s``): the vendor's retryable error."""

    def __init__(self, message: str, waited_s: float) -> None:
        super().__init__(message)
        self.waited_s = waited_s


class PoolEngine:
    """One engine's client and what the pool knows of it."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.url = client.base_url
        self.status: EngineStatus = "unverified"
        self.policy_version: int | None = None
        self.refused: str | None = None  # why a poll refused it (another model), logged once
        self.in_flight = 0  # calls streaming from it now: an engine with calls in flight is alive, however slow
        self.slow_polls = 0  # polls it did not answer in time (busy, not down)
        self.slow = False  # the last poll timed out (logged once per transition)

    def __repr__(self) -> str:
        return f"PoolEngine({self.url!r}, {self.status}, version={self.policy_version})"


class EnginePool:
    """N engine clients; ``stream(session, request)`` sends each call to its session's engine."""

    def __init__(
        self, clients: Sequence[EngineClient], poll_timeout: float = POLL_TIMEOUT_S, wait_s: float = DEFAULT_WAIT_S
    ) -> None:
        if not clients:
            raise ValueError("an engine pool needs at least one engine")
        self.engines = tuple(PoolEngine(c) for c in clients)
        self._by_url = {e.url: e for e in self.engines}
        if len(self._by_url) != len(self.engines):
            raise ValueError("engine URL listed twice")
        self.poll_timeout = poll_timeout
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        self.wait_s = wait_s
        self.model: ModelInfo | None = None  # set by bind()
        self.failovers = 0  # calls sent again to another engine after theirs failed before the first chunk

    @classmethod
    def from_urls(cls, urls: Sequence[str], wait_s: float = DEFAULT_WAIT_S) -> EnginePool:
        # a busy engine may go quiet between chunks (a long prefill queued behind others) for as long as a call may
        # wait for an engine at all; never less than a minute, so wait_s=0 only means "do not wait for a down one"
        timeouts = ClientTimeouts(generate=max(wait_s, MIN_CHUNK_GAP_S))
        return cls([EngineClient(u, timeouts=timeouts) for u in urls], wait_s=wait_s)

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self._by_url)

    def describe(self) -> str:
        return ", ".join(self.urls)

    async def aclose(self) -> None:
        await asyncio.gather(*(e.client.aclose() for e in self.engines))

    # -- routing --

    def candidates(self, session_id: str) -> list[PoolEngine]:
        """Engines to try for a call of ``session_id``: up ones in rendezvous order, then down ones (last resort)."""
        ordered = [self._by_url[u] for u in rendezvous_order(session_id, self.urls)]
        return [e for e in ordered if e.status == "up"] + [e for e in ordered if e.status == "down"]

    def pick(self, session_id: str) -> PoolEngine | None:
        """The engine the session's next call goes to (None while no engine is known to serve the model)."""
        found = self.candidates(session_id)
        return found[0] if found else None

    def policy_version_for(self, session_id: str) -> int | None:
        """The weight version of the engine the session's next call would go to (a call that never reaches an
        engine is recorded with it)."""
        engine = self.pick(session_id)
        return engine.policy_version if engine is not None else None

    async def stream(
        self, session_id: str, req: GenerationRequest
    ) -> AsyncGenerator[tuple[Routed, GenerationChunk], None]:
        """The engine's chunks for one call of ``session_id``, each with where it came from (see the failover and
        waiting rules in the module docstring)."""
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        tried: list[str] = []
        last: EngineError | None = None
        delay = WAIT_FIRST_RETRY_S
        while True:
            for engine in self.candidates(session_id):
                if tried and engine.url not in tried:
                    self.failovers += 1
                started = False
                engine.in_flight += 1
                try:
                    async with aclosing(engine.client.stream(req)) as chunks:  # closed at once if the caller leaves
                        async for chunk in chunks:
                            if not started:
                                started = True
                                self._mark_up(engine)
                                waited = time.monotonic() - t0 if delay > WAIT_FIRST_RETRY_S else 0.0  # slept
                                routed = Routed(engine.url, engine.policy_version, waited)
                            yield routed, chunk
                    return
                except (EngineUnavailable, EngineConnectTimeout) as e:  # unreachable, not slow
                    self._mark_down(engine, e)
                    if started:
                        raise
                    if engine.url not in tried:
                        tried.append(engine.url)
                        log.warning(
                            "harnessrl: session %s: %s failed before the first token (%s)", session_id, engine.url, e
                        )
                    last = e
                finally:
                    engine.in_flight -= 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if delay == WAIT_FIRST_RETRY_S:
                log.info(
                    "harnessrl: session %s: no engine can take the call yet; waiting up to %.0f s "
                    "(harnessrl_engine_wait_s)",
                    session_id,
                    remaining,
                )
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, WAIT_MAX_RETRY_S)
        waited = time.monotonic() - t0
        if last is not None:
            raise NoEngine(
                f"no engine took the call within harnessrl_engine_wait_s={self.wait_s:g} s "
                f"({', '.join(tried)}): {last.message}",
                waited,
            ) from last
        raise NoEngine(
            f"no engine is known to serve the model yet ({self.describe()}; waited {waited:.1f} s, "
            f"harnessrl_engine_wait_s={self.wait_s:g})",
            waited,
        )

    # -- state --

    def _mark_down(self, engine: PoolEngine, why: Exception) -> None:
        if engine.status == "up":
            log.warning(
                "harnessrl: engine %s is down (%s); its sessions move to their next engine in rendezvous order",
                engine.url,
                why,
            )
            engine.status = "down"

    def _mark_up(self, engine: PoolEngine) -> None:
        if engine.status == "down":
            log.info("harnessrl: engine %s is back; its sessions return to it", engine.url)
        elif engine.status == "unverified":
            log.info("harnessrl: engine %s serves %s; it takes its share of sessions", engine.url, self._model_id())
        engine.status = "up"

    def _model_id(self) -> str:
        return self.model.id if self.model is not None else "?"

    def set_policy_version(self, version: int | None) -> None:
        """The trainer's push after syncing every engine; the next poll corrects any engine that differs."""
        for engine in self.engines:
            engine.policy_version = version

    async def bind(self) -> ModelInfo:
        """Ask every engine what it serves; the answering ones must agree. Returns the model (smallest context)."""
        answers = await asyncio.gather(*(_first_model(e.client) for e in self.engines), return_exceptions=True)
        served: dict[str, ModelInfo] = {}
        failures: list[str] = []
        for engine, answer in zip(self.engines, answers, strict=True):
            if isinstance(answer, ModelInfo):
                served[engine.url] = answer
            elif isinstance(answer, EngineError):
                failures.append(f"{engine.url}: {answer}")
            else:
                raise answer
        if not served:
            raise EngineUnavailable(f"no engine answers /v1/models: {'; '.join(failures)}")
        ids = {m.id for m in served.values()}
        if len(ids) > 1:
            detail = ", ".join(f"{u} serves {m.id!r}" for u, m in served.items())
            raise EngineError(f"the engines serve different models ({detail}): every replica must serve one model")
        first = next(iter(served.values()))
        contexts = [m.max_model_len for m in served.values() if m.max_model_len]
        self.model = ModelInfo(first.id, first.root, min(contexts) if contexts else None, first.parent)
        for engine in self.engines:
            engine.status = "up" if engine.url in served else "unverified"
        for failure in failures:
            log.warning("harnessrl: engine %s not verified; it gets calls once it serves %s", failure, first.id)
        return self.model

    async def poll(self) -> None:
        """One round: every engine's weight version and up/down state. An engine that is not up (unverified, or down
        and maybe restarted) must first list the pool's model again before it gets calls."""
        await asyncio.gather(*(self._probe(e) for e in self.engines))

    async def _probe(self, engine: PoolEngine) -> None:
        try:
            if engine.status != "up" and not await self._serves_model(engine):
                return
            version = await asyncio.wait_for(engine.client.weight_version(), self.poll_timeout)
        except EngineConnectTimeout:
            self._slow_poll(engine)  # a loaded machine's late connect, not a refusal
            return
        except EngineUnavailable as e:  # refused or dropped: nothing listens there
            self._mark_down(engine, e)
            return
        except (EngineTimeout, TimeoutError):
            self._slow_poll(engine)
            return
        except EngineError as e:  # it answers but reports no weight version (a vLLM without /weight_info)
            log.debug("weight version of %s: %s", engine.url, e)
            self._answered_poll(engine)
            return
        self._answered_poll(engine)
        engine.policy_version = int(version) if version.isdigit() else None

    def _slow_poll(self, engine: PoolEngine) -> None:
        """A poll that got no answer in time: the engine is busy (vLLM's API server shares the machine with a long
        prefill), not down. Only a refused or dropped connection marks an engine down."""
        engine.slow_polls += 1
        if not engine.slow:
            engine.slow = True
            log.info(
                "harnessrl: engine %s is slow to answer its poll (no answer within %.0f s, %d calls in flight): "
                "busy, not down; its calls wait for it",
                engine.url,
                self.poll_timeout,
                engine.in_flight,
            )

    def _answered_poll(self, engine: PoolEngine) -> None:
        if engine.slow:
            engine.slow = False
            log.info("harnessrl: engine %s answers its poll again", engine.url)
        self._mark_up(engine)

    async def _serves_model(self, engine: PoolEngine) -> bool:
        """Whether the engine lists the pool's model (unreachable: raises, so the caller marks it down)."""
        if self.model is None:
            return False
        try:
            info = await asyncio.wait_for(_first_model(engine.client), self.poll_timeout)
        except (EngineUnavailable, EngineTimeout):
            raise
        except EngineError as e:
            if e.status is None or e.status >= 500:  # a busy or starting server: ask again next round
                log.debug("engine %s could not list its model: %s", engine.url, e)
                return False
            self._refuse(engine, str(e))
            return False
        if info.id != self.model.id:
            self._refuse(engine, f"it serves {info.id!r}, not {self.model.id!r}")
            return False
        engine.refused = None
        return True

    def _refuse(self, engine: PoolEngine, why: str) -> None:
        if engine.refused != why:  # once per reason, not once per poll
            log.error("harnessrl: engine %s gets no calls: %s", engine.url, why)
        engine.refused = why
        engine.status = "unverified"  # not even a last resort: its answers would not be this model's


async def _first_model(client: EngineClient) -> ModelInfo:
    models = await client.models()
    if not models:
        raise EngineError(f"{client.base_url}/v1/models lists no model")
    return models[0]


async def check_engines(urls: Sequence[str]) -> ModelInfo:
    """Collect-time check: every engine answers ``/health`` and all serve the same model; raises ``ValueError``
    with what to fix otherwise."""
    pool = EnginePool.from_urls(urls)
    try:
        health = await asyncio.gather(*(e.client.health() for e in pool.engines))
        down = [u for u, ok in zip(pool.urls, health, strict=True) if not ok]
        if down:
            raise ValueError(f"engine {', '.join(down)} does not answer /health")
        try:
            model = await pool.bind()
        except EngineError as e:
            raise ValueError(str(e)) from e
        unverified = [e.url for e in pool.engines if e.status != "up"]
        if unverified:
            raise ValueError(f"engine {', '.join(unverified)} does not list its model on /v1/models")
        return model
    finally:
        await pool.aclose()

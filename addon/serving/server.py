"""The in-process HTTP server that answers model calls, so answers can stream for real.

Why it exists: mitmproxy can only stream a response that comes from a server; an addon-made response
(``Response.make``) is sent whole. So the capture addon retargets each model call on an intercepted host to this
server (loopback, same event loop), and mitmproxy streams its answer back to the harness chunk by chunk.

Contract
--------
* ``POST /_harnessrl/call`` — the original request body; the addon adds ``x-harnessrl-session`` (attributed
  session), ``x-harnessrl-path`` (original path and query) and ``x-harnessrl-call-id``. The answer is whatever the
  :class:`~addon.generation.generate.Generator` writes, in the caller's wire format. A front door in this process
  (the capture addon, for the sessions of worker 0) does not send the body over the hop: it leaves it with
  :meth:`InternalServer.hand_off` under the call id and sends an empty body with ``x-harnessrl-handoff: 1``
  (mitmproxy already read the body; serialising it to loopback and parsing it again with aiohttp was per-call work
  that grew with the context).
* ``GET /_harnessrl/admin/sessions`` — sessions with their call counts; ``POST /_harnessrl/admin/sessions/{id}/close``
  flushes a session's records into shards and frees its prefix graph; ``GET /_harnessrl/admin/stats`` — calls/s,
  p50/p99 overhead, errors and the event loop's health (``loop``);
  ``POST /_harnessrl/admin/policy_version`` ``{"version": N}`` — the trainer announces new weights;
  ``GET /_harnessrl/admin/memory[?top=N][&objects=0]`` — where the memory goes (:mod:`addon.serving.memory`: RSS, the C
  allocator's in-use and free-held bytes, objects by type, the runtime's structures, tracemalloc's top lines when
  tracing; ``objects=0``: only RSS, the allocator and the structures, cheap enough to poll);
  ``POST /_harnessrl/admin/memory/trim`` — return the allocator's free memory to the system (RSS before/after).
  With other processes (``peers``: generation workers, or the processes of a shared-port proxy) the admin routes
  answer for all of them, except a request with ``x-harnessrl-local: 1`` (a peer asking), answered for this one.

Listens on 127.0.0.1 only. Also usable directly as a base URL for benchmarks (it needs the same headers).

Lifecycle: a client that goes away cancels its handler (aiohttp's ``handler_cancellation``), so a call still
waiting for the engine's first token stops there and releases its engine request. :meth:`InternalServer.stop`
stops accepting, gives in-flight calls ``shutdown_grace_s`` to finish, then cancels the rest and waits (again at
most ``shutdown_grace_s``) while they record themselves as incomplete, so the record store closes cleanly after it
and well before the launcher's kill. The listen backlog is :data:`LISTEN_BACKLOG`: mitmproxy opens a connection here per
client connection, and bursts past aiohttp's default of 128 overflow the kernel's accept queue while the event
loop is busy (the dropped connects then wait for SYN retransmits, 1 s, 3 s, 7 s ...).

Health of the event loop: :class:`LoopMonitor` runs while the server does and the stats route reports it under
``"loop"``: the worst and recent lateness of the loop's wake-ups and the longest garbage-collector pause. Every
call of this process (mitmproxy's TLS, rendering, the engine client's timers) shares this one loop, so a lag of
seconds turns into client-visible timeouts; the soak reports these figures.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from aiohttp import web

from addon.generation.generate import CallInfo, ResponseSink
from addon.generation.sessions import SessionRegistry
from addon.generation.stats import Stats
from addon.serving import memory
from addon.serving.admission import Admitted, Arrival, admit
from addon.serving.routes import ModelCall
from addon.serving.workers import HEADER_LOCAL, merge_stats

log = logging.getLogger("harnessrl.server")

CALL_PATH = "/_harnessrl/call"
HEADER_SESSION = "x-harnessrl-session"
HEADER_PATH = "x-harnessrl-path"
HEADER_CALL_ID = "x-harnessrl-call-id"
HEADER_HANDOFF = "x-harnessrl-handoff"  # the body waits in this process's memory, under the call id (hand_off)
INTERNAL_HEADERS = (HEADER_SESSION, HEADER_PATH, HEADER_CALL_ID, HEADER_HANDOFF)
LISTEN_BACKLOG = 4096  # Linux's default somaxconn caps it
SHUTDOWN_GRACE_S = 5.0  # aiohttp's default (60 s) outlasted ProxyHandle.stop's 20 s, so the store never closed


class LoopMonitor:
    """How late this event loop wakes up (sampled every ``every`` s) and how long the collector's pauses are.

    Lag is measured as the extra time an ``asyncio.sleep(every)`` took; a pause of the collector blocks the loop
    too, and is timed separately through :data:`gc.callbacks` (per generation, worst and total)."""

    def __init__(self, every: float = 0.25) -> None:
        self.every = every
        self.lag_max_s = 0.0
        self.lags_over_1s = 0
        self._recent: list[float] = []  # the last minute's samples
        self.gc_max_s = [0.0, 0.0, 0.0]
        self.gc_total_s = 0.0
        self._gc_t0 = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_t0
        generation = info.get("generation", 2)
        self.gc_max_s[generation] = max(self.gc_max_s[generation], pause)
        self.gc_total_s += pause

    async def _run(self) -> None:
        window = max(1, int(60 / self.every))
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.every)
            lag = time.monotonic() - t0 - self.every
            self.lag_max_s = max(self.lag_max_s, lag)
            self.lags_over_1s += lag > 1.0
            self._recent.append(lag)
            del self._recent[:-window]

    def snapshot(self) -> dict[str, Any]:
        recent = sorted(self._recent)
        p99 = recent[min(len(recent) - 1, int(0.99 * len(recent)))] if recent else 0.0
        return {
            "lag_max_s": round(self.lag_max_s, 3),
            "lag_p99_last_60s": round(p99, 3),
            "lags_over_1s": self.lags_over_1s,
            "gc_max_s": [round(x, 3) for x in self.gc_max_s],
            "gc_total_s": round(self.gc_total_s, 2),
        }


class AnswerSink(ResponseSink, Protocol):
    """A front door's sink: the Generator's, and whether the answer's head went out."""

    @property
    def started(self) -> bool: ...


class _Sink:
    """Adapts an aiohttp StreamResponse to the Generator's ResponseSink."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=dict(headers))
        await self.response.prepare(self._request)

    async def write(self, data: bytes) -> None:
        if data:
            assert self.response is not None, "write before start"
            await self.response.write(data)

    async def end(self, data: bytes = b"") -> None:
        assert self.response is not None, "end before start"
        await self.response.write_eof(data)  # the last chunk and the chunked body's end in one write


class CallHandler(Protocol):
    """What answers a call: the Generator, or the runtime's wrapper that binds to the engine first."""

    async def handle(self, info: CallInfo, body: bytes, sink: ResponseSink) -> None: ...


class Peers(Protocol):
    """The other generation processes of a multi-worker proxy (:class:`addon.serving.workers.WorkerPool`): admin
    routes on this server (worker 0) fan out to them."""

    def owner(self, session: str) -> int: ...

    def describe(self) -> list[dict[str, Any]]: ...

    async def admin(self, method: str, path: str, body: Any = None, index: int | None = None) -> list[dict]: ...


class InternalServer:
    def __init__(
        self,
        generator: CallHandler,
        sessions: SessionRegistry,
        stats: Stats,
        run_id: str,
        max_body: int,
        flush_session=None,
        set_policy_version=None,
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
        memory_probes: Mapping[str, Callable[[], Any]] | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.generator = generator
        self.peers = peers
        self.shutdown_grace_s = shutdown_grace_s
        self.sessions = sessions
        self.stats = stats
        self.run_id = run_id
        self._flush_session = flush_session
        self._set_policy_version = set_policy_version
        self._memory_probes = dict(memory_probes or {})
        self.app = web.Application(client_max_size=max_body + 1024 * 1024)
        self.app.router.add_post(CALL_PATH, self._call)
        self.app.router.add_get("/_harnessrl/admin/sessions", self._sessions)
        self.app.router.add_post("/_harnessrl/admin/sessions/{session}/close", self._close)
        self.app.router.add_get("/_harnessrl/admin/stats", self._stats)
        self.app.router.add_post("/_harnessrl/admin/policy_version", self._policy_version)
        self.app.router.add_get("/_harnessrl/admin/memory", self._memory)
        self.app.router.add_post("/_harnessrl/admin/memory/trim", self._trim)
        self._runner: web.AppRunner | None = None
        self._calls: set[asyncio.Task] = set()  # handlers of calls in flight, for a bounded shutdown
        self._handoffs: dict[str, bytes] = {}  # call id -> body, left by a front door of this process (hand_off)
        self.loop_monitor = LoopMonitor()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,  # a client that gives up stops its call, also one waiting on the engine
            shutdown_timeout=self.shutdown_grace_s,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=LISTEN_BACKLOG)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the bound port, also when 0 asked for any
        self.loop_monitor.start()
        return self.port

    async def stop(self) -> None:
        if self._runner is None:
            return
        self.loop_monitor.stop()
        for site in list(self._runner.sites):
            await site.stop()  # no new connections
        calls = set(self._calls)
        if calls:
            _, pending = await asyncio.wait(calls, timeout=self.shutdown_grace_s)
            for task in pending:
                task.cancel()  # the generator records such a call as incomplete (client_disconnected)
            if pending:
                await asyncio.wait(pending, timeout=self.shutdown_grace_s)
        await self._runner.cleanup()
        self._runner = None

    def hand_off(self, call_id: str, body: bytes) -> None:
        """Leave ``body`` for the call ``call_id`` that a front door of this process is about to send here with
        ``x-harnessrl-handoff: 1`` and no body; :meth:`drop_handoff` when that request never arrives."""
        self._handoffs[call_id] = body

    def drop_handoff(self, call_id: str) -> bool:
        """Forget a body left by :meth:`hand_off` (its request failed before reaching this server)."""
        return self._handoffs.pop(call_id, None) is not None

    @property
    def handoffs_waiting(self) -> int:
        return len(self._handoffs)

    async def _call(self, request: web.Request) -> web.StreamResponse:
        # A front door admitted this call and says where it was going and whose it is (admission once more, with the
        # session from the front door's header and no size limit: the front door checked the size).
        original = request.headers.get(HEADER_PATH, "")
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in INTERNAL_HEADERS}
        arrival = Arrival("POST", original, headers, header_session=request.headers.get(HEADER_SESSION))
        verdict = admit(arrival, ("header",))
        if not isinstance(verdict, Admitted):
            return web.json_response({"error": f"not a model route: {original!r}"}, status=404)
        call_id = request.headers.get(HEADER_CALL_ID)
        body = None
        if request.headers.get(HEADER_HANDOFF) == "1":
            body = self._handoffs.pop(call_id or "", None)
            if body is None:  # a front door's bug, never a client's doing: the header is stripped from clients
                log.error("call %s came without its handed-off body", call_id)
                return web.json_response({"error": {"message": "internal proxy error: body lost"}}, status=500)
            if "content-length" in headers:  # the hop carried no body; the record keeps what the client sent
                headers["content-length"] = str(len(body))
        return await self.serve_model_call(request, verdict.call, verdict.session, headers, call_id, body)

    async def serve_model_call(
        self,
        request: web.Request,
        decision: ModelCall,
        session: str,
        headers: dict[str, str],
        call_id: str | None = None,
        body: bytes | None = None,
    ) -> web.StreamResponse:
        """Generate the answer to one model call of ``session`` and stream it to ``request``'s client."""
        received = datetime.now(UTC)
        if body is None:
            body = await request.read()
        sink = _Sink(request)
        if not await self.answer_call(decision, session, headers, body, sink, call_id, received):
            return web.json_response({"error": {"message": "internal proxy error"}}, status=500)
        assert sink.response is not None
        return sink.response

    async def answer_call(
        self,
        decision: ModelCall,
        session: str,
        headers: Mapping[str, str],
        body: bytes,
        sink: AnswerSink,
        call_id: str | None = None,
        received: datetime | None = None,
    ) -> bool:
        """Answer one model call of ``session`` on ``sink`` (any front door: the hop, the base URL, the TLS relay);
        False when an unexpected failure left nothing written (the caller answers 500)."""
        ua = headers.get("user-agent", "")
        harness, version = harness_from_user_agent(ua)
        info = CallInfo(
            run_id=self.run_id,
            session_id=session,
            route=decision.route,
            headers=headers,
            received_at=received or datetime.now(UTC),
            harness=harness,
            harness_version=version,
            call_id=call_id or uuid.uuid4().hex,
        )
        task = asyncio.current_task()
        if task is not None:
            self._calls.add(task)
        try:
            await self.generator.handle(info, body, sink)
        except (ConnectionResetError, asyncio.CancelledError):
            log.info("client went away during call %s of session %s", info.call_id, info.session_id)
            raise
        except Exception:  # the proxy never dies on a request; the generator already answers known failures
            log.exception("unexpected failure in call %s", info.call_id)
            self.stats.error("internal")
            return sink.started
        finally:
            if task is not None:
                self._calls.discard(task)
        return True

    def _fanout(self, request: web.Request) -> Peers | None:
        """The other processes an admin request reaches through this one: none when a peer asks (it fans out
        itself; ``x-harnessrl-local: 1``), so shared-port proxies, which are each other's peers, never loop."""
        return None if request.headers.get(HEADER_LOCAL) == "1" else self.peers

    async def _sessions(self, request: web.Request) -> web.Response:
        peers = self._fanout(request)
        sessions = [
            {k: (sorted(v) if isinstance(v, set) else v) for k, v in asdict(s).items()}
            for s in self.sessions.snapshot()
        ]
        if peers is not None:
            for answer in await peers.admin("GET", "sessions"):
                sessions.extend(answer.get("sessions", []))
        return web.json_response({"sessions": sessions})

    async def _close(self, request: web.Request) -> web.Response:
        peers = self._fanout(request)
        session = request.match_info["session"]
        if peers is not None and (owner := peers.owner(session)):  # another worker's: its store flushes it
            (answer,) = await peers.admin("POST", f"sessions/{quote(session, safe='')}/close", index=owner)
            return web.json_response(answer, status=503 if "error" in answer else 200)
        state = self.sessions.close(session)
        if self._flush_session is not None:
            await asyncio.to_thread(self._flush_session, session)
        return web.json_response({"session": session, "known": state is not None, "flushed": True})

    async def _policy_version(self, request: web.Request) -> web.Response:
        """The trainer pushes the new weight version right after a sync, so no call is recorded with a stale one."""
        peers = self._fanout(request)
        try:
            version = (await request.json())["version"]
            if not isinstance(version, int) or isinstance(version, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'expected {"version": <int>}'}, status=400)
        if self._set_policy_version is not None:
            self._set_policy_version(version)
        if peers is not None:
            failed = [a for a in await peers.admin("POST", "policy_version", {"version": version}) if "error" in a]
            if failed:
                return web.json_response({"version": version, "workers_failed": failed}, status=503)
        return web.json_response({"version": version})

    async def _stats(self, request: web.Request) -> web.Response:
        peers = self._fanout(request)
        own = self.stats.snapshot() | {"loop": self.loop_monitor.snapshot()}
        if peers is None:
            return web.json_response(own)
        merged = merge_stats(own, await peers.admin("GET", "stats"))
        return web.json_response(merged | {"worker_processes": peers.describe()})

    async def _memory(self, request: web.Request) -> web.Response:
        peers = self._fanout(request)
        try:
            top = int(request.query.get("top", "20"))
        except ValueError:
            return web.json_response({"error": "top must be an integer"}, status=400)
        walk = request.query.get("objects", "1") != "0"
        report = await asyncio.to_thread(memory.memory_report, self._memory_probes, max(1, min(top, 200)), walk)
        if peers is not None:
            report["workers"] = await peers.admin("GET", f"memory?top={top}&objects={int(walk)}")
        return web.json_response(report)

    async def _trim(self, request: web.Request) -> web.Response:
        peers = self._fanout(request)
        report: dict[str, Any] = dict(await asyncio.to_thread(memory.trim))
        if peers is not None:
            report["workers"] = await peers.admin("POST", "memory/trim")
        return web.json_response(report)


# (pattern on the User-Agent, harness name). The version is the first dotted number after the match. Some harnesses
# send only their SDK's agent (Pi: Anthropic/JS, mini-swe-agent and hermes: OpenAI/Python); those are named after
# the SDK here, and the collector, which knows which harness it started, records the harness per episode.
_HARNESS_UA: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"claude-cli", "claude-code"),
        (r"codex", "codex"),
        (r"geminicli", "gemini-cli"),
        (r"kilo", "kilo"),
        (r"opencode", "opencode"),
        (r"qwen-?code", "qwen-code"),
        (r"hermes", "hermes"),
        (r"litellm", "litellm"),
        (r"anthropic/js", "anthropic-js-sdk"),
        (r"openai/python", "openai-python-sdk"),
        (r"openai/js", "openai-js-sdk"),
        (r"google-genai-sdk", "google-genai-sdk"),
    )
)
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def harness_from_user_agent(ua: str) -> tuple[str, str | None]:
    """Name and version of the caller from its User-Agent ("unknown" when it says nothing we know)."""
    for pattern, name in _HARNESS_UA:
        m = pattern.search(ua)
        if m:
            v = _VERSION.search(ua, m.end())
            return name, (v.group(1) if v else None)
    return ("unknown", None) if not ua else (ua.split("/")[0].strip()[:64] or "unknown", None)

"""Everything the capture addon runs on, built once at start-up: engine pool, prompt renderer, record store,
sessions, stats, the generator and the internal server.

Contract
--------
``await Runtime.start(config)`` recovers the record store (a crash's write-ahead log becomes a shard), starts the
internal server, and asks the engines what they serve (model folder, context length). ``harnessrl_engine_url`` names
one engine or several (comma-separated replicas of one model): the runtime builds an
:class:`~addon.engine.pool.EnginePool` either way (one URL: a one-engine pool, same behaviour), and every call goes
through it with its session id (affinity and failover: see :mod:`addon.engine.pool`). The engines may be down at
start: the proxy still starts, a model call waits for one up to ``harnessrl_engine_wait_s`` (then gets a
vendor-shaped 503/529 with ``retry-after``), and the runtime binds on the first call that finds one. Once bound, a
poll every second reads each engine's weight version and up/down/busy state; the admin ``policy_version`` route sets
every engine's. Tokenizer loads and store I/O run in threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from addon.engine.client import EngineError
from addon.engine.pool import EnginePool
from addon.generation.generate import Generator
from addon.generation.render import PromptRenderer
from addon.generation.sessions import SessionRegistry
from addon.generation.splice import SpliceRenderer
from addon.generation.stats import Stats
from addon.records.store import RecordStore, StoreConfig
from addon.serving import tuning
from addon.serving.aio import spawn
from addon.serving.base_url import BaseUrlEndpoint
from addon.serving.config import CaptureConfig
from addon.serving.relay import RelayServer
from addon.serving.routes import CountTokens, LocalAnswer, ModelList, WebSocketRefused
from addon.serving.server import InternalServer
from addon.serving.shared_port import StaticPeers
from addon.serving.tuning import Trimmer
from addon.serving.workers import WorkerPool
from converters import dialect_for
from converters.base import Route, load_json_object
from converters.canonical import ConversionError

log = logging.getLogger("harnessrl.runtime")


class Runtime:
    def __init__(self, config: CaptureConfig, engine: EnginePool, store: RecordStore) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.sessions = SessionRegistry(config.budget)
        self.stats = Stats()
        self.renderer: PromptRenderer | None = None
        self.served_model = ""
        self.max_model_len = 0
        self.generator: Generator | None = None
        self.server: InternalServer | None = None
        self.relay: RelayServer | None = None  # the TLS relay's HTTP/1.1 server (harnessrl_relay)
        self._bind_lock = asyncio.Lock()
        self._poller: asyncio.Task | None = None
        self.trimmer = Trimmer(config.tuning)
        # the other generation processes: started by this one (harnessrl_workers > 1), or the other processes of a
        # shared-port proxy (harnessrl_peer_ports)
        self.workers: WorkerPool | StaticPeers | None = None

    @property
    def port(self) -> int:
        return self.server.port if self.server else 0

    @classmethod
    async def start(
        cls,
        config: CaptureConfig,
        options: Mapping[str, Any] | None = None,
        on_listening: Callable[[Runtime], None] | None = None,
        probes: Mapping[str, Callable[[], Any]] | None = None,
    ) -> Runtime:
        """Open the store, start the internal server and, with ``config.workers > 1``, the worker processes, which
        get ``options`` (the proxy's ``harnessrl_*`` option values) to build the same configuration; then bind.
        ``on_listening(runtime)`` runs once the servers listen, before the bind (the tokenizer's load): the capture
        addon relays the tunnels that open meanwhile, whose calls wait for the bind in :meth:`bind`. ``probes``: more
        structures for the admin memory route to report (the capture addon's)."""
        for line in tuning.apply_allocator(config.tuning):  # before the first worker thread allocates
            log.info("harnessrl: %s", line)
        store = await asyncio.to_thread(
            RecordStore.open,
            config.records_dir,
            config.run_id,
            StoreConfig(shard_rows=config.shard_rows, background_shards=True),
        )
        runtime = cls(config, EnginePool.from_urls(config.engine_urls, wait_s=config.engine_wait_s), store)
        if config.peer_ports:
            runtime.workers = StaticPeers(config.peer_ports, config.server_port)
        elif config.workers > 1:
            runtime.workers = WorkerPool(config.workers, options or {}, store.run_id, config.records_dir)
        runtime.server = InternalServer(
            _LazyGenerator(runtime),
            runtime.sessions,
            runtime.stats,
            store.run_id,
            config.max_body,
            flush_session=store.close_session,
            set_policy_version=runtime.set_policy_version,
            memory_probes=runtime.memory_probes() | dict(probes or {}),
            peers=runtime.workers,
        )
        if config.base_url:
            BaseUrlEndpoint(runtime.server, config.session_sources, config.max_body, runtime.answer_locally).install()
        if config.relay:
            runtime.relay = RelayServer(runtime.server, config.session_sources, config.max_body, runtime.answer_locally)
        try:
            await runtime.server.start(port=config.server_port)
            if runtime.relay is not None:
                await runtime.relay.start()
            if runtime.workers is not None:
                await runtime.workers.start()
            if on_listening is not None:
                on_listening(runtime)
            try:
                await runtime.bind()
            except EngineError as e:
                log.warning(
                    "harnessrl: engine at %s not usable yet (%s); calls wait for it up to harnessrl_engine_wait_s",
                    runtime.engine.describe(),
                    e,
                )
        except BaseException:
            # a start-up that fails (tokenizer missing, port taken) releases what it opened: the record store's lock
            # and the internal server's port, so the process can exit, or a caller retry, cleanly
            await runtime.stop()
            raise
        return runtime

    def memory_probes(self) -> dict[str, Callable[[], Any]]:
        """What the admin memory route reports of this runtime's own structures (each read when asked)."""

        def generator_probe() -> dict[str, int]:
            g = self.generator
            if g is None:
                return {}
            return {
                "graph_sessions": len(g.graphs),
                "graph_token_ids": g.graphs.tokens_held,
                "graph_nodes": g.graphs.nodes_held,
                "json_fragments": len(g.canonical_json),
                "json_fragment_chars": g.canonical_json.cached_chars,
            }

        return {
            "sessions": lambda: len(self.sessions),
            "generator": generator_probe,
            "store_buffered_rows": lambda: self.store.buffered_rows,
            "trims": lambda: {"count": self.trimmer.trims, "returned_mib": round(self.trimmer.returned_mib, 1)},
            "relay": lambda: self.relay.snapshot() if self.relay is not None else {},
        }

    async def bind(self) -> Generator:
        """Ask the engines what they serve and load the tokenizer (once)."""
        if self.generator is not None:
            return self.generator
        async with self._bind_lock:
            if self.generator is not None:
                return self.generator
            t0 = time.perf_counter()
            info = await self.engine.bind()  # the engines answering must agree on the model
            model_dir = self.config.model_dir or Path(info.root)
            self.renderer = await asyncio.to_thread(PromptRenderer.from_pretrained, model_dir)
            splicer = await asyncio.to_thread(SpliceRenderer, self.renderer)  # probes the template once
            self.served_model = info.id
            self.max_model_len = info.max_model_len or _context_from_config(model_dir)
            self.generator = Generator(
                splicer=splicer,
                engine=self.engine,
                store=self.store,
                sessions=self.sessions,
                stats=self.stats,
                max_model_len=self.max_model_len,
                served_model=self.served_model,
                policy=self.config.sampling,
                force_tool_calls=self.config.force_tool_calls,
                stream_interval=self.config.stream_interval,
            )
            for line in tuning.apply_collector(self.config.tuning):  # after the tokenizer loaded: frozen with the rest
                log.info("harnessrl: %s", line)
            await self.engine.poll()  # each engine's weight version before the first call
            if all(e.policy_version is None for e in self.engine.engines):
                log.warning("harnessrl: no engine reports a weight version; records carry none")
            self._poller = spawn(self._poll_policy_version(), "policy-version")
            self.stats.ready = True
            log.info(
                "harnessrl: bound to %s (context %d) in %.1fs",
                self.served_model,
                self.max_model_len,
                time.perf_counter() - t0,
            )
            return self.generator

    async def _poll_policy_version(self, every: float = 1.0) -> None:
        """Keep each engine's policy version and up/down state current. The trainer also pushes the version after
        each weight sync."""
        while True:
            await self.engine.poll()  # never raises an engine error: a failing engine is marked down
            if self.generator is not None:
                self.generator.graphs.evict(time.monotonic())  # idle sessions and the memory cap
            await self.trimmer.maybe_trim()
            await asyncio.sleep(every)

    def set_policy_version(self, version: int | None) -> None:
        """The admin route: the trainer synced every engine to ``version``."""
        self.engine.set_policy_version(version)

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        stopping = [self._stop_servers()]
        if self.workers is not None:
            stopping.append(self.workers.stop())  # each finishes its calls and closes its own store
        await asyncio.gather(*stopping)
        await asyncio.to_thread(self.store.close)
        await self.engine.aclose()

    async def _stop_servers(self) -> None:
        """The relay takes no new connection; the internal server gives every call in flight (the relay's too) its
        grace period; then the relay's idle connections close."""
        if self.relay is not None:
            await self.relay.close_listener()
        if self.server is not None:
            await self.server.stop()
        if self.relay is not None:
            await self.relay.stop()

    async def count_tokens(self, route: Route, body: bytes, headers: Mapping[str, str]) -> LocalReply:
        dialect = dialect_for(route.format)
        try:
            await self.bind()
            assert self.renderer is not None
            payload = load_json_object(body)
            if route.format == "anthropic":  # count_tokens bodies are Messages bodies without max_tokens
                payload = {"max_tokens": 1, **payload}
            request = dialect.parse_request(payload, route, headers)
            count = await asyncio.to_thread(self.renderer.count_tokens, request)
        except ConversionError as err:
            wire = dialect.render_error(err)
            return LocalReply(wire.status, wire.body, dict(wire.headers))
        except EngineError as e:
            wire = dialect.render_error(ConversionError("overloaded", f"engine unavailable: {e}", retry_after=1.0))
            return LocalReply(wire.status, wire.body, dict(wire.headers))
        payload = {"input_tokens": count} if route.format == "anthropic" else {"totalTokens": count}
        return LocalReply(200, json.dumps(payload).encode(), _JSON)

    def model_list(self, decision: ModelList) -> LocalReply:
        name = decision.model_id or self.served_model or "harnessrl"
        created = int(time.time())
        card: dict[str, Any]
        body: dict[str, Any]
        if decision.format == "anthropic":
            card = {"type": "model", "id": name, "display_name": name, "created_at": "2026-01-01T00:00:00Z"}
            body = card if decision.model_id else {"data": [card], "has_more": False, "first_id": name, "last_id": name}
        elif decision.format == "gemini":
            card = {
                "name": f"models/{name}",
                "displayName": name,
                "inputTokenLimit": self.max_model_len,
                "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
            }
            body = card if decision.model_id else {"models": [card]}
        else:
            card = {"id": name, "object": "model", "created": created, "owned_by": "harnessrl"}
            body = card if decision.model_id else {"object": "list", "data": [card]}
        return LocalReply(200, json.dumps(body).encode(), _JSON)

    async def answer_locally(
        self,
        decision: CountTokens | ModelList | WebSocketRefused | LocalAnswer,
        body: bytes,
        headers: Mapping[str, str],
    ) -> LocalReply:
        """The answer to a request that is not a model call (the addon and the base-URL endpoint share it)."""
        if isinstance(decision, CountTokens):
            return await self.count_tokens(decision.route, body, headers)
        if isinstance(decision, ModelList):
            return self.model_list(decision)
        if isinstance(decision, WebSocketRefused):
            return LocalReply(426, b"", {"content-type": "text/plain"})
        reply = b"{}" if decision.status == 200 else json.dumps({"error": {"message": decision.reason}}).encode()
        return LocalReply(decision.status, reply, _JSON)


@dataclass(frozen=True)
class LocalReply:
    status: int
    body: bytes
    headers: dict[str, str]


_JSON = {"content-type": "application/json"}


class _LazyGenerator:
    """Binds to the engine on first use, so a proxy started before its engine serves calls once the engine is up.

    A call that arrives while no engine answers waits for one (retrying every second) up to the pool's ``wait_s``
    (``harnessrl_engine_wait_s``), like a call whose engine refuses it; then it gets the vendor's retryable error."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def handle(self, info, body: bytes, sink) -> None:
        wait_s = self._runtime.engine.wait_s
        deadline = time.monotonic() + wait_s
        while True:
            try:
                generator = await self._runtime.bind()
            except EngineError as e:
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    await asyncio.sleep(min(1.0, remaining))
                    continue
                message = f"engine unavailable after {wait_s:g} s (harnessrl_engine_wait_s): {e}"
                log.warning("harnessrl: call %s of session %s: %s", info.call_id, info.session_id, message)
                wire = dialect_for(info.route.format).render_error(
                    ConversionError("overloaded", message, retry_after=1.0)
                )
                self._runtime.stats.error("engine")
                await sink.start(wire.status, dict(wire.headers))
                await sink.end(wire.body)
                return
            await generator.handle(info, body, sink)
            return


def _context_from_config(model_dir: Path) -> int:
    """The model's context length from its config.json, when the engine does not report one."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config["max_position_embeddings"])

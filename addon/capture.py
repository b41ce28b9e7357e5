"""harnessrl's mitmproxy addon: ``mitmdump -s addon/capture.py``.

Contract
--------
Requests to the intercepted hosts (default api.anthropic.com, api.openai.com, generativelanguage.googleapis.com;
``*`` or reverse mode: every request) are answered locally and never leave the machine:

* in an ``HTTPS_PROXY`` tunnel whose proxy credentials name a session this process answers (``harnessrl_relay``,
  on by default), mitmproxy only terminates the client's TLS (HTTP/1.1 by ALPN) and relays the bytes, unparsed and
  without a flow, to the in-process :class:`~addon.serving.relay.RelayServer`, which answers each request of the
  connection as the base URL does (``http_connect`` remembers the tunnel, ``next_layer`` picks the layers,
  ``server_connected`` tells the relay server whose connection it is);
* other model calls (reverse mode, an HTTP/2-only client, another process's session, ``harnessrl_relay=false``) are
  retargeted to the in-process :class:`~addon.serving.server.InternalServer`, which generates from vLLM and streams
  the answer back through mitmproxy (``flow.response.stream``); either way one row per call is recorded;
* ``count_tokens`` / ``:countTokens`` get real tokenizer counts, model listings list the served model, Codex's
  WebSocket upgrade gets 426 (it falls back to HTTPS at once), anything else gets a harmless local answer, logged;
* hosts that are not intercepted pass through untouched.

Options (``--set name=value``) are declared in ``load`` and parsed once in ``configure``; ``harnessrl_engine_url``
may name several engines (comma-separated replicas of one model), each session sticking to one
(:mod:`addon.engine.pool`); the heavy start-up (tokenizer load, record-store recovery, engine query) happens in
``running`` off the event loop. Hooks start with guard clauses and never raise: a failure becomes an error answer in
the caller's wire format.

Start-up: mitmproxy listens before ``running`` ends, so a call can arrive while the runtime starts; it waits for it
at most ``harnessrl_startup_wait_s``, then gets a vendor-shaped 503 with ``retry-after``. A tunnel that opens once the
runtime's servers listen, while the tokenizer still loads, is already relayed (its calls wait for the load in the
runtime): a tunnel's layer is chosen when it opens and a harness keeps it for the whole session. A start-up that fails
(record folder locked by another proxy, tokenizer missing...) logs one ``harnessrl: cannot start: <reason>`` error and
shuts the proxy down; mitmproxy's ``errorcheck`` addon turns an error logged during start-up into exit status 1. Calls
that waited, and any arriving while the process shuts down, get the 503 at once, never a hang.

The hop to the internal server carries no body for the sessions this process answers (worker 0): mitmproxy already
read it, so it waits in memory under the call id (:meth:`~addon.serving.server.InternalServer.hand_off`) and is
dropped if the hop fails; the flow gets its body back once the hop is over (answer headers or error), so what
mitmproxy shows or saves is what the client sent. Calls of other processes' sessions carry their body over loopback.

Header field lines: a retargeted call reaches the internal server with one field line per name
(:func:`~addon.serving.field_lines.fold_field_lines`; the relay server folds the same way), because aiohttp's
request parser refuses a repeated User-Agent, Content-Type... that clients do send (hermes: its SDK's
``User-Agent`` plus its own ``user-agent``) and the vendors accept. Repeated framing lines (Content-Length values
that disagree, several Transfer-Encoding lines, or both fields) are refused with a vendor-shaped 400 instead: they
are how request smuggling works.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
import weakref
from pathlib import Path

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import layer, layers
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_specs import ProxyMode, ReverseMode
from mitmproxy.proxy.server_hooks import ServerConnectionHookData

# mitmdump loads this file as a script; make the repository importable when harnessrl is not pip-installed.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from addon.generation.sessions import SESSION_HEADER  # noqa: E402
from addon.records.store import RecordStoreError  # noqa: E402
from addon.serving.admission import Admitted, Arrival, Refused, admit, refusal, unavailable  # noqa: E402
from addon.serving.config import OPTIONS, CaptureConfig, add_options  # noqa: E402
from addon.serving.field_lines import fold_field_lines  # noqa: E402
from addon.serving.handover import HandOver, RoutingListener, supported  # noqa: E402
from addon.serving.lean_chain import idle_addons, woken  # noqa: E402
from addon.serving.runtime import Runtime  # noqa: E402
from addon.serving.server import (  # noqa: E402
    CALL_PATH,
    HEADER_CALL_ID,
    HEADER_HANDOFF,
    HEADER_PATH,
    HEADER_SESSION,
    INTERNAL_HEADERS,
)
from addon.serving.shared_port import listen_shared  # noqa: E402
from converters.canonical import ConversionError  # noqa: E402

log = logging.getLogger("harnessrl.capture")


INTERNAL_HOST = "127.0.0.1"  # where model calls are retargeted: the internal server of this process or a worker
RETRY_AFTER_S = 1.0  # what a call answered 503 while the proxy starts or stops is told to wait
# After a failed start-up, how long the calls that waited for it get to have their 503 written before mitmproxy's
# errorcheck exits the process (it exits as soon as ``running`` returns).
FAILED_START_DRAIN_S = 0.5


class InternalHopLines(logging.Filter):
    """Drops mitmproxy's ``Streaming response from 127.0.0.1.``: one line per model call naming the internal
    retarget, not anything the user configured (a log line a call: 8.6 M a day at 100 calls/s), and its handlers
    were ~1.5% of a lone call's CPU in py-spy. Every other line of mitmproxy's stays."""

    LINE = f"Streaming response from {INTERNAL_HOST}."

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.LINE


class Capture:
    def __init__(self) -> None:
        self.config: CaptureConfig | None = None
        self.runtime: Runtime | None = None
        self._settled = asyncio.Event()  # start-up ended, well or not: calls waiting for it go on
        self._unavailable: str | None = None  # why calls get a 503 now (a failed start-up, shutting down)
        self._waiting = 0  # calls waiting for start-up to end
        # the SO_REUSEPORT listener (harnessrl_shared_port): routing tunnels to their owner (harnessrl_handover) or not
        self._shared: RoutingListener | asyncio.Server | None = None
        self._dropped: dict[str, tuple[str, ...]] = {}  # idle mitmproxy addons dropped at start-up, their options
        # the TLS relay (harnessrl_relay): CONNECT tunnels to intercepted hosts -> the session their credentials name,
        # and the relay connections mitmproxy opens for them -> that session
        self._tunnels: weakref.WeakKeyDictionary[connection.Client, str] = weakref.WeakKeyDictionary()
        self._relayed: weakref.WeakKeyDictionary[connection.Server, str] = weakref.WeakKeyDictionary()

    def load(self, loader) -> None:
        add_options(loader)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine call would drown the log
        server_log = logging.getLogger("mitmproxy.proxy.server")
        if not any(isinstance(f, InternalHopLines) for f in server_log.filters):  # a script reload loads again
            server_log.addFilter(InternalHopLines())

    def configure(self, updated: set[str]) -> None:
        if self._dropped and (names := woken(self._dropped, updated)):
            options = sorted({o for n in names for o in self._dropped[n]}.intersection(updated))
            log.error(
                "harnessrl: %s changed after start-up, but mitmproxy's %s addon was dropped at start-up (idle then) "
                "and stays off; restart with --set harnessrl_lean_chain=false to use it",
                ", ".join(options),
                ", ".join(names),
            )
        if not any(name.startswith("harnessrl_") for name in updated):
            return
        try:
            self.config = CaptureConfig.from_options(ctx.options)
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from e

    async def running(self) -> None:
        assert self.config is not None
        if self.config.lean_chain:
            self._dropped = drop_idle_addons(ctx.master.addons, ctx.options)
        try:
            if self.config.shared_port:
                await self._listen_shared(self.config.shared_port)
            options = {name: getattr(ctx.options, name) for name, *_ in OPTIONS}  # what worker processes rebuild
            probes = {"handover": self._shared.handover.snapshot} if isinstance(self._shared, RoutingListener) else {}
            # set once the servers listen: tunnels opened while the tokenizer loads are relayed too (a tunnel's layer
            # is chosen when it opens, and a harness keeps its tunnel for the whole session)
            self.runtime = await Runtime.start(self.config, options, on_listening=self._listening, probes=probes)
        except Exception as e:
            self.runtime = None  # Runtime.start stopped what it had opened
            await self._fail_start(e)
            return
        self._settled.set()
        log.info(
            "harnessrl: answering %s on internal port %d from %s",
            self.config.describe_hosts(),
            self.runtime.port,
            self.runtime.engine.describe(),
        )

    def _listening(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def _listen_shared(self, port: int) -> None:
        """The port shared with the other processes of this proxy (SO_REUSEPORT; addon/serving/shared_port.py): its
        connections go to mitmproxy's own server for the first mode, as its listen port's do."""
        proxyserver = ctx.master.addons.get("proxyserver")
        instance = proxyserver.servers[ctx.options.mode[0]] if proxyserver is not None else None
        if instance is None:
            raise OSError(f"harnessrl_shared_port: no proxy server runs for mode {ctx.options.mode[0]!r}")
        assert self.config is not None
        if self.config.hands_over and supported():
            handover = HandOver(self.config.server_port, instance.handle_stream)
            handover.start()
            listener = RoutingListener(instance.handle_stream, handover, self._owner_port)
            try:
                await listener.start(ctx.options.listen_host, port)
            except OSError:
                handover.close()
                raise
            self._shared = listener
            log.info("harnessrl: also listening on the shared port %d; tunnels go to their session's process", port)
            return
        if self.config.hands_over:
            log.warning("harnessrl: harnessrl_handover needs Linux's abstract Unix sockets; off on this platform")
        self._shared = await listen_shared(instance.handle_stream, ctx.options.listen_host, port)
        log.info("harnessrl: also listening on the shared port %d", port)

    def _owner_port(self, user: str) -> int | None:
        """For a shared-port tunnel whose proxy user is ``user``: the internal port of the process that owns that
        session when it is another one and is up; ``None``: this process serves it."""
        if self.runtime is None or self._unavailable is not None:
            return None
        port = self._port_for(user)
        return None if port == self.runtime.port else port

    async def _fail_start(self, e: Exception) -> None:
        """A proxy that cannot start exits non-zero with the reason, answering the calls that waited first."""
        reason = str(e) or type(e).__name__
        self._unavailable = f"the capture proxy failed to start ({reason}) and is exiting"
        # An error logged during start-up is what makes mitmproxy's errorcheck exit with status 1 once ``running``
        # returns; the traceback only helps for failures nobody anticipated.
        expected = isinstance(e, RecordStoreError | OSError | ValueError)
        log.error("harnessrl: cannot start: %s", reason, exc_info=None if expected else e)
        waited = self._waiting
        self._settled.set()
        ctx.master.shutdown()  # also when errorcheck is not watching (the script reloaded after start-up)
        if waited:
            await asyncio.sleep(FAILED_START_DRAIN_S)

    async def done(self) -> None:
        self._unavailable = self._unavailable or "the capture proxy is shutting down"
        if self._shared is not None:
            self._shared.close()  # no new connections; the kernel hands them to the other processes
        if self.runtime is not None:
            await self.runtime.stop()

    def _intercepted(self, flow: http.HTTPFlow) -> bool:
        assert self.config is not None
        if isinstance(flow.client_conn.proxy_mode, ReverseMode) or "*" in self.config.hosts:
            return True
        return flow.request.host.lower() in self.config.hosts  # the CONNECT target, never the Host header

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or self.config is None:
            return
        if "harnessrl" in flow.metadata:
            return  # already retargeted to the internal server
        if not self._intercepted(flow):
            return
        if not await self._started():
            flow.response = self._unavailable_answer(flow)
            return
        try:
            await self._answer(flow)
        except Exception as e:  # the proxy never dies on a request
            log.exception("harnessrl: failed to answer %s %s", flow.request.method, flow.request.pretty_url)
            flow.response = http.Response.make(500, json.dumps({"error": {"message": str(e)}}).encode())

    async def _started(self) -> bool:
        """Whether the runtime is up to answer; waits for a start-up in progress at most harnessrl_startup_wait_s."""
        assert self.config is not None
        if not self._settled.is_set():
            self._waiting += 1
            try:
                await asyncio.wait_for(self._settled.wait(), self.config.startup_wait_s)
            except TimeoutError:
                pass
            finally:
                self._waiting -= 1
        # the runtime is set before it has bound (the relay's tunnels); flows still wait for the whole start-up
        return self._settled.is_set() and self.runtime is not None and self._unavailable is None

    def _unavailable_answer(self, flow: http.HTTPFlow) -> http.Response:
        """A 503 with retry-after in the caller's wire format: the proxy is starting, failed to start, or stops."""
        assert self.config is not None
        reason = self._unavailable or (
            f"the capture proxy is still starting after {self.config.startup_wait_s:g} s (harnessrl_startup_wait_s)"
        )
        log.warning("harnessrl: 503 for %s %s: %s", flow.request.method, flow.request.pretty_url, reason)
        return _response(unavailable(_arrival(flow), reason, RETRY_AFTER_S))

    async def _answer(self, flow: http.HTTPFlow) -> None:
        assert self.config is not None and self.runtime is not None
        req = flow.request
        arrival = _arrival(flow)
        verdict = admit(arrival, self.config.session_sources, self.config.max_body)
        if isinstance(verdict, Refused):
            flow.response = _response(verdict)
        elif isinstance(verdict, Admitted):
            port = self._port_for(verdict.session)
            if port is None:
                reason = "the generation process of this session is not available (restarting or stopped)"
                log.warning("harnessrl: 503 for %s %s: %s", req.method, req.pretty_url, reason)
                flow.response = _response(unavailable(arrival, reason, RETRY_AFTER_S))
                return
            try:
                self._retarget(flow, verdict, port)
            except ConversionError as err:  # framing the internal server must not be left to guess
                log.warning("harnessrl: refused %s %s: %s", req.method, req.pretty_url, err.message)
                flow.response = _response(refusal(verdict.call.route.format, err))
        else:
            reply = await self.runtime.answer_locally(verdict.decision, req.raw_content or b"", arrival.headers)
            flow.response = http.Response.make(reply.status, reply.body, reply.headers)

    def _port_for(self, session: str) -> int | None:
        """The internal port that answers ``session``: this process's, or its worker's (``None``: restarting)."""
        assert self.runtime is not None
        workers = self.runtime.workers
        owner = workers.owner(session) if workers is not None else 0
        return workers.port_of(owner) if workers is not None and owner else self.runtime.port

    def _retarget(self, flow: http.HTTPFlow, admitted: Admitted, port: int) -> None:
        req = flow.request
        for name in INTERNAL_HEADERS:
            req.headers.pop(name, None)  # a client cannot spoof the proxy's own bookkeeping
        req.headers.fields = fold_field_lines(req.headers.fields)  # raises on ambiguous framing: answered locally
        req.headers[HEADER_SESSION] = admitted.session
        req.headers[HEADER_PATH] = admitted.original
        call_id = uuid.uuid4().hex
        req.headers[HEADER_CALL_ID] = call_id
        server = self.runtime.server if self.runtime is not None else None
        if server is not None and port == server.port:  # this process answers it: the body stays in memory
            body, length = req.raw_content or b"", req.headers.get("content-length")
            server.hand_off(call_id, body)
            req.raw_content = b""
            if length is not None:
                req.headers["content-length"] = "0"
            req.headers[HEADER_HANDOFF] = "1"
            flow.metadata["harnessrl_handoff"] = (call_id, body, length)
        req.scheme, req.host, req.port, req.path = "http", INTERNAL_HOST, port, CALL_PATH
        flow.metadata["harnessrl"] = admitted.session

    # ------------------------------------------------------------------------ the TLS relay (addon/serving/relay.py)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A tunnel to an intercepted host whose proxy credentials name a session may be relayed (next_layer)."""
        if self.config is None or not self.config.relay or self.config.session_sources[:1] != ("proxyauth",):
            return  # relayed, a call's session is its tunnel's: only when the credentials come first
        auth = flow.metadata.get("proxyauth")  # set by mitmproxy's proxyauth addon, which runs before this one
        if isinstance(auth, tuple) and auth and auth[0] and self._intercepted(flow):
            self._tunnels[flow.client_conn] = auth[0]

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """In a remembered tunnel: TLS terminated on the client's side only (HTTP/1.1 by ALPN), then the decrypted
        bytes relayed to the relay server unparsed (a TCP layer that fires no hooks). Anything else keeps
        mitmproxy's own choice: an HTTP/2-only client, a session another process answers, a runtime not up."""
        context = nextlayer.context
        session = self._tunnels.get(context.client)
        if session is None or context.server.address is None or self._unavailable is not None:
            return
        relay = self.runtime.relay if self.runtime is not None else None
        if relay is None or self._port_for(session) != self.runtime.port:  # type: ignore[union-attr]
            return
        if not context.client.tls:
            if not starts_like_tls_record(nextlayer.data_client()):
                return  # not TLS (yet): mitmproxy decides
            try:
                hello = parse_client_hello(nextlayer.data_client())
            except ValueError:
                return  # mitmproxy's TLS layer reports it
            if hello is None:
                nextlayer.layer = None  # decide once the whole ClientHello is in
            elif not hello.alpn_protocols or b"http/1.1" in hello.alpn_protocols:
                if hello.alpn_protocols:
                    context.client.alpn = b"http/1.1"  # what mitmproxy's TLS config then selects
                nextlayer.layer = layers.ClientTLSLayer(context)
        elif context.client.alpn in (None, b"http/1.1"):
            context.server.address = (INTERNAL_HOST, relay.port)
            self._relayed[context.server] = session
            nextlayer.layer = layers.TCPLayer(context, ignore=True)

    def server_connected(self, data: ServerConnectionHookData) -> None:
        session = self._relayed.get(data.server)
        if session is not None and data.server.sockname and self.runtime is not None and self.runtime.relay:
            self.runtime.relay.register(data.server.sockname[1], data.server, session)

    def server_disconnected(self, data: ServerConnectionHookData) -> None:
        if data.server in self._relayed and data.server.sockname and self.runtime is not None and self.runtime.relay:
            self.runtime.relay.unregister(data.server.sockname[1], data.server)

    # ------------------------------------------------------------------------------------------- retargeted flows

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if "harnessrl" in flow.metadata and flow.response is not None:
            flow.response.stream = True  # pass every chunk on as the engine samples it
            self._drop_handoff(flow)  # taken by now, unless aiohttp refused the request before the handler ran

    def error(self, flow: http.HTTPFlow) -> None:
        self._drop_handoff(flow)  # the hop may have failed before the server took the body

    def _drop_handoff(self, flow: http.HTTPFlow) -> None:
        """Forget a hand-off the server did not take, and give the flow its body back: the hop is over, and what
        mitmproxy shows or saves of the flow (``-w``, mitmweb, ``flow_detail``) must be the request the client sent."""
        handoff = flow.metadata.pop("harnessrl_handoff", None)
        if handoff is None:
            return
        call_id, body, length = handoff
        if self.runtime is not None and self.runtime.server is not None:
            self.runtime.server.drop_handoff(call_id)
        flow.request.raw_content = body
        if length is not None:
            flow.request.headers["content-length"] = length

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        if self._intercepted(flow) and flow.websocket is not None:
            log.info("harnessrl: websocket on an intercepted host was not refused: %s", flow.request.pretty_url)


def drop_idle_addons(manager, options) -> dict[str, tuple[str, ...]]:
    """Remove the addons of mitmproxy's chain that cannot act with these options (:mod:`addon.serving.lean_chain`)
    with ``AddonManager.remove``; what was removed, with the options that would have turned each on."""
    modes = []
    for spec in options.mode:
        mode = ProxyMode.parse(spec)
        modes.append((mode.type_name, mode.scheme if isinstance(mode, ReverseMode) else ""))
    names = [getattr(a, "name", None) or type(a).__name__.lower() for a in manager.chain]  # mitmproxy's naming
    dropped: dict[str, tuple[str, ...]] = {}
    for name, turned_on_by in idle_addons(names, options.has_changed, modes).items():
        addon = manager.get(name)
        if addon is None:
            continue
        try:
            manager.remove(addon)  # rebinds the chain: hooks in flight finish on the old one
        except exceptions.AddonManagerError as e:  # an addon that cannot be removed stays: only a cost
            log.info("harnessrl: mitmproxy's %s addon stays in the chain: %s", name, e)
            continue
        dropped[name] = turned_on_by
    if dropped:
        log.info(
            "harnessrl: dropped %d idle mitmproxy addons from the chain (%s); harnessrl_lean_chain=false keeps them",
            len(dropped),
            ", ".join(dropped),
        )
    return dropped


def _arrival(flow: http.HTTPFlow) -> Arrival:
    """What admission needs of an intercepted request (its body is already read: mitmproxy buffers it)."""
    req = flow.request
    auth = flow.metadata.get("proxyauth")
    headers = {k.lower(): v for k, v in req.headers.items() if k.lower() not in INTERNAL_HEADERS}
    return Arrival(
        method=req.method,
        target=req.path,
        headers=headers,
        body_length=len(req.raw_content or b""),
        proxyauth_user=auth[0] if isinstance(auth, tuple) and auth else None,
        header_session=req.headers.get(SESSION_HEADER),
    )


def _response(refused: Refused) -> http.Response:
    return http.Response.make(refused.status, refused.body, refused.headers)


addons = [Capture()]

if __name__ == "__main__":  # pragma: no cover - helpful message when run by mistake
    print("load this file into mitmproxy: mitmdump -s addon/capture.py", file=sys.stderr)
    asyncio.run(asyncio.sleep(0))

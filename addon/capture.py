"""harnessrl's mitmproxy addon: ``mitmdump -s addon/capture.py``.

Contract
--------
Requests to the intercepted hosts (default api.anthropic.com, api.openai.com, generativelanguage.googleapis.com;
``*`` or reverse mode: every request) are answered locally and never leave the machine:

* model calls are retargeted to the in-process :class:`~addon.server.InternalServer`, which generates from vLLM and
  streams the answer back through mitmproxy (``flow.response.stream``), recording one row per call;
* ``count_tokens`` / ``:countTokens`` get real tokenizer counts, model listings list the served model, Codex's
  WebSocket upgrade gets 426 (it falls back to HTTPS at once), anything else gets a harmless local answer, logged;
* hosts that are not intercepted pass through untouched.

Options (``--set name=value``) are declared in ``load`` and parsed once in ``configure``; ``harnessrl_engine_url``
may name several engines (comma-separated replicas of one model), each session sticking to one
(:mod:`addon.engine_pool`); the heavy start-up (tokenizer load, record-store recovery, engine query) happens in
``running`` off the event loop. Hooks start with guard clauses and never raise: a failure becomes an error answer in
the caller's wire format.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from pathlib import Path
from urllib.parse import parse_qsl

from mitmproxy import ctx, exceptions, http
from mitmproxy.proxy.mode_specs import ReverseMode

# mitmdump loads this file as a script; make the repository importable when harnessrl is not pip-installed.
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from addon.config import CaptureConfig, add_options  # noqa: E402
from addon.routes import LocalAnswer, ModelCall, classify, split_session_prefix  # noqa: E402
from addon.runtime import Runtime  # noqa: E402
from addon.server import CALL_PATH, HEADER_CALL_ID, HEADER_PATH, HEADER_SESSION, INTERNAL_HEADERS  # noqa: E402
from addon.sessions import SESSION_HEADER, Evidence, api_key, attribute  # noqa: E402
from converters import dialect_for  # noqa: E402
from converters.canonical import ConversionError  # noqa: E402

log = logging.getLogger("harnessrl.capture")


class Capture:
    def __init__(self) -> None:
        self.config: CaptureConfig | None = None
        self.runtime: Runtime | None = None
        self._ready = asyncio.Event()  # set once the runtime is up; calls arriving earlier wait for it

    def load(self, loader) -> None:
        add_options(loader)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine call would drown the log

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("harnessrl_") for name in updated):
            return
        try:
            self.config = CaptureConfig.from_options(ctx.options)
        except ValueError as e:
            raise exceptions.OptionsError(str(e)) from e

    async def running(self) -> None:
        assert self.config is not None
        self.runtime = await Runtime.start(self.config)
        self._ready.set()
        log.info(
            "harnessrl: answering %s on internal port %d from %s",
            self.config.describe_hosts(),
            self.runtime.port,
            self.runtime.engine.describe(),
        )

    async def done(self) -> None:
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
        await self._ready.wait()
        try:
            await self._answer(flow)
        except Exception as e:  # the proxy never dies on a request
            log.exception("harnessrl: failed to answer %s %s", flow.request.method, flow.request.pretty_url)
            flow.response = http.Response.make(500, json.dumps({"error": {"message": str(e)}}).encode())

    async def _answer(self, flow: http.HTTPFlow) -> None:
        assert self.config is not None and self.runtime is not None
        req = flow.request
        prefix_session, path = split_session_prefix(req.path.split("?", 1)[0])
        query = dict(parse_qsl(req.path.split("?", 1)[1])) if "?" in req.path else {}
        headers = {k.lower(): v for k, v in req.headers.items()}
        decision = classify(req.method, path, query, headers)
        if isinstance(decision, ModelCall):
            if len(req.raw_content or b"") > self.config.max_body:
                err = ConversionError("too_large", f"request body exceeds {self.config.max_body} bytes")
                flow.response = _wire_error(decision.route.format, err)
                return
            self._retarget(flow, prefix_session, path, query)
        else:
            if isinstance(decision, LocalAnswer):
                log.info(
                    "harnessrl: local answer %d for %s %s (%s)",
                    decision.status,
                    req.method,
                    req.pretty_url,
                    decision.reason,
                )
            reply = await self.runtime.answer_locally(decision, req.raw_content or b"", headers)
            flow.response = http.Response.make(reply.status, reply.body, reply.headers)

    def _retarget(self, flow: http.HTTPFlow, prefix_session: str | None, path: str, query: dict[str, str]) -> None:
        assert self.config is not None and self.runtime is not None
        req = flow.request
        auth = flow.metadata.get("proxyauth")
        evidence = Evidence(
            proxyauth_user=auth[0] if isinstance(auth, tuple) and auth else None,
            prefix_session=prefix_session,
            header_session=req.headers.get(SESSION_HEADER),
            api_key=api_key(req.headers),
        )
        session, _source = attribute(self.config.session_sources, evidence)
        for name in INTERNAL_HEADERS:
            req.headers.pop(name, None)  # a client cannot spoof the proxy's own bookkeeping
        original = path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
        req.headers[HEADER_SESSION] = session
        req.headers[HEADER_PATH] = original
        req.headers[HEADER_CALL_ID] = uuid.uuid4().hex
        req.scheme, req.host, req.port, req.path = "http", "127.0.0.1", self.runtime.port, CALL_PATH
        flow.metadata["harnessrl"] = session

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if "harnessrl" in flow.metadata and flow.response is not None:
            flow.response.stream = True  # pass every chunk on as the engine samples it

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        if self._intercepted(flow) and flow.websocket is not None:
            log.info("harnessrl: websocket on an intercepted host was not refused: %s", flow.request.pretty_url)


def _wire_error(format, err: ConversionError) -> http.Response:
    wire = dialect_for(format).render_error(err)
    return http.Response.make(wire.status, wire.body, dict(wire.headers))


addons = [Capture()]

if __name__ == "__main__":  # pragma: no cover - helpful message when run by mistake
    print("load this file into mitmproxy: mitmdump -s addon/capture.py", file=sys.stderr)
    asyncio.run(asyncio.sleep(0))

"""The vendor routes served straight by the internal server: a base URL for harnesses that take one, without
mitmproxy in the path.

Contract
--------
With ``harnessrl_base_url=true`` the internal server (127.0.0.1, ``harnessrl_server_port``) also answers every
path that is not its own (``/_harnessrl/...``) as the capture addon answers an intercepted request in reverse
mode: ``/s/<session>/v1/chat/completions``, ``/s/<session>/v1/messages``, ``/v1beta/models/m:generateContent``...
Model calls are generated and recorded exactly as through mitmproxy (same generator, same records); count-tokens,
model listings, the WebSocket refusal and harmless local answers come from
:meth:`addon.runtime.Runtime.answer_locally`. The session comes from ``harnessrl_session_sources`` (``prefix``,
``header``, ``api_key``; ``proxyauth`` has nothing to read here). A body over ``harnessrl_max_body`` gets a 413 in
the caller's wire format.

Limitation: aiohttp's request parser refuses a repeated singleton header (two ``User-Agent`` lines...) with a
plain-text 400 before any handler or middleware runs, and has no public setting to relax it; the capture addon folds
such lines before a call reaches this server through mitmproxy (``addon.capture.fold_field_lines``), so a client that
repeats them must use mitmproxy's port.

Why: a call through mitmproxy is parsed and relayed twice (mitmproxy's HTTP layers, then this server); a harness
that takes a base URL over plain HTTP on the same machine needs neither hop (benchmarks/side_by_side.py measures
both). Harnesses that only honour ``HTTPS_PROXY`` keep using mitmproxy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web

from addon.routes import (
    CountTokens,
    LocalAnswer,
    ModelCall,
    ModelList,
    WebSocketRefused,
    classify,
    split_session_prefix,
)
from addon.server import INTERNAL_HEADERS, InternalServer
from addon.sessions import SESSION_HEADER, Evidence, SessionSource, api_key, attribute
from converters import dialect_for
from converters.canonical import ConversionError

log = logging.getLogger("harnessrl.base_url")

LocalDecision = CountTokens | ModelList | WebSocketRefused | LocalAnswer


class Reply(Protocol):
    """What :meth:`addon.runtime.Runtime.answer_locally` returns (``LocalReply``)."""

    @property
    def status(self) -> int: ...

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str]: ...


class BaseUrlEndpoint:
    def __init__(
        self,
        server: InternalServer,
        sources: tuple[SessionSource, ...],
        max_body: int,
        answer_locally: Callable[[LocalDecision, bytes, Mapping[str, str]], Awaitable[Reply]],
    ) -> None:
        self.server = server
        self.sources = tuple(s for s in sources if s != "proxyauth")
        self.max_body = max_body
        self._answer_locally = answer_locally

    def install(self) -> None:
        """Route every path the server does not own here (added last: the server's own routes match first)."""
        self.server.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        prefix_session, path = split_session_prefix(request.path)
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in INTERNAL_HEADERS}
        decision = classify(request.method, path, dict(request.query), headers)
        if not isinstance(decision, ModelCall):
            if isinstance(decision, LocalAnswer):
                log.info(
                    "harnessrl: local answer %d for %s %s (%s)", decision.status, request.method, path, decision.reason
                )
            body = await request.read() if isinstance(decision, CountTokens) else b""
            reply = await self._answer_locally(decision, body, headers)
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        if (request.content_length or 0) > self.max_body:
            return self._too_large(decision)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # no content-length: aiohttp counted while reading
            return self._too_large(decision)
        if len(body) > self.max_body:
            return self._too_large(decision)
        evidence = Evidence(
            prefix_session=prefix_session,
            header_session=request.headers.get(SESSION_HEADER),  # the session header is also an internal one
            api_key=api_key(headers),
        )
        session, _source = attribute(self.sources, evidence)
        return await self.server.serve_model_call(request, decision, session, headers, body=body)

    def _too_large(self, decision: ModelCall) -> web.Response:
        err = ConversionError("too_large", f"request body exceeds {self.max_body} bytes")
        wire = dialect_for(decision.route.format).render_error(err)
        return web.Response(status=wire.status, body=wire.body, headers=dict(wire.headers))


__all__ = ["BaseUrlEndpoint"]

"""The vendor routes served straight by the internal server: a base URL for harnesses that take one, without
mitmproxy in the path.

Contract
--------
With ``harnessrl_base_url=true`` the internal server (127.0.0.1, ``harnessrl_server_port``) also answers every
path that is not its own (``/_harnessrl/...``) as the capture addon answers an intercepted request in reverse
mode: ``/s/<session>/v1/chat/completions``, ``/s/<session>/v1/messages``, ``/v1beta/models/m:generateContent``...
Model calls are generated and recorded exactly as through mitmproxy (same generator, same records); count-tokens,
model listings, the WebSocket refusal and harmless local answers come from
:meth:`addon.serving.runtime.Runtime.answer_locally`. The session comes from ``harnessrl_session_sources`` (``prefix``,
``header``, ``api_key``; ``proxyauth`` has nothing to read here). A body over ``harnessrl_max_body`` gets a 413 in
the caller's wire format.

Limitation: aiohttp's request parser refuses a repeated singleton header (two ``User-Agent`` lines...) with a
plain-text 400 before any handler or middleware runs, and has no public setting to relax it; the capture addon folds
such lines before a call reaches this server through mitmproxy, and the TLS relay's server folds them too
(:func:`addon.serving.field_lines.fold_field_lines`), so a client that repeats them must use mitmproxy's port.

Why: a call through mitmproxy is parsed and relayed twice (mitmproxy's HTTP layers, then this server); a harness
that takes a base URL over plain HTTP on the same machine needs neither hop (benchmarks/side_by_side.py measures
both). Harnesses that only honour ``HTTPS_PROXY`` keep using mitmproxy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from aiohttp import web

from addon.generation.sessions import SESSION_HEADER, SessionSource
from addon.serving.admission import Admitted, Arrival, LocalDecision, Refused, admit, too_large
from addon.serving.routes import CountTokens
from addon.serving.server import INTERNAL_HEADERS, InternalServer

log = logging.getLogger("harnessrl.base_url")


class Reply(Protocol):
    """What :meth:`addon.serving.runtime.Runtime.answer_locally` returns (``LocalReply``)."""

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
        headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in INTERNAL_HEADERS}
        arrival = Arrival(
            method=request.method,
            # the decoded path (as aiohttp routes it), the query still encoded: admission parses it once
            target=request.path + (f"?{q}" if (q := request.rel_url.raw_query_string) else ""),
            headers=headers,
            body_length=request.content_length,
            header_session=request.headers.get(SESSION_HEADER),  # the session header is also an internal one
        )
        verdict = admit(arrival, self.sources, self.max_body)
        if isinstance(verdict, Refused):
            return _response(verdict)
        if not isinstance(verdict, Admitted):
            body = await request.read() if isinstance(verdict.decision, CountTokens) else b""
            reply = await self._answer_locally(verdict.decision, body, headers)
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # no content-length: aiohttp counted while reading
            return _response(too_large(verdict.call, self.max_body))
        if len(body) > self.max_body:
            return _response(too_large(verdict.call, self.max_body))
        return await self.server.serve_model_call(request, verdict.call, verdict.session, headers, body=body)


def _response(refused: Refused) -> web.Response:
    return web.Response(status=refused.status, body=refused.body, headers=refused.headers)


__all__ = ["BaseUrlEndpoint"]

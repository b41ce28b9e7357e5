"""Admission: the one decision both front doors (mitmproxy's hooks in ``addon/capture.py`` and the base URL of
:mod:`addon.serving.base_url`) and the internal call route make about a request, before any body is parsed.

Contract
--------
:func:`admit` takes what a front door knows of a request (:class:`Arrival`: method, target with any ``/s/<session>``
prefix and query, lower-case headers, the body's length when known, the session evidence) and returns one of:

* :class:`Admitted` — a model call: its route (wire format, path, Gemini's model and stream mode, query), the
  session it belongs to (from the configured ``harnessrl_session_sources``, first that has a value) and the source;
* :class:`Local` — answered by the proxy itself: count-tokens, a model listing, the WebSocket refusal, or a local
  answer for telemetry, probes and unknown routes (logged with its reason);
* :class:`Refused` — refused in the caller's own wire format (a body over ``max_body``: 413 ``too_large``).

:func:`refusal` renders any :class:`~converters.canonical.ConversionError` for a route as the vendor's error
(status, body, headers), and :func:`unavailable` chooses the wire format of a 503 for a request that arrives while
the proxy cannot answer (starting, failed to start). Pure: no I/O, no mitmproxy, no aiohttp.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from addon.generation.sessions import Evidence, SessionSource, api_key, attribute
from addon.serving.routes import (
    CountTokens,
    LocalAnswer,
    ModelCall,
    ModelList,
    WebSocketRefused,
    classify,
    guess_format,
    split_session_prefix,
)
from converters import dialect_for
from converters.base import WireFormat
from converters.canonical import ConversionError

log = logging.getLogger("harnessrl.admission")

LocalDecision = CountTokens | ModelList | WebSocketRefused | LocalAnswer


@dataclass(frozen=True)
class Arrival:
    """What a front door knows of a request before reading its body."""

    method: str
    target: str  # path and query as received, with a /s/<session>/ prefix if any
    headers: Mapping[str, str]  # lower-case names, the proxy's internal headers already removed
    body_length: int | None = None  # None: not known before reading (no Content-Length)
    proxyauth_user: str | None = None
    header_session: str | None = None

    @property
    def parts(self) -> tuple[str | None, str, dict[str, str]]:
        """(prefix session, path without the prefix, query)."""
        raw_path, _, raw_query = self.target.partition("?")
        prefix, path = split_session_prefix(raw_path)
        return prefix, path, dict(parse_qsl(raw_query))


@dataclass(frozen=True)
class Admitted:
    call: ModelCall
    session: str
    source: SessionSource | None
    path: str  # without the session prefix
    query: dict[str, str] = field(default_factory=dict)

    @property
    def original(self) -> str:
        """The path and query the client asked for, without the session prefix."""
        return self.path + ("?" + "&".join(f"{k}={v}" for k, v in self.query.items()) if self.query else "")


@dataclass(frozen=True)
class Local:
    decision: LocalDecision


@dataclass(frozen=True)
class Refused:
    status: int
    body: bytes
    headers: dict[str, str]
    reason: str


Verdict = Admitted | Local | Refused


def admit(arrival: Arrival, sources: Iterable[SessionSource], max_body: int | None = None) -> Verdict:
    """Classify, size-check and attribute one request (see the module docstring); ``max_body=None``: no size
    limit (a call a front door already checked)."""
    prefix, path, query = arrival.parts
    decision = classify(arrival.method, path, query, arrival.headers)
    if not isinstance(decision, ModelCall):
        if isinstance(decision, LocalAnswer):
            log.info(
                "harnessrl: local answer %d for %s %s (%s)", decision.status, arrival.method, path, decision.reason
            )
        return Local(decision)
    if max_body is not None and arrival.body_length is not None and arrival.body_length > max_body:
        return too_large(decision, max_body)
    evidence = Evidence(
        proxyauth_user=arrival.proxyauth_user,
        prefix_session=prefix,
        header_session=arrival.header_session,
        api_key=api_key(arrival.headers),
    )
    session, source = attribute(sources, evidence)
    return Admitted(decision, session, source, path, query)


def too_large(call: ModelCall, max_body: int) -> Refused:
    """The 413 for a model call whose body is over ``max_body`` (checked again once a body of unknown length is
    read)."""
    return refusal(call.route.format, ConversionError("too_large", f"request body exceeds {max_body} bytes"))


def refusal(format: WireFormat, err: ConversionError) -> Refused:
    """``err`` as the vendor of ``format`` would send it."""
    wire = dialect_for(format).render_error(err)
    return Refused(wire.status, wire.body, dict(wire.headers), err.message)


def unavailable(arrival: Arrival, reason: str, retry_after: float) -> Refused:
    """The 503 (with ``retry-after``) for a request the proxy cannot answer now, in the wire format its route (or,
    for an auxiliary route, its path and headers) implies."""
    _, path, _ = arrival.parts
    decision = classify(arrival.method, path, {}, arrival.headers)
    fmt: WireFormat
    if isinstance(decision, ModelCall | CountTokens):
        fmt = decision.route.format
    elif isinstance(decision, ModelList):
        fmt = decision.format
    else:
        fmt = guess_format(path, arrival.headers)
    return refusal(fmt, ConversionError("unavailable", reason, retry_after=retry_after))

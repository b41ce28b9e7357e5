"""The errors of the canonical model: a request the proxy cannot serve (:class:`ConversionError`, with its
:data:`ErrorKind` and HTTP status) and a complete answer (:class:`WireResponse`).

Contract
--------
Wire-format free, like :mod:`converters.canonical` (which re-exports all of it): each dialect renders a
``ConversionError`` in its own error shape (``render_error``), with the one retry rule of all four formats
(:meth:`ConversionError.retry_headers`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

ErrorKind: TypeAlias = Literal[
    "invalid_request",  # 400
    "authentication",  # 401
    "permission",  # 403
    "not_found",  # 404 unknown model or route
    "too_large",  # 413
    "context_length",  # 400 with the vendor's context-length wording
    "rate_limited",  # 429
    "internal",  # 500
    "unavailable",  # 503 engine down
    "overloaded",  # 529 (Anthropic) / 503
    "timeout",  # 504
]

ERROR_STATUS: Mapping[ErrorKind, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "too_large": 413,
    "context_length": 400,
    "rate_limited": 429,
    "internal": 500,
    "unavailable": 503,
    "overloaded": 529,
    "timeout": 504,
}


# Rate limited, engine unavailable, overloaded: a client that waits and retries will be served.
RETRYABLE_KINDS: frozenset[ErrorKind] = frozenset({"rate_limited", "unavailable", "overloaded"})


class ConversionError(Exception):
    """A request the proxy cannot serve, to be answered in the caller's own error shape.

    Raised by the request parsers; the addon renders it with the dialect's ``render_error``.
    """

    def __init__(
        self, kind: ErrorKind, message: str, *, param: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.kind]

    @property
    def retry_after_s(self) -> float | None:
        """Seconds a client should wait before retrying a retryable error: its own delay, else 1 s (some clients give
        up at once on a 429/503 without one); None for the other kinds (retrying a 400 cannot help)."""
        if self.kind not in RETRYABLE_KINDS:
            return None
        return 1.0 if self.retry_after is None else max(self.retry_after, 0.0)

    def retry_headers(self) -> dict[str, str]:
        """The one retry rule of all four formats: ``retry-after`` (whole seconds, at least 1) and
        ``retry-after-ms`` (the OpenAI and Anthropic SDKs prefer it) whenever :attr:`retry_after_s` is set."""
        wait = self.retry_after_s
        if wait is None:
            return {}
        return {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(round(wait * 1000))}


@dataclass(frozen=True)
class WireResponse:
    """A complete HTTP answer: status, headers and body bytes."""

    status: int
    headers: Mapping[str, str]
    body: bytes

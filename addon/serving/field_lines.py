"""Header field lines as a front door receives them, folded to one line per name for the internal servers.

Contract
--------
:func:`fold_field_lines` takes a request's field lines (name, value bytes, in order, names in any case) and returns
one line per name, values combined as below; it raises :class:`~converters.canonical.ConversionError`
(``invalid_request``) on ambiguous message framing. Pure, no I/O: the capture addon applies it to a flow it
retargets, the TLS relay (:mod:`addon.serving.relay`) to every request it reads.

Why: HTTP lets a client repeat a field (hermes sends its SDK's ``User-Agent`` and its own), and aiohttp's request
parser refuses a repeated singleton outright (``400 Duplicate 'User-Agent' header found``), before any handler runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from converters.canonical import ConversionError

log = logging.getLogger("harnessrl.capture")

# aiohttp's strict request parser (the internal server's) answers "400 Duplicate '<name>' header found" to a second
# field line of these names (aiohttp.http_parser.SINGLETON_HEADERS, aiohttp 3.14), lower-case like the keys below.
AIOHTTP_SINGLETONS = frozenset(
    {
        b"content-length",
        b"content-location",
        b"content-range",
        b"content-type",
        b"etag",
        b"host",
        b"max-forwards",
        b"server",
        b"transfer-encoding",
        b"user-agent",
    }
)
# A vendor SDK's or HTTP library's own agent: a harness that adds a User-Agent line of its own names itself there, so
# the folded value lists the harness first, where harness_from_user_agent (addon/serving/server.py) looks when no
# pattern of
# its table matches (hermes: "claude-code/2.0.14 Anthropic/Python 0.69.0" is claude-code, not "Anthropic").
_LIBRARY_AGENT = re.compile(
    rb"^\s*(?:anthropic/|openai/|google-genai-sdk/|python-httpx/|python-requests/|python-urllib|aiohttp/|node-fetch/"
    rb"|node/|axios/|undici|okhttp/|go-http-client/|curl/)",
    re.IGNORECASE,
)


def fold_field_lines(fields: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """One field line per name (at its first line's place, with its first spelling), values combined.

    HTTP allows a field to be repeated and a recipient to combine the lines (RFC 9110 §5.3); the internal server keeps
    one value per name, and refuses repeated singletons outright. Combining:

    * ``User-Agent``: the distinct values joined by a space, library agents last. Its grammar is a space-separated
      list of products (RFC 9110 §10.1.5), so the result is one valid User-Agent naming every product; a comma (the
      list-field separator) is not part of that grammar. The record keeps both values (``identity_hints``).
    * ``Cookie``: joined by ``"; "`` (RFC 6265 §5.4), as mitmproxy does for HTTP/2 cookies.
    * ``Content-Length``: one line when all agree; values that disagree raise.
    * ``Transfer-Encoding`` repeated, or present with ``Content-Length``: raises (RFC 9112 §6.1, §6.3: request
      smuggling). mitmproxy's ``validate_inbound_headers`` (on by default) refuses these first; this keeps the
      internal server safe when that check is off.
    * the other singletons aiohttp refuses (Content-Type, ETag, Host...): exact repeats are dropped; different values
      keep the first, as Node's and Go's servers do (logged).
    * any other field: joined by ``", "`` (RFC 9110 §5.3), which is also what the addon saw (mitmproxy's
      ``Headers[name]``); kept apart, the internal server would see only the last line.

    Raises :class:`ConversionError` (``invalid_request``) on ambiguous framing."""
    grouped: dict[bytes, tuple[bytes, list[bytes]]] = {}
    for name, value in fields:
        key = name.lower()
        if key in grouped:
            grouped[key][1].append(value)
        else:
            grouped[key] = (name, [value])
    _check_framing(grouped)
    return tuple((name, _combine(key, values)) for key, (name, values) in grouped.items())


def _check_framing(grouped: dict[bytes, tuple[bytes, list[bytes]]]) -> None:
    te = grouped.get(b"transfer-encoding", (b"", []))[1]
    cl = grouped.get(b"content-length", (b"", []))[1]
    if len(te) > 1:
        raise ConversionError("invalid_request", "several Transfer-Encoding header lines: ambiguous message framing")
    if te and cl:
        raise ConversionError(
            "invalid_request", "both Transfer-Encoding and Content-Length headers: ambiguous message framing"
        )
    if len({v.strip() for v in cl}) > 1:
        lengths = b", ".join(cl).decode("ascii", "replace")
        raise ConversionError(
            "invalid_request", f"Content-Length header lines disagree ({lengths}): ambiguous message framing"
        )


def _combine(key: bytes, values: list[bytes]) -> bytes:
    if len(values) == 1:
        return values[0]
    if key == b"cookie":
        return b"; ".join(values)
    if key == b"user-agent":
        distinct = list(dict.fromkeys(v.strip() for v in values if v.strip()))
        return b" ".join(sorted(distinct, key=lambda v: bool(_LIBRARY_AGENT.match(v))))  # stable: harness first
    if key in AIOHTTP_SINGLETONS:
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1:
            log.info("harnessrl: %d different %s header lines; the first is kept", len(distinct), key.decode())
        return distinct[0]
    return b", ".join(values)


__all__ = ["AIOHTTP_SINGLETONS", "fold_field_lines"]

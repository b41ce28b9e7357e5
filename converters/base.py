"""The small interface every wire format implements, and the helpers all of them share.

Contract
--------
A :class:`Dialect` is a stateless object per wire format:

* ``parse_request(body, route, headers, fields)`` turns the raw request body into a canonical
  :class:`~converters.canonical.ModelRequest`, or raises :class:`~converters.canonical.ConversionError`.
* ``render_request(request)`` is the inverse (used by round-trip tests and the benchmark replayer).
* ``render_completion(completion)`` gives the non-streaming JSON body.
* ``stream_encoder(route, request)`` gives a fresh :class:`StreamEncoder`: a sans-IO transducer fed canonical stream
  events, returning the exact bytes to send for each. ``error(err)`` renders an in-stream error event.
* ``render_error(err)`` gives a :class:`~converters.canonical.WireResponse` in the vendor's error shape.

Nothing here does I/O or imports mitmproxy. Unknown request fields go to an :class:`UnknownFields` sink, which logs
each field name once per sink (the addon owns one sink for its lifetime; there is no global state).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import msgspec

from converters.canonical import (
    Completion,
    ConversionError,
    ModelRequest,
    StreamEvent,
    WireFormat,
    WireResponse,
)

log = logging.getLogger("harnessrl.converters")


@dataclass(frozen=True)
class Route:
    """What the URL says about a call: which format, whether it streams (Gemini puts both in the path)."""

    format: WireFormat
    path: str
    model: str | None = None  # Gemini: from /v1beta/models/{model}:method
    stream: bool | None = None  # Gemini: streamGenerateContent; others: decided by the body
    sse: bool = True  # Gemini: alt=sse (True) or the JSON-array stream (False)
    query: Mapping[str, str] = field(default_factory=dict)


class UnknownFields:
    """A sink for request fields a parser does not know. Logs each dotted field name once."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._seen: set[str] = set()
        self._log = logger or log

    def report(self, where: str, names: set[str] | list[str] | Any) -> None:
        for name in sorted(names):
            key = f"{where}.{name}"
            if key not in self._seen:
                self._seen.add(key)
                self._log.info("ignoring unknown request field %s", key)

    def check(self, where: str, obj: Mapping[str, Any], known: frozenset[str] | set[str]) -> None:
        """Report every key of ``obj`` not in ``known``."""
        extra = set(obj) - set(known)
        if extra:
            self.report(where, extra)

    @property
    def seen(self) -> frozenset[str]:
        return frozenset(self._seen)


T = TypeVar("T")


class ItemReuse(Protocol):
    """What a dialect needs of :class:`converters.delta.ListReuse` (which imports this module)."""

    def load(self, body: bytes | Mapping[str, Any], key: str, scope: str) -> Mapping[str, Any]: ...

    def items(
        self,
        raw: Sequence[Any],
        parse_one: Callable[[Any, int], T],
        after_reused: Callable[[Sequence[T]], None] | None = None,
    ) -> list[T]: ...

    def value(self, name: str, parse: Callable[[], T]) -> T: ...

    def derived(self, name: str, sources: tuple[Any, ...], build: Callable[[], T]) -> T: ...


class StreamEncoder(ABC):
    """Sans-IO stream transducer: canonical events in, wire bytes out. One instance per response."""

    @abstractmethod
    def feed(self, event: StreamEvent) -> bytes:
        """Bytes to send for this event (may be empty). Raises ``ValueError`` on an impossible event order."""

    @abstractmethod
    def error(self, err: ConversionError) -> bytes:
        """Bytes for an in-stream error event, ending the stream."""

    @property
    @abstractmethod
    def content_type(self) -> str:
        """The response Content-Type for this stream."""


class Dialect(ABC):
    """One wire format. Subclasses are stateless; register them in ``converters.DIALECTS``."""

    format: ClassVar[WireFormat]

    @abstractmethod
    def parse_request(
        self,
        body: bytes | Mapping[str, Any],
        route: Route,
        headers: Mapping[str, str] | None = None,
        fields: UnknownFields | None = None,
        *,
        reuse: ItemReuse | None = None,
    ) -> ModelRequest:
        """``reuse``: the session's previous request, whose unchanged conversation items are taken as they were
        parsed instead of decoded and parsed again (:class:`converters.delta.ListReuse`)."""

    @abstractmethod
    def render_request(self, request: ModelRequest) -> dict[str, Any]: ...

    @abstractmethod
    def render_completion(self, completion: Completion) -> dict[str, Any]: ...

    @abstractmethod
    def stream_encoder(self, route: Route, request: ModelRequest | None = None) -> StreamEncoder:
        """A fresh encoder for one response. ``request`` lets a format honour request-level stream options
        (Chat ``stream_options.include_usage``)."""

    @abstractmethod
    def render_error(self, err: ConversionError) -> WireResponse: ...


# --------------------------------------------------------------------------------------------------- shared helpers


_decode = msgspec.json.Decoder().decode


def load_json_object(body: bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    """Decode a request body into a JSON object, or raise a 400 ConversionError saying what is wrong.

    Every request is decoded here, whole, on every call: the largest single cost of the proxy's own per-call work in
    profiles (py-spy, 8k-token sessions: 8% of the CPU of a call). msgspec decodes a body about 1.7x as fast as the
    standard library and gives the same objects for valid JSON (integers past 64 bits stay exact ints; the last of
    duplicate keys wins); whatever it refuses (NaN, an overflowing float, a lone surrogate escape, invalid UTF-8,
    deep nesting, malformed JSON) is decoded again by the standard library below, so what is accepted and what each
    error says are the standard library's, as before."""
    if isinstance(body, Mapping):
        return body
    try:
        obj = _decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        obj = _load_strictly(body)
    if not isinstance(obj, dict):
        raise ConversionError("invalid_request", f"request body must be a JSON object, got {type(obj).__name__}")
    return obj


def _load_strictly(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError("invalid_request", f"request body is not valid UTF-8: {e}") from e
    try:
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise ConversionError("invalid_request", f"request body is not valid JSON: {e}") from e
    except RecursionError as e:
        raise ConversionError("invalid_request", "request body is nested too deeply") from e
    except ValueError as e:  # an integer past Python's digit limit, NaN/Infinity, a float that overflows
        raise ConversionError("invalid_request", f"request body holds a number out of range: {e}") from e
    return obj


def _reject_constant(name: str) -> Any:
    """``NaN``/``Infinity`` are not JSON (Python accepts them); a NaN temperature would reach the engine."""
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} overflows a float")
    return value


def dumps(obj: Any) -> str:
    """Compact JSON as the vendors send it (no spaces, UTF-8 kept)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


_encode_event = msgspec.json.Encoder().encode


def dumps_event(obj: Any) -> bytes:
    """A stream event's JSON as UTF-8 bytes, compact, non-ASCII kept (as :func:`dumps`). msgspec, not ``json``: the
    encoders run once per engine read of every call, and a typical event encodes ~6x as fast. Its text equals
    :func:`dumps`'s for strings, ints, bools and null (all an event holds); a float is written in msgspec's shortest
    form (``1e-05`` becomes ``0.00001``, the same value) and a NaN as ``null`` (valid JSON, where ``json`` writes
    ``NaN``). Argument texts keep :func:`dumps`: their exact text is rendered into prompts."""
    return _encode_event(obj)


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event. ``data`` is JSON-encoded unless it is already a string."""
    payload = data.encode() if isinstance(data, str) else _encode_event(data)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


def expect(obj: Mapping[str, Any], key: str, typ: type | tuple[type, ...], where: str, required: bool = False) -> Any:
    """Read ``obj[key]`` checking its JSON type; a wrong type is a 400 naming the field."""
    if key not in obj or obj[key] is None:
        if required:
            raise ConversionError("invalid_request", f"{where}.{key}: field required", param=key)
        return None
    value = obj[key]
    # bool is an int subclass; a JSON true where a number belongs is a type error.
    if isinstance(value, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise ConversionError("invalid_request", f"{where}.{key}: expected {_tname(typ)}, got boolean", param=key)
    if not isinstance(value, typ):
        raise ConversionError(
            "invalid_request", f"{where}.{key}: expected {_tname(typ)}, got {type(value).__name__}", param=key
        )
    return value


def _tname(typ: type | tuple[type, ...]) -> str:
    names = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}
    types = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join(names.get(t, t.__name__) for t in types)

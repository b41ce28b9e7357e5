"""The JSON blobs of call records: one encoding, zstd packing, and a per-message cache that makes it O(new suffix).

Contract
--------
* Every stored JSON blob (``request_canonical``, ``completion_canonical``) is :func:`dumps_json` text — sorted keys,
  no spaces, UTF-8 as is, NaN refused — compressed as standard zstd data whose frames record their content size
  (``zstd -dc`` reads it): one frame by :func:`pack_json_text`, or several concatenated frames of consecutive
  pieces of the text by :class:`~addon.records.blob_frames.RequestFrames` (a session's request, the frames of its
  previous call reused). :func:`pack_json` is both steps; :func:`unpack_json` is the inverse of both
  (:func:`zstd_content_size` sums the frames' sizes).
* :func:`plain` turns dataclasses (recursively) into JSON-compatible values: exactly what
  ``dataclasses.asdict`` followed by tuples/sets -> lists and mapping keys -> ``str`` gives, without asdict's deep
  copy of every leaf.
* :class:`CanonicalJson` builds the text of a canonical request with each message's and tool's fragment cached by
  value. Its output is always equal to ``dumps_json(plain(request))``; only the cost differs: a session resends its
  whole history every call, and with the cache only the new messages are encoded. Given the session, a call's
  messages and tools are first compared with the same session's previous call, position by position (one equality
  test each, no hashing: the common tool loop), and only the others go through the cache.

Nothing here imports mitmproxy. ``addon.records.schema`` re-exports :func:`pack_json` / :func:`unpack_json`.

Layout: encoding, packing, the cache.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from converters.canonical import ToolSpec
from converters.delta import same_objects

# ------------------------------------------------------------------------------------------------ encoding

# The one encoding of every stored JSON blob: sorted keys, no spaces, UTF-8 as is, no NaN.
_JSON: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps_json(value: Any) -> str:
    """``value`` as :func:`pack_json` encodes it (dataclasses are not encoded: pass :func:`plain` of them)."""
    return _JSON.encode(value)


def plain(value: Any) -> Any:
    """Dataclasses (recursively) as JSON-compatible values: what ``dataclasses.asdict`` then tuples and sets to
    lists and mapping keys to strings gives, without asdict's deep copy of every leaf."""
    names = _dataclass_fields(type(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return value


_FIELDS: dict[type, tuple[str, ...] | None] = {}  # per class: a fixed set (the canonical model and builtins)


def _dataclass_fields(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type, None for any other type (memoised: this runs for every value)."""
    try:
        return _FIELDS[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
        _FIELDS[cls] = names
        return names


_KEYS: dict[type, tuple[tuple[str, str], ...]] = {}


def _sorted_keys(cls: type, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """A dataclass's field names in sorted order, each with its JSON text (memoised per class)."""
    try:
        return _KEYS[cls]
    except KeyError:
        keys = _KEYS[cls] = tuple((name, _JSON.encode(name)) for name in sorted(names))
        return keys


# ------------------------------------------------------------------------------------------------ packing

_ZSTD_MAGIC = 0xFD2FB528
# Level 1, not 3: on a 128k-token session's request (760 KB of JSON) level 3 took 13.7 ms against 3.0 ms for 8%
# fewer bytes (benchmarks/results/stage_costs.md); this runs on every call. Readers do not depend on the level.
BLOB_ZSTD_LEVEL: Final = 1
_codec = pa.Codec("zstd", compression_level=BLOB_ZSTD_LEVEL)


def pack_json(value: Any) -> bytes:
    """JSON-encode ``value`` and compress it as one zstd frame (with its content size, which unpack needs)."""
    return pack_json_text(_JSON.encode(value))


def pack_json_text(text: str) -> bytes:
    """Compress JSON text made by :func:`dumps_json` or :class:`CanonicalJson` as :func:`pack_json` would."""
    packed: bytes = _codec.compress(text.encode(), asbytes=True)
    return packed


def unpack_json(blob: bytes) -> Any:
    """Inverse of :func:`pack_json`; also reads a blob of several frames
    (:class:`~addon.records.blob_frames.RequestFrames`)."""
    size = zstd_content_size(blob)
    return json.loads(_codec.decompress(blob, decompressed_size=size, asbytes=True))


_SKIPPABLE_MAGIC = 0x184D2A50  # the 16 magic numbers of skippable frames: this one with any last four bits


def zstd_content_size(blob: bytes) -> int:
    """The content size of zstd data, summed over its concatenated frames (RFC 8878 §3.1): each frame's header
    records its own (pyarrow's decompress needs the total); a frame's end is found by walking its blocks' 3-byte
    headers (a few per frame: a block holds at most 128 KiB). Raises ValueError for anything else."""
    total, pos, end = 0, 0, len(blob)
    while pos < end or pos == 0:
        if end - pos < 8:
            raise ValueError("not a zstd frame" if pos == 0 else "truncated zstd data")
        magic = struct.unpack_from("<I", blob, pos)[0]
        if magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
            pos += 8 + struct.unpack_from("<I", blob, pos + 4)[0]
            continue
        if magic != _ZSTD_MAGIC:
            raise ValueError("not a zstd frame")
        descriptor = blob[pos + 4]
        fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
        offset = pos + 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
        fcs_size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
        if fcs_size == 0:
            raise ValueError("zstd frame does not record its content size")
        size = int.from_bytes(blob[offset : offset + fcs_size], "little")
        total += size + 256 if fcs_size == 2 else size
        pos = offset + fcs_size
        last = False
        while not last:
            if end - pos < 3:
                raise ValueError("truncated zstd data")
            header = int.from_bytes(blob[pos : pos + 3], "little")
            last, kind = bool(header & 1), (header >> 1) & 3
            if kind == 3:
                raise ValueError("zstd block of the reserved type")
            pos += 3 + (1 if kind == 1 else header >> 3)  # an RLE block stores its one byte
        pos += 4 if descriptor & 4 else 0  # the content checksum
        if pos > end:
            raise ValueError("truncated zstd data")
    return total


# ------------------------------------------------------------------------------------------------ the cache


class CanonicalJson:
    """The JSON text of canonical requests with each message's and tool's fragment cached by value.

    A session's calls resend the same history (freshly parsed objects, equal by value), so after the first call only
    the new messages are encoded; the rest is hashing (C; each string caches its hash) and a join. The text is
    exactly :func:`dumps_json` of :func:`plain` of the request, so readers see no difference.

    Why a value key is safe although Python's ``==`` says ``1 == 1.0 == True`` where JSON does not: the canonical
    model's typed fields hold their declared types (the parsers check them), and its JSON-ish mappings
    (``ProviderState.data``, ``ToolSpec.parameters``) hash through ``json.dumps``, which tells those apart; dict
    lookups compare hashes before ``==``. ``ToolSpec.__hash__`` leaves out ``tools`` and ``provider_state``, so a
    tool's key adds them (:func:`_key`).

    ``request(r, session=...)``: each message and tool equal to the one at the same position of that session's
    previous request reuses its text without hashing (hashing a message walks all of it, and the LRU's lookup and
    move each compare it again: ~5 us per message, the largest part of a call's record cost in py-spy profiles at
    32 sessions). The canonical model's equality is exact for this (its JSON mappings compare as JSON text:
    ``ProviderState``, ``ToolSpec``). The previous request of each session is held (its messages are the objects
    the session graph holds anyway) up to ``max_chars`` of its texts, least recently used sessions dropped first;
    :meth:`forget` drops one at once (a closed session).

    The cache is LRU, bounded by ``max_chars`` of cached text (a value over an eighth of it is encoded but not kept,
    so one huge value cannot flush a session's working set); the keys, the messages themselves, hold about as much
    again. The default, 32 M characters, holds the histories of ~40 sessions at 128k tokens or ~250 at 20k; past
    that, interleaved sessions evict each other and the cost goes back to encoding whole requests (never a wrong
    text). Thread-safe: records are built in worker threads.
    """

    CACHED_FIELDS: Final = ("messages", "tools")

    def __init__(self, max_chars: int = 32 << 20) -> None:
        if max_chars < 1:
            raise ValueError(f"CanonicalJson max_chars must be at least 1, got {max_chars}")
        self.max_chars = max_chars
        self._cache: OrderedDict[_Hashed, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.reused = 0  # fragments taken from the session's previous request, unhashed
        # per session: its previous request's cached fields as (values, their texts), and how many chars those hold
        self._recent: OrderedDict[str, tuple[dict[str, _Texts], int]] = OrderedDict()
        self._recent_chars = 0

    def request(self, request: Any, session: str | None = None) -> str:
        """JSON text of a dataclass whose ``messages`` / ``tools`` tuples are encoded element by element, cached;
        with ``session``, compared first with that session's previous request (see the class docstring)."""
        return self.request_layout(request, session)[0]

    def request_layout(self, request: Any, session: str | None = None) -> tuple[str, TextLayout]:
        """:meth:`request`'s text and where its parts are (:class:`TextLayout`), for
        :class:`~addon.records.blob_frames.RequestFrames`."""
        names = _dataclass_fields(type(request))
        if names is None:
            raise TypeError(f"CanonicalJson.request needs a dataclass, got {type(request).__name__}")
        previous: dict[str, _Texts] = {}
        if session is not None:
            with self._lock:
                entry = self._recent.get(session)
            previous = entry[0] if entry is not None else {}
        # One list of pieces and one join at the end: building the text field by field copied the whole history's
        # text four more times per call (the list's brackets, the field's key, the fields' join, the braces).
        out: list[str] = []
        remembered: dict[str, _Texts] = {}
        at, spans = 0, {}  # the text's length so far; each cached field's array contents as (start, end)
        for name, key in _sorted_keys(type(request), names):  # what sort_keys does to the top-level object
            head = f"{',' if out else '{'}{key}:"
            out.append(head)
            at += len(head)
            value = getattr(request, name)
            if name in self.CACHED_FIELDS and isinstance(value, tuple):
                texts = self._texts(value, previous.get(name))
                remembered[name] = (value, texts)
                joined = ",".join(texts)
                out += ("[", joined, "]")
                spans[name] = (at + 1, at + 1 + len(joined), len(texts[-1]) if texts else 0)
                at += len(joined) + 2
            else:
                out.append(text := _JSON.encode(plain(value)))
                at += len(text)
        if session is not None:
            self._remember(session, remembered)
        if not out:
            return "{}", TextLayout(0, None)
        out.append("}")
        messages, tools = spans.get("messages"), spans.get("tools")
        # the messages before the last one (with the comma after them): what the next call of a tool loop repeats
        stable = messages[1] - messages[2] if messages else 0
        return "".join(out), TextLayout(stable, tools[:2] if tools and tools[1] > tools[0] else None)

    def forget(self, session: str) -> None:
        """Drop what is held of ``session``'s previous request (the session closed)."""
        with self._lock:
            entry = self._recent.pop(session, None)
            if entry is not None:
                self._recent_chars -= entry[1]

    def _texts(self, values: tuple[Any, ...], previous: _Texts | None) -> tuple[str, ...]:
        """Each value's fragment: the previous request's text where the value at its position is equal, else the
        cache's. Equal canonical values encode alike (exact equality: see the class docstring)."""
        if previous is None:
            return tuple(map(self.fragment, values))
        old_values, old_texts = previous
        # the leading run of the very same objects (the delta parse hands a call its session's previous ones), found
        # in C: a Python loop over every message was O(session length) per call
        same = same_objects(old_values, values)
        texts, reused = list(old_texts[:same]), same
        for i in range(same, len(values)):
            value = values[i]
            if i < len(old_values) and old_values[i] == value:
                texts.append(old_texts[i])
                reused += 1
            else:
                texts.append(self.fragment(value))
        if reused:
            with self._lock:
                self.reused += reused
        return tuple(texts)

    def _remember(self, session: str, fields: dict[str, _Texts]) -> None:
        chars = sum(sum(map(len, texts)) for _, texts in fields.values())
        with self._lock:
            entry = self._recent.pop(session, None)
            if entry is not None:
                self._recent_chars -= entry[1]
            if chars > self.max_chars // 8:  # like one huge value in the cache: not kept
                return
            self._recent[session] = (fields, chars)
            self._recent_chars += chars
            while self._recent_chars > self.max_chars:
                self._recent_chars -= self._recent.popitem(last=False)[1][1]

    @property
    def sessions_held(self) -> int:
        return len(self._recent)

    def fragment(self, value: Any) -> str:
        """``dumps_json(plain(value))``, from the cache when an equal value was encoded before."""
        try:
            key = _Hashed(_key(value))
        except TypeError:  # an unhashable value (a list somewhere inside): encode it, do not cache it
            return _JSON.encode(plain(value))
        with self._lock:
            text = self._cache.get(key)
            if text is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return text
            self.misses += 1
        text = _JSON.encode(plain(value))
        if len(text) <= self.max_chars // 8:
            with self._lock:
                if key not in self._cache:  # another thread may have encoded the same value meanwhile
                    self._cache[key] = text
                    self._chars += len(text)
                while self._chars > self.max_chars:
                    self._chars -= len(self._cache.popitem(last=False)[1])
        return text

    @property
    def cached_chars(self) -> int:
        return self._chars

    def __len__(self) -> int:
        return len(self._cache)


_Texts = tuple[tuple[Any, ...], tuple[str, ...]]  # a request's values of one cached field, and their fragments


@dataclass(frozen=True)
class TextLayout:
    """Where the parts of a request's JSON text (:meth:`CanonicalJson.request_layout`) are, as character offsets.

    ``stable``: the end of the part a session's next call most likely starts with: everything up to the messages
    before the last one (a harness may still rewrite the last, e.g. move a cache breakpoint); ``tools``: the
    ``tools`` array's contents as (start, end), None when it is empty."""

    stable: int
    tools: tuple[int, int] | None


class _Hashed:
    """A cache key whose hash is computed once: a lookup, a hit's move to the end and a miss's insert each hash the
    key, and a message or a tool hashes its whole content every time (Python caches no hash of a tuple or a
    dataclass)."""

    __slots__ = ("hash", "value")

    def __init__(self, value: Hashable) -> None:
        self.value = value
        self.hash = hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hashed) and self.hash == other.hash and self.value == other.value


def _key(value: Any) -> Hashable:
    """The cache key of a value: the value itself, plus what its own hash leaves out (nested tools, provider
    state of a :class:`ToolSpec`), so that two keys that compare equal always encode to the same text."""
    if isinstance(value, ToolSpec):
        return (value, tuple(_key(t) for t in value.tools), value.provider_state)
    return value


__all__ = [
    "CanonicalJson",
    "TextLayout",
    "dumps_json",
    "pack_json",
    "pack_json_text",
    "plain",
    "unpack_json",
    "zstd_content_size",
]

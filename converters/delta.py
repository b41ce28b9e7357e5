"""A request body decoded and parsed in O(what is new): the items of its conversation list (``messages``,
``contents``, ``input``) that the same session's previous request already held, byte for byte at the same position,
are neither decoded nor parsed again.

Contract
--------
Sans-IO. A harness resends the whole conversation on every call, so a session's requests share a long byte prefix:
everything up to the end of the last item the previous call held. :class:`ListMemo` is what one call leaves for the
next (its body, where each of its list's items ends, and what each item was parsed into); :class:`ListReuse` is
one call's view: ``load(body, key, scope)`` returns the body's top-level object with ``obj[key]`` a list whose first
``reused`` entries are :data:`REUSED` (their decoded value is not built), and ``items(obj[key], parse_one)`` returns
the parsed items, the reused ones from the memo; ``value(name, parse)`` does the same for one other top-level field
(the tools: a harness sends the same ones every call), taken when its bytes equal the previous request's;
``derived(name, sources, build)`` gives back what the previous call built from the very same parsed objects (the
Responses API's assistant turn, joined from several input items). ``memo()`` is what the next call compares with.

Correctness rests on two facts, both checked, never assumed: (1) the new body starts with exactly the previous
body's bytes up to the end of item ``j - 1`` (one ``startswith``), so those items, and everything before the list,
are the same JSON text; (2) each body's layout was verified when its memo was made: its top-level object, walked
key by key in the decoder's own order, is exactly ``{ "key": value, ... }`` with each value where msgspec's
``Raw`` says (duplicate keys, escaped key names or anything unusual fail the walk and give no memo). An item is a
pure function of its bytes for every format here (Chat's tool results take their call's kind from earlier items:
the converter re-derives that, see ``converters.chat``), so equal bytes at the same position parse to an equal item.
The reused item is the very object parsed before: callers may test identity first. The other top-level fields keep
their decoded values when their bytes are unchanged (those before the list always are): the decoded objects are
shared from call to call, which is safe because nothing downstream mutates a decoded request (the converters build
new objects from it).

Any decode error, an unverifiable layout, or no previous memo: the body is decoded whole by
:func:`~converters.base.load_json_object` (its errors and its fallbacks are the caller's), and no item is reused.

The memo holds the body (about the conversation's size in bytes) until the session's next call replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from operator import is_, is_not
from typing import Any, TypeVar

import msgspec

from converters.base import load_json_object

T = TypeVar("T")


class _Reused:
    """The placeholder for an item that is not decoded again (the memo holds what it was parsed into)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REUSED"


REUSED: Any = _Reused()

_top = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_list = msgspec.json.Decoder(list[msgspec.Raw]).decode
_value = msgspec.json.Decoder().decode
_WS = re.compile(rb"[ \t\n\r]*")


@dataclass(frozen=True)
class ListMemo:
    """One request's list field: the body, the offset just past each item, and each item's parse."""

    scope: str  # the format that parsed it: the same bytes parse differently in another format
    key: str
    body: bytes
    opening: int  # the offset of the list's ``[``
    ends: tuple[int, ...]
    results: tuple[Any, ...]
    # every other top-level field, in order: its bytes and its decoded value; the first ``head`` precede the list
    fields: tuple[tuple[str, bytes, Any], ...] = ()
    head: int = 0
    values: tuple[tuple[str, bytes, Any], ...] = ()  # a top-level field's bytes and what they were parsed into
    # (name, id of the first source) -> the sources and what was built from them (see ListReuse.derived); the memo
    # holds the sources, so their ids cannot be reused by other objects while an entry lives
    derived: Mapping[tuple[str, int], tuple[tuple[Any, ...], Any]] = field(default_factory=dict)


class ListReuse:
    """One call's decode and item parse against its session's previous :class:`ListMemo` (None: nothing to reuse)."""

    def __init__(self, previous: ListMemo | None = None) -> None:
        self.previous = previous
        self.reused = 0
        self._key: str | None = None
        self._scope = ""
        self._body = b""
        self._opening = 0
        self._ends: tuple[int, ...] | None = None  # None: this body's layout is unknown, no memo
        self._results: tuple[Any, ...] | None = None
        self._fields: tuple[tuple[str, bytes, Any], ...] = ()  # the other top-level fields (see ListMemo)
        self._head = 0
        self.parsed = 0  # items parsed (not reused)
        self._values: list[tuple[str, bytes, Any]] = []
        self._derived: dict[tuple[str, int], tuple[tuple[Any, ...], Any]] = {}

    def load(self, body: bytes | Mapping[str, Any], key: str, scope: str) -> Mapping[str, Any]:
        """The body's top-level object; ``obj[key]``'s first :attr:`reused` entries are :data:`REUSED`. ``scope``
        names the parser (the wire format): a memo is reused only by the same one."""
        if isinstance(body, Mapping) or not isinstance(body, bytes):
            return load_json_object(body)
        self._key, self._scope, self._body = key, scope, body
        try:
            found = self._load_suffix(body, key) if self._can_reuse(key, scope) else None
            if found is None:
                found = self._load_whole(body, key)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
            found = None
        if found is None:
            self.reused, self._ends, self._fields = 0, None, ()
            return load_json_object(body)
        return found

    def items(
        self,
        raw: Sequence[Any],
        parse_one: Callable[[Any, int], T],
        after_reused: Callable[[Sequence[T]], None] | None = None,
    ) -> list[T]:
        """``parse_one(item, index)`` for each item that is new; the memo's result for each reused one (a leading
        run, given to ``after_reused`` before the first new item is parsed, for a parse that reads earlier items)."""
        n = self.reused if self.previous is not None else 0
        done: list[Any] = list(self.previous.results[:n]) if n and self.previous is not None else []
        if after_reused is not None:
            after_reused(done)
        done.extend(parse_one(item, i) for i, item in enumerate(raw[n:], n))
        self.parsed = len(done) - n
        self._results = tuple(done)
        return done

    def value(self, name: str, parse: Callable[[], T]) -> T:
        """``parse()`` of the top-level field ``name``, or the previous request's result when its bytes are equal."""
        raw = next((v for k, v, _ in self._fields if k == name), None)
        if raw is not None and self.previous is not None:
            for key, before, parsed in self.previous.values:
                if key == name and before == raw:
                    self._values.append((key, raw, parsed))
                    return parsed
        result = parse()
        if raw is not None:
            self._values.append((name, raw, result))
        return result

    def derived(self, name: str, sources: tuple[Any, ...], build: Callable[[], T]) -> T:
        """``build()``, or the object the previous call built under ``name`` from the very same ``sources`` (each
        one the same object: reused items are), so that what is built from reused items is itself the object the
        session graph already holds (its checks go by identity), as a reused item is."""
        if not sources:
            return build()
        key = (name, id(sources[0]))
        before = self.previous.derived.get(key) if self.previous is not None else None
        if before is not None and len(before[0]) == len(sources) and all(map(is_, before[0], sources)):
            result: T = before[1]
        else:
            result = build()
        self._derived[key] = (sources, result)
        return result

    def memo(self) -> ListMemo | None:
        """What the next call of the session compares with; None when this body gave nothing to compare."""
        if self._key is None or self._ends is None or self._results is None or len(self._results) != len(self._ends):
            return None
        return ListMemo(
            self._scope,
            self._key,
            self._body,
            self._opening,
            self._ends,
            self._results,
            self._fields,
            self._head,
            tuple(self._values),
            self._derived,
        )

    # --------------------------------------------------------------------------------------------------- decode

    def _can_reuse(self, key: str, scope: str) -> bool:
        p = self.previous
        return p is not None and (p.scope, p.key) == (scope, key) and bool(p.ends) and len(p.results) == len(p.ends)

    def _shared(self, body: bytes) -> int:
        """How many of the previous body's leading items this body holds, byte for byte, at the same offsets."""
        assert self.previous is not None
        prev, ends = memoryview(self.previous.body), self.previous.ends
        if body.startswith(prev[: ends[-1]]):
            return len(ends)
        lo, hi = 0, len(ends) - 1  # the answer is in [lo, hi]: items up to lo-1 match, item hi does not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if body.startswith(prev[: ends[mid - 1]]):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _load_suffix(self, body: bytes, key: str) -> dict[str, Any] | None:
        """Decode only what follows the shared items: the head (before the list) and the new suffix."""
        assert self.previous is not None
        j = self._shared(body)
        if j == 0:
            return None
        opening = self.previous.opening
        cut = self.previous.ends[j - 1]
        after = _WS.match(body, cut).end()  # type: ignore[union-attr]
        if body[after : after + 1] not in (b",", b"]"):  # item j-1 goes on here (a number: 1 then 1.5)
            return None
        lead = b'{"' + key.encode() + b'":[0'  # a stand-in first item, then the rest of this body's list
        synthetic = lead + body[cut:]
        layout = _walk(synthetic)
        if layout is None or next(iter(layout)) != key:
            return None
        offset, raw_list = layout[key]
        # the fields before the list are the previous body's bytes; a field after it whose bytes are unchanged (the
        # tools, sampling options) keeps its decoded value too: nothing downstream mutates a decoded request
        head = self.previous.fields[: self.previous.head]
        before = {name: (raw, value) for name, raw, value in self.previous.fields}
        tail = tuple(
            (k, v, before[k][1] if k in before and before[k][0] == v else _value(v))
            for k, (_, v) in layout.items()
            if k != key
        )
        if {k for k, _, _ in tail} & {k for k, _, _ in head}:
            return None
        new_raw = _list(raw_list)[1:]
        new_ends = _item_ends(synthetic, offset + 2, new_raw, after_item=True)  # past '[' and the stand-in '0'
        if new_ends is None:
            return None
        shift = cut - len(lead)
        self.reused, self._opening = j, opening
        self._fields, self._head = head + tail, len(head)
        self._ends = self.previous.ends[:j] + tuple(e + shift for e in new_ends)
        obj: dict[str, Any] = {k: v for k, _, v in head}
        obj[key] = [REUSED] * j + [_value(r) for r in new_raw]
        obj.update((k, v) for k, _, v in tail)
        return obj

    def _load_whole(self, body: bytes, key: str) -> dict[str, Any] | None:
        """The whole body, decoded value by value so that the list's item offsets are known for the next call."""
        layout = _walk(body)
        if layout is None:
            return None
        obj = {k: _value(v) for k, (_, v) in layout.items() if k != key or v[:1] != b"["}
        if key in layout and layout[key][1][:1] == b"[":
            offset, raw_list = layout[key]
            raw_items = _list(raw_list)
            ends = _item_ends(body, offset + 1, raw_items, after_item=False)
            if ends is None:
                return None
            self._opening, self._ends = offset, ends
            obj = {k: (obj[k] if k != key else [_value(r) for r in raw_items]) for k in layout}
            self._head = list(layout).index(key)
        self._fields = tuple((k, v, obj[k]) for k, (_, v) in layout.items() if k != key)
        return obj


def same_objects(before: Sequence[Any], after: Sequence[Any]) -> int:
    """How many leading items of ``after`` are the very objects of ``before`` (found in C, no Python loop): what a
    caller holding the previous call's parse skips, since the reused items are those objects."""
    return next(compress(count(), map(is_not, before, after)), min(len(before), len(after)))


def _walk(text: bytes) -> dict[str, tuple[int, bytes]] | None:
    """Each top-level key's value and its offset, when the object is exactly ``{"k": v, ...}`` in the decoder's
    order (no duplicate or escaped keys); None otherwise."""
    top = _top(text)
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] != b"{":
        return None
    pos += 1
    out: dict[str, tuple[int, bytes]] = {}
    for i, (k, raw) in enumerate(top.items()):
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if i:
            if text[pos : pos + 1] != b",":
                return None
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
        name = b'"' + k.encode() + b'"'
        if '"' in k or "\\" in k or not text.startswith(name, pos):
            return None
        pos = _WS.match(text, pos + len(name)).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != b":":
            return None
        pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
        value = bytes(raw)
        if not text.startswith(value, pos):
            return None
        out[k] = (pos, value)
        pos += len(value)
    pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] != b"}" or _WS.match(text, pos + 1).end() != len(text):  # type: ignore[union-attr]
        return None
    return out


def _item_ends(text: bytes, pos: int, raw_items: Sequence[msgspec.Raw], after_item: bool) -> tuple[int, ...] | None:
    """The offset just past each item of a list, searched from ``pos``: just past its ``[`` (``after_item``
    false) or past an item. Only whitespace and one comma may lie between items."""
    ends: list[int] = []
    for raw in raw_items:
        value = bytes(raw)
        start = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if ends or after_item:
            if text[start : start + 1] != b",":
                return None
            start = _WS.match(text, start + 1).end()  # type: ignore[union-attr]
        if not text.startswith(value, start):
            return None
        pos = start + len(value)
        ends.append(pos)
    return tuple(ends)

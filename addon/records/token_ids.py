"""Token ids held packed: checked, viewed as Arrow and written as JSON without a Python-level pass per id.

Contract
--------
A long prompt is 10^5 ids; every pass that touches them one Python int at a time costs milliseconds per call on the
proxy's one event loop. These helpers do the per-id work in C:

* :func:`pack` — ``array('i')`` of the ids (the same object when it already is one, a :class:`FrozenIds`' own
  array), ``ValueError`` naming ``name`` for anything that is not a token id in [0, 2**31);
* :func:`arrow` — an int32 Arrow array over the packed buffer (no copy);
* :func:`json_list` — the ids as a compact JSON list (``"[1,2,3]"``): msgspec's encoder up to ``ARROW_JSON`` ids
  (a call's new suffix: ~7 us for 300 ids, 44 for 2,000, against Arrow's 55 and 91 and a GIL release per kernel),
  Arrow's cast and join kernels past it (a whole 128k prompt: ~3 ms against msgspec's ~4.4);
* :class:`JsonIds` — packed ids and their JSON list as ASCII bytes, made together (:meth:`JsonIds.of`, and
  :meth:`JsonIds.extending`, which formats only the ids after an earlier list that is a prefix of these: a
  session's next prompt extends its last one, so the cost follows the new suffix, not the context), so whoever
  sends the list knows which ids it holds without reading it again;
* :class:`FrozenIds` — an immutable sequence of ids over one packed array: what a splice plan and a record hold
  for a prompt that arrived packed, instead of a tuple of 10^5 Python ints (3-3.5 ms to build at 131k ids, and 8
  bytes a pointer plus an int object per id, against 4 bytes an id).

A packed array handed on is treated as read-only by everyone who holds it (the session graph shares it).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

INT32_MAX = 2**31 - 1
# Arrow's compute calls cost ~8 us of fixed overhead each and release the GIL (a wait to get it back in a busy
# process), so short lists, a call's usual new suffix, stay off them. Up to this many ids pack's sign check reads
# the ids' top bytes (C-level, GIL held: ~11 us at 2,000 ids) instead of Arrow's min (~8 us alone, but 0.12 ms a
# call at 32 sessions in a py-spy profile, round 22: the planning thread waiting to get the GIL back).
SIGN_BYTES = 4096
# Up to this many ids json_list uses msgspec (measured on this VM: equal near 40k ids; Arrow 2.9 ms against 4.4 at
# 131k, msgspec 0.33 against 0.40 ms at 16k).
ARROW_JSON = 40_000
_TOP_BYTE = 3 if sys.byteorder == "little" else 0  # the byte of an int32 that holds its sign
_encode_json = msgspec.json.Encoder().encode

if array("i").itemsize != 4:
    raise ImportError("addon.records.token_ids needs a platform whose C int is 4 bytes")


def pack(ids: Sequence[int], name: str = "token ids") -> array[int]:
    """The ids as ``array('i')``; ValueError when one is not an int in [0, 2**31)."""
    if isinstance(ids, FrozenIds):
        return ids.packed  # checked when it was made
    if isinstance(ids, array) and ids.typecode == "i":
        packed = ids
    else:
        try:
            packed = array("i", ids)  # one C loop; raises for anything outside int32 or not an int
        except (OverflowError, TypeError) as e:
            bad = [i for i in ids if not isinstance(i, int) or not 0 <= i <= INT32_MAX][:3]
            raise ValueError(f"{name} must hold token ids in [0, 2**31); got {bad}") from e
    if 0 < len(packed) <= SIGN_BYTES:
        # every id's sign byte below 0x80, i.e. no negative id, without an int object per id
        if not memoryview(packed).cast("B")[_TOP_BYTE::4].tobytes().isascii():
            raise ValueError(f"{name} must hold token ids in [0, 2**31); got {min(packed)}..{max(packed)}")
    elif len(packed):
        view = arrow(packed)
        low = pc.min(view).as_py()
        if low < 0:
            raise ValueError(f"{name} must hold token ids in [0, 2**31); got {low}..{pc.max(view).as_py()}")
    return packed


def arrow(packed: array[int]) -> pa.Array:
    """An int32 Arrow array over ``packed``'s buffer (shared, not copied)."""
    return pa.Array.from_buffers(pa.int32(), len(packed), [None, pa.py_buffer(packed)])


def json_list(ids: Sequence[int]) -> str:
    """``ids`` as a compact JSON list of integers."""
    return json_bytes(ids).decode()


def json_bytes(ids: Sequence[int]) -> bytes:
    """:func:`json_list` as ASCII bytes (what a request body carries)."""
    packed = pack(ids)
    if len(packed) <= ARROW_JSON:
        data: bytes = _encode_json(packed.tolist())
        return data
    text = pc.cast(arrow(packed), pa.string())
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(text)], pa.int32()), text), ",")
    return b"[" + joined[0].as_buffer().to_pybytes() + b"]"


class JsonIds:
    """Packed ids and :func:`json_list` of them (ASCII bytes: the engine request's body is bytes), made together by
    :meth:`of` or :meth:`extending` (the only ways to make one), so that the list is known to hold exactly ``ids``:
    a request that carries one checks that its ids are these (the same array, or an equal one: a C-level compare)
    instead of reading the list again (counting the commas of a 131k-id list cost ~0.6 ms per call on the event
    loop)."""

    __slots__ = ("ids", "data")
    ids: array[int]
    data: bytes

    def __init__(self) -> None:
        raise TypeError("JsonIds are made by JsonIds.of or JsonIds.extending")

    @classmethod
    def _made(cls, ids: array[int], data: bytes) -> JsonIds:
        made = cls.__new__(cls)
        made.ids, made.data = ids, data
        return made

    @classmethod
    def of(cls, ids: Sequence[int]) -> JsonIds:
        """``ids`` packed (checked as :func:`pack` checks) with their JSON list."""
        packed = pack(ids)
        return cls._made(packed, json_bytes(packed))

    @classmethod
    def extending(cls, ids: array[int], earlier: JsonIds | None) -> JsonIds:
        """``ids`` (packed, read-only from now on) with their JSON list, formatted from ``earlier``'s when its ids
        are a prefix of these (a C-level compare of the arrays): only the new ids are formatted."""
        if not (isinstance(ids, array) and ids.typecode == "i"):
            raise TypeError(f"JsonIds.extending takes an array('i'), got {type(ids).__name__}")
        n = len(earlier.ids) if earlier is not None else 0
        if earlier is None or n == 0 or n > len(ids) or ids[:n] != earlier.ids:
            return cls._made(ids, json_bytes(ids))
        if n == len(ids):
            return cls._made(ids, earlier.data)
        # one copy of the long part (a slice, then a concatenation, made two)
        new = json_bytes(ids[n:])
        return cls._made(ids, b"".join((memoryview(earlier.data)[:-1], b",", memoryview(new)[1:])))

    @property
    def text(self) -> str:
        return self.data.decode()

    def lists(self, packed: array[int]) -> bool:
        """Whether this list is the JSON list of ``packed``."""
        return self.ids is packed or self.ids == packed

    def __repr__(self) -> str:
        return f"JsonIds({len(self.ids)} ids, {len(self.data)} bytes)"


__all__ = ["INT32_MAX", "JsonIds", "arrow", "json_bytes", "json_list", "pack"]


class FrozenIds(Sequence[int]):
    """Token ids that cannot change, held in their own ``array('i')`` (a copy, or one adopted from whoever just
    built it), which :func:`pack` hands out as it is: the engine request and a row's Arrow column read the ids
    without a copy. Equal to any tuple or list of the same ids (so a record built from packed ids equals the same
    record read back from a shard); a slice is a tuple."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Sequence[int], name: str = "token ids") -> None:
        packed = pack(ids, name)
        self._ids = array("i", packed) if packed is ids else packed  # a caller's array is copied, never shared

    @classmethod
    def adopt(cls, packed: array[int]) -> FrozenIds:
        """``packed`` (an ``array('i')`` of valid ids just built) held as it is, without a copy: whoever built it
        hands it over and, like everyone else who holds it, never writes to it again."""
        if not (isinstance(packed, array) and packed.typecode == "i"):
            raise TypeError(f"FrozenIds.adopt takes an array('i'), got {type(packed).__name__}")
        frozen = cls.__new__(cls)
        frozen._ids = packed
        return frozen

    @property
    def packed(self) -> array[int]:
        """The ids' own array: read it, never write to it."""
        return self._ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return tuple(self._ids[index])
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenIds):
            return self._ids == other._ids
        if isinstance(other, tuple | list):
            return len(other) == len(self._ids) and tuple(self._ids) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._ids))

    def __add__(self, other: Sequence[int]) -> tuple[int, ...]:
        return (*self._ids, *other)

    def __radd__(self, other: Sequence[int]) -> tuple[int, ...]:
        return (*other, *self._ids)

    def __repr__(self) -> str:
        head = ", ".join(map(str, self._ids[:8]))
        return f"FrozenIds([{head}{', ...' if len(self._ids) > 8 else ''}], {len(self._ids)} ids)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenIds, (tuple(self._ids),))

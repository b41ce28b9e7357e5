"""converters.base: the shared request-body decoding every wire format goes through (regressions found by the
fuzzing in tests/test_fuzz.py: numbers Python's json accepts but a vendor API would not). The body is decoded by
msgspec, and again by the standard library when msgspec refuses it: property tests check that what comes out, and
what is refused, is what the standard library alone gives."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from converters.base import dumps, dumps_event, load_json_object, sse
from converters.canonical import ConversionError


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", "out of range"),  # past Python's int digit limit: was a 500
        (b'{"temperature": NaN}', "out of range"),  # was accepted: a NaN temperature reached the engine
        (b'{"temperature": Infinity}', "out of range"),
        (b'{"temperature": -Infinity}', "out of range"),
        (b'{"temperature": 1e999}', "out of range"),  # overflows to inf
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"model": "\xff"}', "not valid UTF-8"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_malformed_bodies_are_400s(body: bytes, says: str) -> None:
    with pytest.raises(ConversionError) as err:
        load_json_object(body)
    assert err.value.kind == "invalid_request" and err.value.status == 400
    assert says in err.value.message


def test_ordinary_numbers_still_parse() -> None:
    obj = load_json_object(b'{"max_tokens": 123456789012345678901234567890, "temperature": 0.7, "x": -1.5e300}')
    assert obj == {"max_tokens": 123456789012345678901234567890, "temperature": 0.7, "x": -1.5e300}


def stdlib_only(body: bytes) -> object:
    """What the standard library alone makes of ``body``: the object, or the kind of refusal."""
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=lambda c: 1 / 0)
    except (UnicodeDecodeError, ValueError, RecursionError, ZeroDivisionError):
        return "refused"
    if not isinstance(obj, dict) or _has_inf(obj):
        return "refused"
    return obj


def _has_inf(obj: object) -> bool:
    if isinstance(obj, float):
        return math.isinf(obj)
    if isinstance(obj, dict):
        return any(_has_inf(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_inf(v) for v in obj)
    return False


def ours(body: bytes) -> object:
    try:
        return load_json_object(body)
    except ConversionError:
        return "refused"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), JSON, max_size=5), st.booleans(), st.booleans())
def test_valid_bodies_decode_as_the_standard_library_decodes_them(obj: dict, ascii_only: bool, spaced: bool) -> None:
    body = json.dumps(obj, ensure_ascii=ascii_only, separators=(", ", ": ") if spaced else (",", ":"))
    encoded = body.encode("utf-8", "surrogatepass")  # st.text() may hold lone surrogates: escaped if ascii_only
    assert ours(encoded) == stdlib_only(encoded)
    if ascii_only:
        assert ours(encoded) == obj or obj != obj  # a round trip (NaN-free, so equal)


@given(st.binary(max_size=64) | st.text(alphabet='{}[]",:0123456789.eE+-tfnrulsa\\u \n', max_size=40).map(str.encode))
def test_arbitrary_bodies_are_accepted_or_refused_as_the_standard_library_would(body: bytes) -> None:
    assert ours(body) == stdlib_only(body)


@pytest.mark.parametrize(
    "body",
    [b'{"a": "\\ud800"}', b'{"a": "\\udc00x"}', b'{"a": 18446744073709551616}', b'{"a": -9223372036854775809}',
     b'{"a": 1, "a": 2}', b'{"a": -0.0, "b": 1e-400}', b' {"a": [ ] } '],
)  # fmt: skip
def test_edge_cases_decode_as_the_standard_library_decodes_them(body: bytes) -> None:
    assert ours(body) == stdlib_only(body) != "refused"


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)))  # what a str from the tokenizer can hold
EVENT = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(TEXT, EVENT, max_size=5))
def test_a_stream_event_is_written_as_dumps_writes_it(obj: dict) -> None:
    """What a stream event holds (strings, ints, bools, null) comes out byte for byte as ``dumps`` writes it."""
    assert dumps_event(obj) == dumps(obj).encode()
    assert sse(obj, event="e") == b"event: e\ndata: " + dumps(obj).encode() + b"\n\n"


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=8))
def test_an_event_float_keeps_its_value(values: list[float]) -> None:
    assert json.loads(dumps_event({"v": values})) == {"v": values}
    assert dumps_event({"v": float("nan")}) == b'{"v":null}'  # valid JSON, where json.dumps writes NaN

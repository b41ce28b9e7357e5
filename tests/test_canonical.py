"""converters/canonical.py: the hash and the equality of the JSON mappings the canonical model holds (tool schemas,
provider state)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from converters.canonical import JsonSchemaFormat, ProviderState, ToolSpec, json_hash, json_text

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _reordered(value: Any) -> Any:
    """The same value with every object's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


@given(json_values)
def test_equal_json_hashes_equal_whatever_the_key_order(value: Any) -> None:
    again = json.loads(json.dumps(value))  # fresh objects, as the next call's parse gives
    assert json_hash(_reordered(again)) == json_hash(value)
    assert hash(ToolSpec("t", parameters={"v": again})) == hash(ToolSpec("t", parameters={"v": value}))


def test_values_json_tells_apart_hash_apart() -> None:
    """1 == 1.0 == True to Python, not to JSON; the records' cache keys rely on their hashes differing."""
    variants = [1, 1.0, True, "1", [1], {"1": 1}]
    assert len({json_hash({"n": v}) for v in variants}) == len(variants)
    assert len({hash(ProviderState("gemini", {"n": v})) for v in variants}) == len(variants)
    assert len({hash(JsonSchemaFormat({"n": v}, "s")) for v in variants}) == len(variants)


def test_values_msgspec_does_not_encode_hash_as_before() -> None:
    """Non-JSON values and non-string keys hash through json.dumps, as before msgspec; keys of mixed types cannot be
    sorted by either, and stay unhashable (the records' cache then encodes such a value uncached)."""
    for value in ({1: "a"}, {"x": {1, 2}}, {"when": object()}):
        assert json_hash(value) == json_hash(value)
    assert json_text({1: "a"}) == json.dumps({1: "a"}, sort_keys=True, default=str).encode()
    with pytest.raises(TypeError):
        json_hash({1: "a", "b": 2})


def _holders(value: Any) -> tuple[Any, ...]:
    return (
        ProviderState("anthropic", {"v": value}),
        ToolSpec("t", "d", {"v": value}),
        ToolSpec("ns", kind="namespace", tools=(ToolSpec("t", parameters={"v": value}),)),
        JsonSchemaFormat({"v": value}, "s"),
    )


@given(json_values, json_values)
def test_holders_are_equal_exactly_when_their_json_is(a: Any, b: Any) -> None:
    """Equal means the same JSON text (and equal to Python): the records' encoding cache reuses a previous call's
    text for an equal value, so ``1`` / ``1.0`` / ``True`` and ``0.0`` / ``-0.0`` must not be equal; equal holders
    hash alike whatever their key order."""
    b = json.loads(json.dumps(b))  # fresh objects, as the next call's parse gives
    same = a == b and json_text(a) == json_text(b)
    for x, y in zip(_holders(a), _holders(b), strict=True):
        assert (x == y) == same
        if same:
            assert hash(x) == hash(y)
    for x, y in zip(_holders(a), _holders(_reordered(a)), strict=True):
        assert x == y and hash(x) == hash(y)


def test_numbers_equal_to_python_are_not_equal_holders() -> None:
    for left, right in ((1, 1.0), (1, True), (0.0, -0.0), (0, False)):
        for x, y in zip(_holders(left), _holders(right), strict=True):
            assert x != y and not (x == y)
    nan = float("nan")
    assert ProviderState("gemini", {"v": nan}) != ProviderState("gemini", {"v": None})  # both encoders write null
    state = ProviderState("gemini", {"v": nan})
    assert state == state  # the same object
    assert ToolSpec("t", provider_state=ProviderState("chat", {"n": 1})) != ToolSpec(
        "t", provider_state=ProviderState("chat", {"n": 1.0})
    )
    assert ProviderState("chat", {"n": 1}) != ProviderState("responses", {"n": 1})
    assert ProviderState("chat", {}) != {"format": "chat", "data": {}}

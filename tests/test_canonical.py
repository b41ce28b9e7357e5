"""converters/canonical.py: the hash of the JSON mappings the canonical model holds (tool schemas, provider state)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from converters.canonical import JsonSchemaFormat, ProviderState, ToolSpec, json_hash

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
    assert json_hash({1: "a"}) == hash(json.dumps({1: "a"}, sort_keys=True, default=str))
    with pytest.raises(TypeError):
        json_hash({1: "a", "b": 2})

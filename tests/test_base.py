"""converters.base: the shared request-body decoding every wire format goes through (regressions found by the
fuzzing in tests/test_fuzz.py: numbers Python's json accepts but a vendor API would not)."""

from __future__ import annotations

import pytest

from converters.base import load_json_object
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

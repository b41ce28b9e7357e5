"""converters/errors.py: the canonical model's errors, their HTTP status and the one retry rule of all formats."""

from __future__ import annotations

import pytest

from converters import canonical, errors
from converters.errors import ERROR_STATUS, RETRYABLE_KINDS, ConversionError


def test_every_kind_has_a_status_and_the_canonical_module_re_exports_the_same_objects() -> None:
    for name in ("ConversionError", "WireResponse", "ERROR_STATUS", "RETRYABLE_KINDS"):
        assert getattr(canonical, name) is getattr(errors, name)
    assert ConversionError("context_length", "too long").status == 400
    assert ConversionError("overloaded", "busy").status == 529
    assert RETRYABLE_KINDS <= set(ERROR_STATUS)


@pytest.mark.parametrize(
    ("kind", "retry_after", "seconds", "headers"),
    [
        ("overloaded", None, 1.0, {"retry-after": "1", "retry-after-ms": "1000"}),  # no delay of its own: 1 s
        ("rate_limited", 2.4, 2.4, {"retry-after": "3", "retry-after-ms": "2400"}),  # whole seconds round up
        ("unavailable", 0.2, 0.2, {"retry-after": "1", "retry-after-ms": "200"}),  # at least 1 s in retry-after
        ("unavailable", -5.0, 0.0, {"retry-after": "1", "retry-after-ms": "0"}),
        ("invalid_request", 3.0, None, {}),  # retrying a 400 cannot help: no retry headers at all
        ("context_length", None, None, {}),
    ],
)
def test_retry_headers(kind, retry_after, seconds, headers) -> None:
    err = ConversionError(kind, "m", retry_after=retry_after)
    assert err.retry_after_s == seconds
    assert err.retry_headers() == headers
    assert str(err) == err.message == "m"

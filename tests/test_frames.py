"""The WAL payload codec (addon/records/frames.py): exact round trips, and the same refusals as the Arrow rows."""

from __future__ import annotations

import math
from itertools import count
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

from addon.records import frames
from addon.records.schema import CallRecord, row_parts, rows_batch, to_batch
from tests.record_factory import make_record, records

_ids = count()


@settings(max_examples=200, deadline=None)
@given(records(call_id="frame-call"))
def test_a_frame_decodes_to_the_record_it_encodes_and_the_same_arrow_row(record: CallRecord) -> None:
    decoded = frames.decode(frames.encode(row_parts(record)))
    assert decoded == record
    assert decoded.received_at == record.received_at and decoded.received_at.utcoffset() is not None
    assert to_batch([decoded]).equals(to_batch([record]))


def test_token_columns_travel_as_their_packed_bytes_with_nan_logprobs_kept() -> None:
    record = make_record(1, prompt_len=11_000, completion_len=300, seed=5)
    logprobs = (*record.tokens.completion_logprobs[:-1], math.nan)
    tokens = type(record.tokens)(record.tokens.prompt_ids, record.tokens.completion_ids, logprobs)
    record = make_record(1, prompt_len=11_000, completion_len=300, seed=5, tokens=tokens)
    payload = frames.encode(row_parts(record))
    # 4 bytes per id and per logprob, not a formatted list: the frame is about the size of the ids
    assert 4 * (11_000 + 300 + 300) < len(payload) < 4 * (11_000 + 600) + 2_000
    decoded = frames.decode(payload)
    assert decoded.tokens.prompt_ids == record.tokens.prompt_ids
    assert decoded.tokens.completion_ids == record.tokens.completion_ids
    assert math.isnan(decoded.tokens.completion_logprobs[-1])
    assert decoded.tokens.completion_logprobs[:-1] == record.tokens.completion_logprobs[:-1]


def test_a_sliced_arrow_array_is_encoded_from_its_offset() -> None:
    record = make_record(2, prompt_len=50, completion_len=8)
    scalars, (prompt, completion, logprobs) = row_parts(record)
    sliced = prompt.slice(10, 20)
    decoded = frames.decode(frames.encode((scalars | {"prompt_reused_tokens": 0}, (sliced, completion, logprobs))))
    assert decoded.tokens.prompt_ids == tuple(record.tokens.prompt_ids[10:30])


def _break(record: CallRecord, **fields: Any) -> CallRecord:
    """``record`` with ``fields`` set past CallRecord's own checks (what a bug elsewhere could hand the store)."""
    for name, value in fields.items():
        object.__setattr__(record, name, value)
    return record


@pytest.mark.parametrize(
    "fields",
    [
        {"policy_version": 2**63},  # past int64
        {"harness": 5},
        {"tool_call_names": ("Bash", 3)},
        {"auxiliary": "yes"},
        {"error": "bad \ud800 text"},  # a lone surrogate: not UTF-8
        {"sampling_applied": {"temperature": math.nan}},  # the JSON columns: no NaN
    ],
    ids=lambda f: next(iter(f)),
)
def test_a_row_that_does_not_fit_the_schema_is_refused_as_the_arrow_conversion_refuses_it(
    fields: dict[str, Any],
) -> None:
    record = _break(make_record(next(_ids)), **fields)
    with pytest.raises(ValueError):
        rows_batch([row_parts(record)])
    with pytest.raises(ValueError):
        frames.encode(row_parts(record))


@pytest.mark.parametrize(
    "fields",
    [{"harness_version": b"2.0"}, {"request_canonical": "not bytes"}, {"route": None}],
    ids=lambda f: next(iter(f)),
)
def test_the_frame_is_stricter_than_arrow_on_types_and_required_columns(fields: dict[str, Any]) -> None:
    """Arrow converts bytes to a string column, a str to a binary one, and a None into a required column (the
    struct conversion does not check nullability); the frame refuses them, so the shard never holds them."""
    record = _break(make_record(next(_ids)), **fields)
    rows_batch([row_parts(record)])
    with pytest.raises(ValueError, match=next(iter(fields))):
        frames.encode(row_parts(record))


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00\x01", msgspec.msgpack.encode({"run_id": "r"}), msgspec.msgpack.encode([1, 2, 3])],
    ids=["empty", "garbage", "missing columns", "not a map"],
)
def test_a_payload_that_is_not_a_record_is_a_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError):
        frames.decode(payload)


def test_format_1_frames_an_older_proxy_left_still_decode() -> None:
    record = make_record(3, prompt_len=200, completion_len=20)
    arrow_frame = to_batch([record]).serialize().to_pybytes()
    assert frames.decode_arrow(arrow_frame) == record

"""The WAL payload codec (addon/records/frames.py): exact round trips, and the same refusals as the Arrow rows."""

from __future__ import annotations

import dataclasses
import math
from itertools import count
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records import frames
from addon.records.schema import CallRecord, row_parts, rows_batch, to_batch
from tests.record_factory import extend_record, make_record, records, tool_loop_requests

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
    reader = frames.FrameReader()
    assert reader.decode(arrow_frame, format_version=1) == record
    child = extend_record(record, 4)  # a later frame may extend a format-1 one: the reader holds its ids too
    assert reader.decode(frames.encode(row_parts(child), _base(child))) == child


# ------------------------------------------------------------------------------------------------ delta frames


def _base(record: CallRecord) -> frames.PromptBase:
    assert record.parent_call_id is not None
    return frames.PromptBase(record.parent_call_id, record.prompt_reused_tokens)


def test_a_delta_frame_holds_only_the_new_ids_and_the_reader_rebuilds_the_prompt() -> None:
    root = make_record(0, prompt_len=30_000, completion_len=200, parent_call_id=None, prompt_reused_tokens=0)
    first = extend_record(root, 1, new_len=300)
    second = extend_record(first, 2, new_len=10)
    whole = [frames.encode(row_parts(r)) for r in (root, first, second)]
    deltas = [whole[0], frames.encode(row_parts(first), _base(first)), frames.encode(row_parts(second), _base(second))]
    assert len(deltas[2]) < 4_000 < 120_000 < len(whole[2])  # ~(10 + 16) ids and the scalars, not 30k ids
    reader = frames.FrameReader()
    assert [reader.decode(p) for p in deltas] == [root, first, second]
    assert frames.run_id(deltas[2], 3) == "run-1"


def test_the_base_may_end_inside_the_parents_prompt_or_its_completion() -> None:
    root = make_record(0, prompt_len=100, completion_len=20, parent_call_id=None, prompt_reused_tokens=0)
    seq = (*root.tokens.prompt_ids, *root.tokens.completion_ids)
    arrays = row_parts(root)[1][:2]
    for n in (1, 60, 100, 110, 120):
        child = make_record(1, tokens=type(root.tokens)((*seq[:n], 7, 8, 9)), **_lineage(root, n))
        assert frames.extends(row_parts(child)[1][0], n, arrays)
        reader = frames.FrameReader()
        reader.decode(frames.encode(row_parts(root)))
        assert reader.decode(frames.encode(row_parts(child), _base(child))) == child
    other = make_record(1, prompt_len=130, **_lineage(root, 120))
    assert not frames.extends(row_parts(other)[1][0], 120, arrays)
    assert not frames.extends(row_parts(other)[1][0], 121, arrays)  # more ids than the parent has


def _lineage(parent: CallRecord, n: int) -> dict[str, Any]:
    return {"parent_call_id": parent.call_id, "prompt_reused_tokens": n, "fork_reason": None}


def test_a_delta_frame_without_its_parent_or_with_a_bad_base_is_refused() -> None:
    root = make_record(0, prompt_len=50, completion_len=5, parent_call_id=None, prompt_reused_tokens=0)
    child = extend_record(root, 1)
    payload = frames.encode(row_parts(child), _base(child))
    with pytest.raises(ValueError, match="which no earlier frame holds"):
        frames.FrameReader().decode(payload)
    reader = frames.FrameReader()
    reader.decode(frames.encode(row_parts(make_record(0, prompt_len=50, completion_len=4))))  # one id short
    with pytest.raises(ValueError, match="fewer than 55 ids"):
        reader.decode(payload)
    for tokens in (0, len(child.tokens.prompt_ids) + 1):
        with pytest.raises(ValueError, match="prompt base"):
            frames.encode(row_parts(child), frames.PromptBase(root.call_id, tokens))


@settings(max_examples=100, deadline=None)
@given(records(call_id="parent"), st.integers(0, 40), st.data())
def test_any_record_extended_at_any_point_round_trips_as_a_delta(
    parent: CallRecord, new: int, data: st.DataObject
) -> None:
    seq = (*parent.tokens.prompt_ids, *parent.tokens.completion_ids)
    n = data.draw(st.integers(min(1, len(seq)), len(seq)))
    child = data.draw(records(call_id="child", run_id=parent.run_id))
    tokens = type(child.tokens)((*seq[:n], *range(new)), child.tokens.completion_ids, child.tokens.completion_logprobs)
    child = dataclasses.replace(child, tokens=tokens, **_lineage(parent, n))
    reader = frames.FrameReader()
    assert reader.decode(frames.encode(row_parts(parent))) == parent
    payload = frames.encode(row_parts(child), _base(child) if n else None)
    assert reader.decode(payload) == child


# ------------------------------------------------------------------------------------------------ request deltas


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40_000), st.binary(max_size=3), st.binary(max_size=2_000), st.data())
def test_shared_prefix_is_the_length_of_the_common_start(
    common: bytes, a: bytes, b: bytes, data: st.DataObject
) -> None:
    x, y = common + a, common + b
    expected = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    assert frames.shared_prefix(x, y) == frames.shared_prefix(y, x) == expected
    cut = data.draw(st.integers(0, len(x)))
    assert frames.shared_prefix(x, x[:cut]) == cut


def test_a_delta_frame_holds_only_the_request_bytes_after_its_parents_and_the_reader_rebuilds_them() -> None:
    blobs = list(tool_loop_requests(12))
    root = make_record(0, prompt_len=3000, parent_call_id=None, prompt_reused_tokens=0, request_canonical=blobs[-2])
    child = extend_record(root, 1, request_canonical=blobs[-1])
    shared = frames.shared_prefix(root.request_canonical, child.request_canonical)
    assert shared >= frames.MIN_SHARED_BYTES
    whole = frames.encode(row_parts(child), _base(child))
    delta = frames.encode(row_parts(child), frames.PromptBase(root.call_id, child.prompt_reused_tokens, shared))
    assert shared - 32 <= len(whole) - len(delta) <= shared  # the shared bytes, less the base's key and value
    reader = frames.FrameReader()
    assert reader.decode(frames.encode(row_parts(root))) == root
    assert reader.decode(delta) == child


def test_a_request_base_longer_than_the_blob_or_than_the_parents_is_refused() -> None:
    root = make_record(0, prompt_len=50, parent_call_id=None, prompt_reused_tokens=0)
    child = extend_record(root, 1, request_canonical=root.request_canonical + b"more")
    n = child.prompt_reused_tokens
    with pytest.raises(ValueError, match="request base"):
        frames.encode(row_parts(child), frames.PromptBase(root.call_id, n, len(child.request_canonical) + 1))
    reader = frames.FrameReader()
    reader.decode(frames.encode(row_parts(dataclasses.replace(root, request_canonical=b"short"))))
    with pytest.raises(ValueError, match="request is shorter"):
        reader.decode(frames.encode(row_parts(child), frames.PromptBase(root.call_id, n, len(root.request_canonical))))

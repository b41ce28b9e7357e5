"""Tests for addon.records.schema: typed records, the versioned schema, JSON blobs, and the readers."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records.schema import (
    RUN_ID_KEY,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    CallRecord,
    TurnTokens,
    from_row,
    iter_sessions,
    read_records,
    records_from_table,
    shard_files,
    to_batch,
    to_row,
)
from tests.record_factory import make_record, records

# ------------------------------------------------------------------------------------------------ typed records


def test_turn_tokens_rejects_unequal_completion_and_logprobs() -> None:
    with pytest.raises(ValueError, match="completion_ids has 2 tokens but completion_logprobs has 1"):
        TurnTokens((1, 2, 3), (4, 5), (-0.1,))


def test_turn_tokens_stores_tuples_and_float32_logprobs() -> None:
    tokens = TurnTokens([1, 2], [3], [-0.1])  # type: ignore[arg-type]  # lists are accepted and frozen to tuples
    assert tokens.prompt_ids == (1, 2) and tokens.completion_ids == (3,)
    assert tokens.completion_logprobs == (pa.scalar(-0.1, pa.float32()).as_py(),)
    assert tokens.completion_logprobs[0] != -0.1  # rounded to what the float32 column will hold


def test_a_missing_logprob_is_kept_as_nan_through_a_shard(tmp_path: Path) -> None:
    """vLLM sends null for a non-finite logprob; the engine client makes it NaN and the record keeps it."""
    rec = make_record(0, prompt_reused_tokens=0, tokens=TurnTokens((1, 2), (3, 4), (-0.5, float("nan"))))
    _write_shard(tmp_path, 0, [rec])
    (back,) = records_from_table(read_records(tmp_path))
    assert back.tokens.completion_logprobs[0] == rec.tokens.completion_logprobs[0]
    assert math.isnan(back.tokens.completion_logprobs[1])


@pytest.mark.parametrize(
    ("prompt", "completion", "logprobs", "message"),
    [
        ([-1], [], [], "prompt_ids must hold token ids"),
        ([1], [2**31], [0.0], "completion_ids must hold token ids"),
        ([2**31], [], [], r"prompt_ids must hold token ids in \[0, 2\*\*31\); got \[2147483648\]"),
        ([5, -3, 9], [], [], r"prompt_ids must hold token ids in \[0, 2\*\*31\); got -3\.\.9"),
        ([1], [-1], [0.0], "completion_ids must hold token ids"),
        ([1.5], [], [], r"prompt_ids must hold token ids in \[0, 2\*\*31\); got \[1\.5\]"),
        ([1], [2], ["x"], "completion_logprobs must be float32 numbers"),
    ],
)
def test_turn_tokens_rejects_bad_values(
    prompt: list[int], completion: list[int], logprobs: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TurnTokens(tuple(prompt), tuple(completion), tuple(logprobs))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"call_id": ""}, "call_id must not be empty"),
        ({"wire_format": "grpc"}, "wire_format 'grpc' is not one of"),
        ({"call_index": -1}, "call_index must be in"),
        ({"received_at": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"auxiliary": False}, "auxiliary_reason is required for an auxiliary call and forbidden otherwise"),
        ({"auxiliary_reason": None}, "auxiliary_reason is required"),
        ({"parent_call_id": None}, "fork_reason needs a parent_call_id"),
        ({"prompt_reused_tokens": 65}, "must be within the prompt's 64 tokens"),
    ],
)
def test_call_record_validation(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_record(3, **overrides)


def test_call_record_rejects_done_before_first_token() -> None:
    rec = make_record(1)
    assert rec.first_token_at is not None
    with pytest.raises(ValueError, match="first_token_at .* is after done_at"):
        replace(rec, done_at=rec.first_token_at - timedelta(microseconds=1))


def test_unserialisable_mapping_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="sampling_applied is not JSON-serialisable"):
        to_row(make_record(1, sampling_applied={"x": object()}))


# ------------------------------------------------------------------------------------------------ schema + conversion


def test_schema_carries_its_version_and_every_contract_field() -> None:
    assert SCHEMA.metadata[SCHEMA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    assert SCHEMA.field("prompt_ids").type == pa.list_(pa.int32())
    assert SCHEMA.field("completion_logprobs").type == pa.list_(pa.float32())
    assert SCHEMA.field("received_at").type == pa.timestamp("us", tz="UTC")
    assert SCHEMA.field("request_canonical").type == pa.binary()
    assert SCHEMA.field("policy_version").type == pa.int64()
    documented = Path(__file__).resolve().parents[1].joinpath("docs", "records.md").read_text()
    for name in SCHEMA.names:
        assert f"`{name}`" in documented, f"docs/records.md does not document {name}"


def test_round_trip_of_every_field() -> None:
    originals = [make_record(i, session_id="s" + str(i % 2)) for i in range(4)]
    batch = to_batch(originals)
    assert batch.schema.equals(SCHEMA, check_metadata=True)
    row = batch.slice(2, 1).to_pylist()[0]
    assert row["tool_call_count"] == 2 and row["schema_version"] == SCHEMA_VERSION
    assert row["sampling_applied"] == '{"max_tokens":4096,"seed":2,"temperature":1.0}'
    assert row["received_at"].tzinfo is not None
    assert records_from_table(batch) == originals


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(), min_size=1, max_size=5, unique=True).flatmap(
        lambda ids: st.tuples(*[records(call_id=f"c{i}") for i in ids])
    )
)
def test_any_record_survives_arrow_and_ipc(recs: tuple[CallRecord, ...]) -> None:
    batch = to_batch(list(recs))
    reread = pa.ipc.read_record_batch(batch.serialize(), SCHEMA)
    assert records_from_table(reread) == list(recs)


def _reference_batch(recs: list[CallRecord]) -> pa.RecordBatch:
    """What to_batch built before the packed token columns: Arrow's conversion of the rows as Python values."""
    return pa.RecordBatch.from_pylist([to_row(r) for r in recs], schema=SCHEMA)


@pytest.mark.parametrize(
    "recs",
    [
        [make_record(0)],
        [make_record(i, prompt_len=50 * i + 1, completion_len=i) for i in range(5)],  # incl. an empty completion
        [make_record(0, prompt_len=0, completion_len=0)],
        [],
    ],
    ids=["one", "varied", "empty-tokens", "no-records"],
)
def test_to_batch_equals_the_pylist_conversion(recs: list[CallRecord]) -> None:
    batch = to_batch(recs)
    assert batch.equals(_reference_batch(recs), check_metadata=True)
    assert batch.num_rows == len(recs)
    for name in ("prompt_ids", "completion_ids", "completion_logprobs"):
        assert batch[name].to_pylist() == [list(getattr(r.tokens, name)) for r in recs]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=4, unique=True).flatmap(
        lambda ids: st.tuples(*[records(call_id=f"c{i}") for i in ids])
    )
)
def test_to_batch_equals_the_pylist_conversion_for_any_records(recs: tuple[CallRecord, ...]) -> None:
    assert to_batch(list(recs)).equals(_reference_batch(list(recs)), check_metadata=True)


def test_turn_tokens_arrow_arrays_hold_the_ids() -> None:
    tokens = TurnTokens([3, 2**31 - 1, 0], [7], [-0.25])  # type: ignore[arg-type]
    prompt, completion, logprobs = tokens.arrow()
    assert prompt.type == pa.int32() and prompt.to_pylist() == [3, 2**31 - 1, 0]
    assert completion.to_pylist() == [7] and logprobs.type == pa.float32() and logprobs.to_pylist() == [-0.25]
    assert tokens == TurnTokens((3, 2**31 - 1, 0), (7,), (-0.25,))  # the arrays are not part of equality
    assert replace(tokens, completion_ids=(8,)).arrow()[1].to_pylist() == [8]  # replace re-packs


def test_to_batch_refuses_a_value_that_does_not_fit_its_column() -> None:
    with pytest.raises(ValueError, match="record does not fit the schema"):
        to_batch([make_record(0, policy_version=2**63)])


def test_from_row_rejects_another_schema_version() -> None:
    row = to_row(make_record(1)) | {"schema_version": SCHEMA_VERSION + 1}
    with pytest.raises(ValueError, match=f"schema version {SCHEMA_VERSION + 1}"):
        from_row(row)


# ------------------------------------------------------------------------------------------------ readers


def _write_shard(folder: Path, index: int, recs: list[CallRecord]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_batches([to_batch(recs)])
    table = table.replace_schema_metadata({**SCHEMA.metadata, RUN_ID_KEY: recs[0].run_id.encode()})
    pq.write_table(table, folder / f"shard-{index:05d}.parquet", compression="zstd")


def test_read_records_over_many_runs_ignores_tmp_and_manifest(tmp_path: Path) -> None:
    a = [make_record(i, run_id="run-a") for i in range(3)]
    b = [make_record(i, run_id="run-b", session_id="other") for i in range(2)]
    _write_shard(tmp_path / "run-a", 0, a[:2])
    _write_shard(tmp_path / "run-a", 1, a[2:])
    _write_shard(tmp_path / "run-b", 0, b)
    (tmp_path / "run-a" / "shard-00002.parquet.tmp").write_bytes(b"half a shard")
    (tmp_path / "run-a" / "manifest.json").write_text("{}")
    table = read_records(tmp_path)
    assert table.num_rows == 5
    assert sorted(records_from_table(table), key=lambda r: r.call_id) == sorted(a + b, key=lambda r: r.call_id)
    assert read_records([tmp_path / "run-a", tmp_path / "run-b"]).num_rows == 5
    assert read_records(tmp_path / "run-b").num_rows == 2
    (tmp_path / "empty").mkdir()
    empty = read_records(tmp_path / "empty")
    assert empty.num_rows == 0 and empty.schema.names == SCHEMA.names
    with pytest.raises(FileNotFoundError):  # a mistyped folder is an error, not an empty corpus
        read_records(tmp_path / "no-such-run")


def test_read_records_through_a_pyarrow_filesystem(tmp_path: Path) -> None:
    _write_shard(tmp_path / "runs" / "r", 0, [make_record(i, run_id="r") for i in range(3)])
    fs = pafs.SubTreeFileSystem(str(tmp_path / "runs"), pafs.LocalFileSystem())
    assert shard_files("r", fs)[1] == ["r/shard-00000.parquet"]
    table = read_records("r", filesystem=fs, columns=["call_id", "policy_version"], filter=pc.field("call_index") > 0)
    assert table.column_names == ["call_id", "policy_version"]
    assert table["policy_version"].to_pylist() == [8, 9]


def test_read_records_refuses_a_shard_of_another_schema_version(tmp_path: Path) -> None:
    table = pa.Table.from_batches([to_batch([make_record(1)])]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"0"})
    pq.write_table(table, tmp_path / "shard-00000.parquet")
    with pytest.raises(ValueError, match="has schema version b'0'"):
        read_records(tmp_path)


def test_iter_sessions_groups_by_run_and_session_in_call_order(tmp_path: Path) -> None:
    recs = [make_record(i, session_id="s1") for i in (2, 0, 1)] + [make_record(5, session_id="s0")]
    recs += [make_record(0, run_id="run-0", session_id="s1")]
    table = pa.Table.from_batches([to_batch(recs[:2]), to_batch(recs[2:])])  # chunked, as read_records gives it
    sessions = list(iter_sessions(table))
    assert [(s.run_id, s.session_id, s.calls["call_index"].to_pylist()) for s in sessions] == [
        ("run-0", "s1", [0]),
        ("run-1", "s0", [5]),
        ("run-1", "s1", [0, 1, 2]),
    ]
    assert list(iter_sessions(table.slice(0, 0))) == []

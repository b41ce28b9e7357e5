"""Tests for addon.records.schema: typed records, the versioned schema, JSON blobs, and the readers."""

from __future__ import annotations

import math
from array import array
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import datasets
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records import token_ids
from addon.records.blobs import unpack_json
from addon.records.schema import (
    MALFORMED_TOOL_CALLS,
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
from addon.records.store import RecordStore, StoreConfig
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


def test_packed_prompt_ids_are_held_as_their_own_packed_copy_and_read_back_equal() -> None:
    """The generator hands the session graph's array('i'): the record keeps a packed copy (no tuple of 10^5 ints),
    which the source cannot change, and the record equals itself read back from Arrow."""
    source = array("i", [1, 2, 3, 4])
    record = replace(make_record(1, prompt_reused_tokens=0), tokens=TurnTokens(source, (5,), (-0.5,)))
    source[0] = 77
    assert isinstance(record.tokens.prompt_ids, token_ids.FrozenIds) and record.tokens.prompt_ids == (1, 2, 3, 4)
    assert records_from_table(to_batch([record])) == [record]
    assert record.tokens.arrow()[0].to_pylist() == [1, 2, 3, 4]


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


@pytest.mark.parametrize(
    ("overrides", "sampled"),
    [
        ({}, True),
        ({"error": f"{MALFORMED_TOOL_CALLS}2"}, True),  # the model's unreadable tool call went on as text
        ({"error": "client_disconnected", "incomplete": True}, False),
        ({"error": "engine_error"}, False),
        ({"incomplete": True}, False),
        ({"budget_stop": "max_calls=3", "error": "budget"}, False),
    ],
)
def test_a_call_is_sampled_when_it_ran_to_its_end_malformed_tool_calls_included(
    overrides: dict[str, Any], sampled: bool
) -> None:
    base = {"error": None, "incomplete": False, "budget_stop": None}
    assert make_record(1, **(base | overrides)).sampled is sampled


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


# ------------------------------------------------------------------------------------------------ other readers
# docs/records.md, "Reading records with datasets and duckdb", shows the code these tests run.

RUN = "20261204-101500-3f2a1c"  # a `make collect` run id (tasks/collect.py)
_NAN = float("nan")


def _write_collect_run(run_dir: Path) -> tuple[str, list[CallRecord]]:
    """A run laid out as `make collect` writes it: one store per proxy under ``records/<proxy>/``, two shards each.

    Returns the glob of its shards and the records written: four sessions of four harnesses and wire formats, one
    auxiliary call, three NaN logprobs (tokens the engine gave no logprob for) and an empty completion.
    """
    plain: dict[str, Any] = {"run_id": RUN, "auxiliary": False, "auxiliary_reason": None}
    gemini: dict[str, Any] = {
        "harness": "gemini-cli",
        "wire_format": "gemini",
        "route": "/v1beta/models/x:streamGenerateContent",
    }
    by_proxy = {
        "proxy-0": [
            *(make_record(i, session_id="s-a", prompt_len=20 + i, completion_len=3 + i, **plain) for i in range(2)),
            make_record(2, run_id=RUN, session_id="s-a", prompt_len=22, completion_len=5),  # auxiliary (a title)
            make_record(
                0,
                session_id="s-b",
                harness="codex",
                wire_format="responses",
                route="/v1/responses",
                tokens=TurnTokens((1, 2, 3), (4, 5, 6), (-0.5, _NAN, -0.25)),
                prompt_reused_tokens=0,
                **plain,
            ),
        ],
        "proxy-1": [
            make_record(
                0,
                session_id="s-c",
                tokens=TurnTokens(tuple(range(100, 140)), (7, 8, 9, 10), (_NAN, -1.0, _NAN, -0.125)),
                **gemini,
                **plain,
            ),
            make_record(1, session_id="s-c", completion_len=0, **gemini, **plain),
            make_record(0, session_id="s-d", harness="pi", wire_format="chat", route="/v1/chat/completions", **plain),
        ],
    }
    for proxy, recs in by_proxy.items():
        with RecordStore.open(run_dir / "records" / proxy, RUN, StoreConfig(shard_rows=2)) as store:
            for rec in recs:
                store.append(rec)
    return str(run_dir / "records" / "*" / "shard-*.parquet"), [r for recs in by_proxy.values() for r in recs]


def _nan_as_none(values: Any) -> list[Any]:
    """NaN compares unequal to itself; as None, two lists of logprobs compare by value."""
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


def test_a_runs_shards_load_with_hugging_face_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shards, written = _write_collect_run(tmp_path / "runs" / "collect" / RUN)
    assert len(list((tmp_path / "runs").rglob("shard-*.parquet"))) == 4
    cache = tmp_path / "hf-cache"
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # no network here; datasets reads these at import
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, name, True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)

    ds = datasets.load_dataset("parquet", data_files=shards, split="train", cache_dir=str(cache))

    assert ds.num_rows == len(written) == 7
    assert ds.column_names == SCHEMA.names
    assert ds.features == datasets.Features.from_arrow_schema(SCHEMA)  # int32 ids, float32 logprobs, UTC, binary
    rows = {row["call_id"]: row for row in ds}
    assert sorted(rows) == sorted(r.call_id for r in written)
    for rec in written:
        row, expected = rows[rec.call_id], to_batch([rec]).to_pylist()[0]
        assert row["prompt_ids"] == list(rec.tokens.prompt_ids)
        assert row["completion_ids"] == list(rec.tokens.completion_ids)
        assert _nan_as_none(row["completion_logprobs"]) == _nan_as_none(rec.tokens.completion_logprobs)
        others = [n for n in SCHEMA.names if n != "completion_logprobs"]
        assert {n: row[n] for n in others} == {n: expected[n] for n in others}
        assert unpack_json(row["request_canonical"]) == unpack_json(rec.request_canonical)  # zstd JSON, as bytes
    assert sum(math.isnan(lp) for row in ds for lp in row["completion_logprobs"]) == 3
    assert ds.filter(lambda r: not r["auxiliary"]).num_rows == 6
    assert list(cache.rglob("*.arrow")), "load_dataset keeps an Arrow copy of the shards in cache_dir"


def _duckdb_rows(query: str) -> list[tuple[Any, ...]]:
    """``duckdb.sql(query).fetchall()``: ``sql`` gives None only for a statement without rows; no ``fetchone`` in 2."""
    relation = duckdb.sql(query)
    assert relation is not None
    return relation.fetchall()


def test_a_runs_shards_query_with_duckdb(tmp_path: Path) -> None:
    shards, written = _write_collect_run(tmp_path / "runs" / "collect" / RUN)

    def expected(key: str) -> list[tuple[str, int, int]]:
        groups: dict[str, list[CallRecord]] = {}
        for rec in written:
            groups.setdefault(getattr(rec, key), []).append(rec)
        return [(k, len(g), sum(len(r.tokens.completion_ids) for r in g)) for k, g in sorted(groups.items())]

    for key in ("session_id", "wire_format", "harness"):
        got = _duckdb_rows(
            f"""
            select {key}, count(*) as calls, sum(len(completion_ids)) as completion_tokens
            from read_parquet('{shards}')
            group by {key} order by {key}
            """
        )
        assert got == expected(key), key
    per_harness = _duckdb_rows(
        f"""
        select harness, wire_format, count(*) as calls, count(distinct session_id) as sessions,
               sum(len(prompt_ids)) as prompt_tokens, sum(len(completion_ids)) as completion_tokens,
               round(avg(len(completion_ids)), 1) as mean_completion, max(len(completion_ids)) as max_completion
        from read_parquet('{shards}')
        where not auxiliary
        group by all order by all
        """
    )
    groups: dict[tuple[str, str], list[CallRecord]] = {}
    for rec in written:
        if not rec.auxiliary:
            groups.setdefault((rec.harness, rec.wire_format), []).append(rec)
    assert per_harness == [
        (
            *key,
            len(g),
            len({r.session_id for r in g}),
            sum(len(r.tokens.prompt_ids) for r in g),
            sum(len(r.tokens.completion_ids) for r in g),
            round(sum(len(r.tokens.completion_ids) for r in g) / len(g), 1),
            max(len(r.tokens.completion_ids) for r in g),
        )
        for key, g in sorted(groups.items())
    ]
    assert per_harness[0][:3] == ("claude-code", "anthropic", 2)  # the auxiliary call is left out
    files = _duckdb_rows(f"select count(distinct filename) from read_parquet('{shards}', filename = true)")
    assert files == [(4,)]  # every shard of both proxies

    missing = _duckdb_rows(
        f"""
        select call_id, len(list_filter(completion_logprobs, lambda lp: isnan(lp))) as missing_logprobs
        from read_parquet('{shards}')
        where missing_logprobs > 0
        order by call_id
        """
    )
    assert missing == [(f"{RUN}/s-b/call-0", 1), (f"{RUN}/s-c/call-0", 2)]
    [unnested] = _duckdb_rows(
        f"""
        select count(*) filter (where isnan(lp)) as missing, count(*) as sampled
        from (select unnest(completion_logprobs) as lp from read_parquet('{shards}'))
        """
    )
    assert unnested == (3, sum(len(r.tokens.completion_ids) for r in written))

    [(blob, seed)] = _duckdb_rows(
        f"""
        select request_canonical, sampling_applied ->> '$.seed' from read_parquet('{shards}')
        where call_id = '{RUN}/s-a/call-2'
        """
    )
    assert isinstance(blob, bytes) and unpack_json(blob) == {"messages": [{"role": "user", "text": "list files 2"}]}
    assert seed == "2"  # JSON text columns: ->> extracts a value as text

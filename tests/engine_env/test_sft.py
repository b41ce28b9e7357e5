"""trainer/sft.py: episodes -> samples, the loss mask TRL really applies, clear errors, and a real tiny SFT run.

Crafted collect run dirs (episodes.parquet + records/ shard) hold a two-call agent session (the second call's prompt
extends the first call's prompt + completion + a tool result) and an auxiliary call, tokenized with the default
model's real tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from addon.records.schema import CallRecord, TurnTokens, pack_json, to_batch
from tasks.episodes import EpisodeRecord, write_episodes
from trainer import sft

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def ids(tok: Any, text: str) -> tuple[int, ...]:
    return tuple(tok(text, add_special_tokens=False)["input_ids"])


def call(session: str, i: int, prompt: tuple[int, ...], completion: tuple[int, ...], **kw: Any) -> CallRecord:
    return CallRecord(
        run_id="run-t",
        session_id=session,
        call_index=i,
        call_id=f"{session}/call-{i}",
        harness="pi",
        wire_format="chat",
        route="/v1/chat/completions",
        model="m",
        received_at=T0 + timedelta(seconds=i),
        done_at=T0 + timedelta(seconds=i, milliseconds=500),
        tokens=TurnTokens(prompt, completion, tuple(-0.5 for _ in completion)),
        request_canonical=pack_json({"i": i}),
        policy_version=0,
        **kw,
    )


def session_records(tok: Any, session: str) -> list[CallRecord]:
    """Call 0 samples a tool call; call 1 extends it with the tool result and samples the answer; call 2 is
    auxiliary (a title)."""
    p0 = ids(tok, f"<|im_start|>user\nWrite hi to {session}.txt<|im_end|>\n<|im_start|>assistant\n")
    c0 = ids(tok, "bash: echo hi > a.txt<|im_end|>")
    p1 = p0 + c0 + ids(tok, "\n<|im_start|>tool\n(no output)<|im_end|>\n<|im_start|>assistant\n")
    c1 = ids(tok, "Done.<|im_end|>")
    aux_p = ids(tok, "<|im_start|>user\nTitle this chat<|im_end|>\n<|im_start|>assistant\n")
    return [
        call(session, 0, p0, c0),
        call(session, 1, p1, c1, parent_call_id=f"{session}/call-0"),
        call(session, 2, aux_p, ids(tok, "Hi file"), auxiliary=True, auxiliary_reason="title"),
    ]


def episode(session: str, passed: bool, reward: float, task: str = "hello-file") -> EpisodeRecord:
    return EpisodeRecord(
        run_id="run-t", session_id=session, task_id=task, task_version="1", harness="pi", harness_version="1",
        group_id=f"{task}/pi", task_group_id=task, sample_index=0, started_at=T0, reward=reward,
        reward_components={"verifier": reward}, verifier_passed=passed, verifier_reward=reward,
        verifier_status="ok", verifier_output_tail="", exit_status=0, timed_out=False, crashed=False,
        wall_s=1.0, harness_s=1.0, stderr_tail="",
    )  # fmt: skip


def write_run(run: Path, tok: Any, outcomes: dict[str, tuple[bool, float]]) -> Path:
    write_episodes(run / "episodes.parquet", [episode(s, p, r) for s, (p, r) in outcomes.items()])
    records = [r for s in outcomes for r in session_records(tok, s)]
    (run / "records" / "proxy-0").mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([to_batch(records)]), run / "records" / "proxy-0" / "shard-00000.parquet")
    return run


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def run_dir(tmp_path: Path, tok: Any) -> Path:
    return write_run(tmp_path / "collect", tok, {"s-pass": (True, 1.0), "s-fail": (False, 0.25)})


def test_samples_keep_only_passing_main_paths(run_dir: Path, tok: Any) -> None:
    data = sft.load_samples([run_dir], sft.EpisodeFilter())
    assert (data.episodes, data.kept_episodes, data.auxiliary_dropped) == (2, 1, 1)
    (seq,) = data.sequences
    assert seq.session_id == "s-pass" and not seq.auxiliary
    recs = session_records(tok, "s-pass")
    sampled = [i for i, m in enumerate(seq.loss_mask) if m]
    # exactly the two sampled completions carry loss: c0 right after p0, c1 at the end
    p0, c0 = recs[0].tokens.prompt_ids, recs[0].tokens.completion_ids
    p1, c1 = recs[1].tokens.prompt_ids, recs[1].tokens.completion_ids
    expected = list(range(len(p0), len(p0) + len(c0))) + list(range(len(p1), len(p1) + len(c1)))
    assert sampled == expected
    assert [seq.input_ids[i] for i in sampled] == list(c0 + c1)


def test_min_reward_and_auxiliary_options(run_dir: Path) -> None:
    both = sft.load_samples([run_dir], sft.EpisodeFilter(min_reward=0.2))
    assert {s.session_id for s in both.sequences} == {"s-pass", "s-fail"}
    with_aux = sft.load_samples([run_dir], sft.EpisodeFilter(include_auxiliary=True))
    assert sorted(s.auxiliary for s in with_aux.sequences) == [False, True]


def test_clear_error_when_nothing_passes(tmp_path: Path, tok: Any) -> None:
    run = write_run(tmp_path / "c", tok, {"s1": (False, 0.0), "s2": (False, 0.0)})
    with pytest.raises(sft.SftDataError, match=r"no episode passes the filter \(verifier passed\): 0 of 2"):
        sft.load_samples([run], sft.EpisodeFilter())
    with pytest.raises(sft.SftDataError, match="no episodes.parquet"):
        sft.load_samples([tmp_path / "missing"], sft.EpisodeFilter())
    (run / "records" / "proxy-0" / "shard-00000.parquet").unlink()
    with pytest.raises(sft.SftDataError, match="give no sample"):
        sft.load_samples([run], sft.EpisodeFilter(min_reward=0.0))


def test_trl_labels_carry_loss_on_sampled_tokens_only(run_dir: Path, tok: Any, tmp_path: Path) -> None:
    """What SFTTrainer itself prepares and collates: labels == input_ids exactly where the loss mask is 1."""
    data = sft.load_samples([run_dir], sft.EpisodeFilter(min_reward=0.0))
    tiny = LlamaForCausalLM(
        LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
    )  # fmt: skip
    config = sft.SftConfig(runs=(run_dir,), out=tmp_path / "out", max_steps=1)
    trainer = sft.build_trainer(config, tiny, tok, data.sequences)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    by_ids = {tuple(s.input_ids): s for s in data.sequences}
    assert len(by_ids) == len(data.sequences) == 2
    for row_ids, row_labels, row_attn in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        n = int(row_attn.sum())
        seq = by_ids[tuple(row_ids[:n].tolist())]
        want = [t if m else -100 for t, m in zip(seq.input_ids, seq.loss_mask, strict=True)]
        assert row_labels[:n].tolist() == want
        assert (row_labels[n:] == -100).all()


def test_metrics_rows_follow_the_shared_format() -> None:
    row = sft.metrics_row(3, 1.23456, {"loss": 2.5, "grad_norm": 0.7, "note": "x", "flag": True, "bad": float("nan")})
    assert row == {"iteration": 1, "phase": "train", "step": 3, "wall_s": 1.235, "loss": 2.5, "grad_norm": 0.7}


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="at least one collect run dir"):
        sft.SftConfig(runs=())
    with pytest.raises(ValueError, match="max_steps"):
        sft.SftConfig(runs=(Path("x"),), max_steps=0)
    cfg = sft.config_from_args(sft.build_parser().parse_args(["--runs", "a", "b", "--min-reward", "0.5"]))
    assert cfg.runs == (Path("a"), Path("b")) and cfg.filter == sft.EpisodeFilter(0.5, False)
    assert cfg.out_dir == Path("runs/sft") / cfg.run_id


@pytest.mark.integration
def test_a_real_tiny_sft_run_changes_the_weights(model_dir: Path, tmp_path: Path, tok: Any) -> None:
    run = write_run(tmp_path / "collect", tok, {"s-a": (True, 1.0), "s-b": (True, 1.0)})
    out = tmp_path / "sft"
    code = sft.main(["--runs", str(run), "--model", str(model_dir), "--out", str(out),
                     "--max-steps", "2", "--lr", "1e-3"])  # fmt: skip
    assert code == 0
    checkpoint = out / "checkpoint"
    trained = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert AutoTokenizer.from_pretrained(checkpoint)("hi")["input_ids"] == tok("hi")["input_ids"]
    base_params = dict(base.named_parameters())
    changed = [n for n, p in trained.named_parameters() if not torch.equal(p, base_params[n])]
    assert changed, "no parameter changed after two optimizer steps"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["phase"] == "train" for r in rows)
    assert json.loads((out / "config.json").read_text())["max_steps"] == 2


def test_episode_filter_skips_collector_errors() -> None:
    e = episode("s", True, 1.0)
    assert sft.EpisodeFilter().keeps(e)
    assert not sft.EpisodeFilter().keeps(replace(e, error="boom"))
    assert not sft.EpisodeFilter(min_reward=1.5).keeps(e)

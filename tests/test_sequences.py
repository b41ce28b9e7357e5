"""addon/records/sequences.py: training sequences from one session's call records, and the session report."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from addon.generation.render import PromptRenderer
from addon.generation.splice import SessionState, SpliceRenderer, assistant_message, plan, record
from addon.records.schema import CallRecord, TurnTokens
from addon.records.sequences import build_sequences, lineage, mask_reason, merge_ratio, validate_session
from converters.canonical import Completion, Message, ModelRequest, TextPart, ToolCall, ToolResultPart
from tests.record_factory import make_record

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python"


class Episode:
    """Builds records whose prompts really extend their parents' prompt + completion ids."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []
        self.rng = random.Random(7)

    def ids(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(100, 50_000) for _ in range(n))

    def call(self, name: str, parent: str | None = None, fork: str | None = None, **kw: Any) -> CallRecord:
        by_id = {r.call_id: r for r in self.records}
        prompt = kw.pop("prompt", None)
        if prompt is None and parent is not None and fork is None:
            p = by_id[parent].tokens
            prompt = p.prompt_ids + p.completion_ids + self.ids(3)  # + template glue and a tool result
        elif prompt is None:
            prompt = self.ids(12)
        n = kw.pop("completion_len", 5)
        logprobs = tuple(-self.rng.random() for _ in range(n))
        fields: dict[str, Any] = {
            "call_id": name,
            "tokens": TurnTokens(prompt, self.ids(n), logprobs),
            "auxiliary": False,
            "auxiliary_reason": None,
            "incomplete": False,
            "budget_stop": None,
            "parent_call_id": parent,
            "fork_reason": fork,
            "prompt_reused_tokens": 0,
            "policy_version": 3,
        } | kw
        rec = make_record(len(self.records), prompt_len=0, completion_len=0, **fields)
        self.records.append(rec)
        return rec


def forked_episode() -> Episode:
    ep = Episode()
    ep.call("c0")
    ep.call("c1", parent="c0")
    c2 = ep.call("c2", parent="c1")
    ep.call("c2b", parent="c1", prompt=c2.tokens.prompt_ids)  # a retry of c2: a sibling
    ep.call("c3", parent="c2b")
    ep.call("aux", parent="c3", fork="auxiliary", auxiliary=True, auxiliary_reason="structured_output")
    ep.call("c4", parent="c3", fork="history_rewritten")  # compaction: a new root linked to what it replaces
    ep.call("c5", parent="c4")
    return ep


def test_forked_episode_gives_one_sequence_per_leaf_with_each_call_trained_once() -> None:
    ep = forked_episode()
    seqs = build_sequences(ep.records)
    assert [s.call_ids for s in seqs] == [
        ("c0", "c1", "c2"),
        ("c0", "c1", "c2b", "c3"),
        ("aux",),
        ("c4", "c5"),
    ]
    assert [s.trained_call_ids for s in seqs] == [("c0", "c1", "c2"), ("c2b", "c3"), ("aux",), ("c4", "c5")]
    assert [s.auxiliary for s in seqs] == [False, False, True, False]
    by_id = {r.call_id: r for r in ep.records}
    for seq in seqs:
        leaf = by_id[seq.call_ids[-1]].tokens
        assert seq.input_ids == leaf.prompt_ids + leaf.completion_ids
        expected_mask = [0] * len(seq.input_ids)
        expected_lp = [0.0] * len(seq.input_ids)
        for cid in seq.trained_call_ids:
            t = by_id[cid].tokens
            start = len(t.prompt_ids)
            # The loss sits exactly on what this call sampled, and its logprobs line up with those ids.
            assert seq.input_ids[start : start + len(t.completion_ids)] == t.completion_ids
            expected_mask[start : start + len(t.completion_ids)] = [1] * len(t.completion_ids)
            expected_lp[start : start + len(t.completion_ids)] = t.completion_logprobs
        assert seq.loss_mask == tuple(expected_mask)
        assert seq.behaviour_logprobs == tuple(expected_lp)
    trained = [c for s in seqs for c in s.trained_call_ids]
    assert sorted(trained) == sorted(r.call_id for r in ep.records)  # every sampled call exactly once
    assert sum(sum(s.loss_mask) for s in seqs) == sum(len(r.tokens.completion_ids) for r in ep.records)
    records_tokens = sum(len(r.tokens.prompt_ids) + len(r.tokens.completion_ids) for r in ep.records)
    assert merge_ratio(ep.records, seqs) == records_tokens / sum(len(s.input_ids) for s in seqs)


def test_misaligned_logprobs_are_masked_and_counted() -> None:
    ep = Episode()
    ep.call("c0")
    ep.call("c1", parent="c0")
    ep.call("c2", parent="c1")
    bad = ep.records[1]
    # A writer bug: one logprob fewer than ids (TurnTokens refuses that, so build it behind its back).
    object.__setattr__(bad.tokens, "completion_logprobs", bad.tokens.completion_logprobs[:-1])
    positive = ep.records[2].tokens
    object.__setattr__(positive, "completion_logprobs", (0.5,) + positive.completion_logprobs[1:])
    assert mask_reason(bad) == mask_reason(ep.records[2]) == "misaligned_logprobs"
    (seq,) = build_sequences(ep.records)
    assert seq.trained_call_ids == ("c0",)
    assert sum(seq.loss_mask) == len(ep.records[0].tokens.completion_ids)
    report = validate_session(ep.records)
    assert report.masked == (("misaligned_logprobs", 2),) and report.grade == "bad"


def test_a_missing_logprob_masks_that_token_only_and_is_counted() -> None:
    ep = Episode()
    ep.call("c0")
    ep.call("c1", parent="c0")
    t = ep.records[1].tokens
    nan = float("nan")
    # what addon.engine.client makes of vLLM's `null` logprob; TurnTokens keeps it as NaN
    missing = (t.completion_logprobs[0], nan) + t.completion_logprobs[2:]
    ep.records[1] = dataclasses.replace(ep.records[1], tokens=TurnTokens(t.prompt_ids, t.completion_ids, missing))
    assert mask_reason(ep.records[1]) is None  # the call is trained, minus the one token
    (seq,) = build_sequences(ep.records)
    assert seq.trained_call_ids == ("c0", "c1")
    start = len(t.prompt_ids)
    assert seq.loss_mask[start : start + 3] == (1, 0, 1)
    assert seq.behaviour_logprobs[start + 1] == 0.0 and all(x == x for x in seq.behaviour_logprobs)
    assert sum(seq.loss_mask) == len(ep.records[0].tokens.completion_ids) + len(t.completion_ids) - 1
    report = validate_session(ep.records)
    assert report.missing_logprobs == 1 and report.grade == "warn"
    assert any("without a logprob" in p for p in report.problems)


def test_a_parent_link_that_is_not_a_token_prefix_splits_the_path() -> None:
    ep = Episode()
    ep.call("c0")
    ep.call("c1", parent="c0")
    liar = ep.call("c2", parent="c1")
    object.__setattr__(liar.tokens, "prompt_ids", (1,) + liar.tokens.prompt_ids[1:])
    graph = lineage(ep.records)
    assert [(b.call_id, b.parent_call_id, b.why) for b in graph.broken] == [("c2", "c1", "not_a_prefix")]
    assert [s.call_ids for s in build_sequences(ep.records)] == [("c0", "c1"), ("c2",)]
    report = validate_session(ep.records)
    assert report.grade == "bad" and "does not extend" in report.problems[0]


def test_report_of_a_forked_episode() -> None:
    ep = forked_episode()
    report = validate_session(ep.records)
    assert (report.calls, report.auxiliary_calls, report.sequences) == (8, 1, 4)
    assert report.forks == (("history_rewritten", 1),)
    assert report.fork_ratio == pytest.approx(1 / 6)
    assert report.grade == "ok" and report.problems == () and not report.single_call


def test_report_flags_single_calls_policy_changes_and_many_forks() -> None:
    ep = Episode()
    ep.call("c0", policy_version=1)
    assert validate_session(ep.records).single_call
    assert validate_session(ep.records).grade == "warn"
    ep.call("c1", parent="c0", policy_version=2)
    ep.call("c2", parent="c1", fork="history_rewritten", policy_version=2)
    report = validate_session(ep.records)
    assert report.policy_version_changes == 1 and report.fork_ratio == 0.5
    assert report.grade == "warn" and len(report.problems) == 2


def test_incomplete_call_is_not_trained() -> None:
    ep = Episode()
    ep.call("c0", incomplete=True)
    (seq,) = build_sequences(ep.records)
    assert seq.trained_call_ids == () and sum(seq.loss_mask) == 0
    assert validate_session(ep.records).masked == (("incomplete", 1),)


def test_records_of_two_sessions_are_refused() -> None:
    ep = forked_episode()
    other = make_record(99, session_id="other", auxiliary=False, auxiliary_reason=None)
    with pytest.raises(ValueError, match="records of one session"):
        build_sequences(ep.records + [other])


def test_spliced_tool_loop_merges_into_one_sequence(smollm2_tokenizer_dir: Path) -> None:
    """Real splice plans -> records -> one sequence whose loss covers every sampled id (20 calls)."""
    sp = SpliceRenderer(PromptRenderer.from_pretrained(smollm2_tokenizer_dir))
    state, records = SessionState("s"), []
    history: list[Message] = [Message("system", (TextPart("Be brief."),)), Message("user", (TextPart("go"),))]
    for i in range(20):
        req = ModelRequest("chat", "m", tuple(history))
        p = plan(state, req, sp)
        comp = Completion(f"r{i}", "m", text=f"step {i}", tool_calls=(ToolCall(f"k{i}", "run", json.dumps({"i": i})),))
        ids = sp.renderer.encode(f"step {i}") + (sp.eot_id or 0,)
        record(state, f"c{i}", req, p, comp, ids, "tool_calls")
        tokens = TurnTokens(p.prompt_ids, ids, (-0.5,) * len(ids))
        records.append(
            make_record(
                i,
                call_id=f"c{i}",
                session_id="s",
                tokens=tokens,
                auxiliary=False,
                auxiliary_reason=None,
                parent_call_id=p.parent_call_id,
                fork_reason=p.fork_reason,
                prompt_reused_tokens=p.reused_tokens,
                incomplete=False,
                policy_version=1,
            )
        )
        result = Message("tool", (ToolResultPart(f"k{i}", (TextPart(f"out {i} " * 20),)),))
        history += [assistant_message(comp), result]
    (seq,) = build_sequences(records)
    assert seq.trained_call_ids == tuple(f"c{i}" for i in range(20))
    assert sum(seq.loss_mask) == sum(len(r.tokens.completion_ids) for r in records)
    assert merge_ratio(records, build_sequences(records)) > 5
    assert validate_session(records).problems == ()


def test_module_imports_in_the_engine_env_without_transformers() -> None:
    code = (
        "import sys, addon.records.sequences; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'jinja2')))"
    )
    out = subprocess.run([str(ENGINE_PYTHON), "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

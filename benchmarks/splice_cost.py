"""Benchmark of token-faithful prompts: the proxy-side cost of one call's prompt, spliced vs fully re-rendered, as a
session grows to 128k tokens of context; and the merge ratio of 20-call episodes.

A synthetic coding session (a ~2k-token system prompt with six tools, then turns of assistant text + one tool call
and a tool result of 150-1500 tokens of code-like text) is played through :func:`addon.generation.splice.plan` /
:func:`addon.generation.splice.record` with the real SmolLM2 tokenizer. The model context does not matter here: only the
tokenizer's length limit is raised. For each call both costs are timed:

* splice: ``plan()`` (canonical prefix match, suffix render + string checks, tokenising the suffix, building the
  prompt id tuple) + ``record()``;
* full: ``PromptRenderer.render()`` of the whole request (today's per-call cost).

    .venvs/proxy/bin/python benchmarks/splice_cost.py [--model-dir DIR] [--max-tokens N] [--sessions 3] [--lines 15 150]

Printed, for calls whose prompt is within 25% below 8k, 32k and 128k tokens: p50 / p90 in ms of both costs, the
part of the splice that tokenises the new suffix, and the rest; then the merge ratio (token ids in per-call rows /
token ids in merged sequences) of ``--episodes`` 20-call episodes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from addon.generation.render import PromptRenderer  # noqa: E402
from addon.generation.splice import SessionState, SpliceRenderer, assistant_message, plan, record  # noqa: E402
from addon.records.schema import CallRecord, TurnTokens, pack_json  # noqa: E402
from addon.records.sequences import build_sequences, merge_ratio  # noqa: E402
from converters.canonical import (  # noqa: E402
    Completion,
    Message,
    ModelRequest,
    TextPart,
    ToolCall,
    ToolResultPart,
    ToolSpec,
)

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / ".cache" / "models" / "SmolLM2-135M-Instruct-fp32"
SIZES = (8192, 32768, 131072)
TOOLS = tuple(
    ToolSpec(name, f"{name} a file or a command.", {"type": "object", "properties": {"arg": {"type": "string"}}})
    for name in ("read_file", "write_file", "edit_file", "bash", "grep", "glob")
)
WORDS = "def return self import class for in if else None True value index result path open read write".split()


def code_text(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        indent = "    " * rng.randrange(3)
        out.append(f"{indent}{' '.join(rng.choice(WORDS) for _ in range(rng.randrange(3, 9)))}  # {i}")
    return "\n".join(out)


def turn(rng: random.Random, i: int, lines: tuple[int, int]) -> tuple[Completion, Message]:
    call = ToolCall(f"call_{i}", rng.choice(TOOLS).name, json.dumps({"arg": f"src/module_{i}.py"}))
    comp = Completion(f"r{i}", "m", text=f"Step {i}: let me look at module {i}.", tool_calls=(call,))
    result = Message("tool", (ToolResultPart(call.id, (TextPart(code_text(rng, rng.randrange(*lines))),)),))
    return comp, result


def best_of(n: int, fn: Callable[[], object]) -> float:
    """The least of ``n`` timings of ``fn`` (the machine is shared; the minimum is the cost, the rest is noise)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def sampled_ids(splicer: SpliceRenderer, comp: Completion) -> tuple[int, ...]:
    content = splicer.convert(assistant_message(comp), {})[0]["content"]
    return splicer.renderer.encode(content) + (splicer.eot_id or 0,)


Row = tuple[int, float, float, float, int]


def grow_session(splicer: SpliceRenderer, args: argparse.Namespace, seed: int) -> tuple[list[Row], int]:
    """(prompt length, splice s, full render s, suffix tokenisation s, suffix tokens) for up to ``args.per_size``
    calls near each of :data:`SIZES`, until the prompt passes ``args.max_tokens``; and the number of calls."""
    rng = random.Random(seed)
    history = [Message("system", (TextPart(code_text(rng, 160)),)), Message("user", (TextPart("Fix the tests."),))]
    state, out, i = SessionState("bench"), [], 0
    timed = dict.fromkeys(SIZES, 0)
    while True:
        req = ModelRequest("chat", "m", tuple(history), tools=TOOLS)
        comp, result = turn(rng, i, args.lines)
        p = plan(state, req, splicer)
        if i and p.reason != "extends":
            raise SystemExit(f"call {i} did not splice: {p.reason}")
        size = next((s for s in SIZES if 0.75 * s <= len(p.prompt_ids) <= s), None)
        if size is not None and timed[size] < args.per_size:  # a full render is slow: time only a few calls
            timed[size] += 1
            splice = best_of(3, partial(plan, state, req, splicer))
            t0 = time.perf_counter()
            full = splicer.renderer.render(req)
            full_s = time.perf_counter() - t0
            if full.prompt_ids != p.prompt_ids:
                raise SystemExit(f"call {i}: spliced ids differ from a fresh render")
            encode = best_of(3, partial(splicer.renderer.encode, p.suffix_text))
            out.append((len(p.prompt_ids), splice, full_s, encode, len(p.prompt_ids) - p.reused_tokens))
        record(state, f"c{i}", req, p, comp, sampled_ids(splicer, comp), "tool_calls")
        if len(p.prompt_ids) > args.max_tokens:
            return out, i + 1
        history += [assistant_message(comp), result]
        i += 1


def episode_records(splicer: SpliceRenderer, seed: int, calls: int = 20) -> list[CallRecord]:
    rng = random.Random(seed)
    history = [Message("system", (TextPart(code_text(rng, 160)),)), Message("user", (TextPart("Fix the tests."),))]
    state, records = SessionState(f"e{seed}"), []
    now = datetime.now(UTC)
    for i in range(calls):
        req = ModelRequest("chat", "m", tuple(history), tools=TOOLS)
        comp, result = turn(rng, i, (15, 150))
        ids = sampled_ids(splicer, comp)
        p = plan(state, req, splicer)
        record(state, f"c{i}", req, p, comp, ids, "tool_calls")
        tokens = TurnTokens(p.prompt_ids, ids, tuple(-0.1 for _ in ids))
        records.append(
            CallRecord(
                run_id="bench",
                session_id=state.session_id,
                call_index=i,
                call_id=f"c{i}",
                harness="bench",
                wire_format="chat",
                route="/v1/chat/completions",
                model="m",
                received_at=now,
                done_at=now,
                tokens=tokens,
                request_canonical=pack_json({}),
                parent_call_id=p.parent_call_id,
                fork_reason=p.fork_reason,
                prompt_reused_tokens=p.reused_tokens,
            )
        )
        history += [assistant_message(comp), result]
    return records


def ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=os.environ.get("HARNESSRL_MODEL_DIR", str(DEFAULT_MODEL)))
    parser.add_argument("--max-tokens", type=int, default=SIZES[-1])
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--per-size", type=int, default=10, help="calls timed near each size, per session")
    parser.add_argument("--lines", type=int, nargs=2, default=(15, 150), help="tool result size range, in lines")
    args = parser.parse_args()
    renderer = PromptRenderer.from_pretrained(args.model_dir)
    renderer.tokenizer.model_max_length = 10**9  # the proxy-side cost does not depend on the model's context
    splicer = SpliceRenderer(renderer)
    rows: list[Row] = []
    for seed in range(args.sessions):
        got, calls = grow_session(splicer, args, seed=seed)
        rows += got
        print(f"session {seed}: {calls} calls to {args.max_tokens}+ tokens; spliced ids == a fresh render where timed")
    print("context  calls |  splice p50     p90 | tokenising the suffix p50 (tokens) |  rest p50 |  full p50     p90")
    for size in (s for s in SIZES if s <= args.max_tokens):
        window = [r for r in rows if 0.75 * size <= r[0] <= size]
        splice, full, enc = [r[1] for r in window], [r[2] for r in window], [r[3] for r in window]
        rest = [r[1] - r[3] for r in window]
        tokens = statistics.median(r[4] for r in window)
        print(
            f"{size:>7} {len(window):>6} | {ms(splice, 0.5)} {ms(splice, 0.9)} | {ms(enc, 0.5)} ({tokens:5.0f})"
            f"               | {ms(rest, 0.5)} | {ms(full, 0.5)} {ms(full, 0.9)}"
        )
    ratios = []
    for seed in range(args.episodes):
        records = episode_records(splicer, seed + 100)
        sequences = build_sequences(records)
        assert len(sequences) == 1, "a clean tool loop is one sequence"
        ratios.append(merge_ratio(records, sequences))
    print(
        f"merge ratio, {args.episodes} episodes of 20 calls: median {statistics.median(ratios):.2f}x "
        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
    )


if __name__ == "__main__":
    main()

"""Where a call's proxy time goes: each in-process stage of one model call timed on real components, at several
context sizes, in the steady state of a tool loop (each call extends the previous one).

Stages, in the order the addon runs them (addon/generate.py): ``parse`` (body bytes -> canonical request, the
format's converter), ``splice`` (the prefix-graph match and the suffix render + tokenise, addon/splice.py),
``record_build`` (the row: canonical request to JSON + zstd, addon/generate.py ``build_record``), ``append``
(Arrow batch + WAL frame + fsync, addon/record_store.py), and ``graph_record`` (adding the call's node). What is
not here — mitmproxy's TLS and HTTP relay, the loopback hop to the internal server, event-loop scheduling — is the
rest of the measured added latency (benchmarks/side_by_side.py).

Usage: ``python benchmarks/stage_costs.py --model-dir D [--contexts 8000 32000 128000] [--calls 6]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon.generate import CallInfo, _Turn, build_record  # noqa: E402
from addon.record_store import RecordStore  # noqa: E402
from addon.render import PromptRenderer  # noqa: E402
from addon.splice import SessionState, SpliceRenderer  # noqa: E402
from addon.splice import plan as splice_plan  # noqa: E402
from addon.splice import record as splice_record  # noqa: E402
from benchmarks import tree  # noqa: E402
from benchmarks.sessions import FORMATS, Conversation, Reply, ToolCallSeen, context_script  # noqa: E402
from benchmarks.side_by_side import CHARS_PER_TOKEN  # noqa: E402
from converters import dialect_for  # noqa: E402
from converters.base import Route  # noqa: E402
from converters.canonical import Completion, ToolCall, Usage  # noqa: E402

ROUTES = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini": Route("gemini", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini-2.5-pro", True, True),
}


def measure(renderer: PromptRenderer, splicer: SpliceRenderer, store: RecordStore, tokens: int, calls: int):
    """Stage -> list of seconds over the steady-state calls (call >= 1) of one session per format."""
    times: dict[str, list[float]] = defaultdict(list)
    prompt_lens: list[int] = []
    eot = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for fmt in FORMATS:
        conv = Conversation(context_script(9, tokens, fmt, int(tokens * CHARS_PER_TOKEN), calls))
        state = SessionState(f"stage-{fmt}-{tokens}")
        for i in range(calls):
            body = conv.wire().body
            t = [time.perf_counter()]
            request = dialect_for(fmt).parse_request(body, ROUTES[fmt], {})
            t.append(time.perf_counter())
            plan = splice_plan(state, request, splicer)
            t.append(time.perf_counter())
            reply = Reply("Reading it.", (ToolCallSeen(f"call_{fmt}_{i}", "read_file", '{"path": "a.py"}'),), True)
            text = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
            ids = tuple(renderer.tokenizer.encode("Reading it.\n" + text, add_special_tokens=False)) + (eot,)
            completion = Completion(
                "x",
                request.model,
                "Reading it.",
                tool_calls=(ToolCall(reply.tool_calls[0].id, "read_file", '{"path": "a.py"}'),),
                finish_reason="tool_calls",
                usage=Usage(len(plan.prompt_ids), len(ids)),
            )
            info = CallInfo(
                "stage", state.session_id, ROUTES[fmt], {}, datetime.now(UTC), call_id=f"{fmt}-{tokens}-{i}"
            )
            turn = _Turn(
                request, info, i, prompt_ids=plan.prompt_ids, completion_ids=list(ids), logprobs=[-0.5] * len(ids)
            )
            turn.plan = plan
            t.append(time.perf_counter())
            splice_record(state, info.call_id, request, plan, completion, ids, "tool_calls")
            t.append(time.perf_counter())
            row = build_record(turn, completion, "fake", None)
            t.append(time.perf_counter())
            store.append(row)
            t.append(time.perf_counter())
            if i >= 1:
                for name, a, b in (
                    ("parse", 0, 1),
                    ("splice", 1, 2),
                    ("graph_record", 3, 4),
                    ("record_build", 4, 5),
                    ("append", 5, 6),
                ):
                    times[name].append(t[b] - t[a])
                prompt_lens.append(len(plan.prompt_ids))
                assert plan.reason == "extends", plan.reason
            conv.extend(reply, i)
    return times, prompt_lens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8_000, 32_000, 128_000])
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args(argv)
    renderer = PromptRenderer.from_pretrained(args.model_dir)
    splicer = SpliceRenderer(renderer)
    cmd = "python benchmarks/stage_costs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# Stage costs of a steady-state call\n\nMachine: {tree.machine_facts().markdown()}. Load {tree.loadavg()}.")
    print(f"\nCommand: `{cmd}`\n")
    print("| context | prompt tokens p50 | parse ms | splice ms | graph ms | record build ms | append ms | total ms |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        store = RecordStore.open(Path(tmp), "stage")
        try:
            for tokens in args.contexts:
                times, lens = measure(renderer, splicer, store, tokens, args.calls)
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                print(
                    f"| {tokens} | {int(statistics.median(lens))} | {med['parse']:.1f} | {med['splice']:.1f} | "
                    f"{med['graph_record']:.1f} | {med['record_build']:.1f} | {med['append']:.1f} | "
                    f"{sum(med.values()):.1f} |",
                    flush=True,
                )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a call's proxy time goes: each in-process stage of one model call timed on real components, at several
context sizes, in the steady state of a tool loop (each call extends the previous one).

Stages, in the order the addon runs them (addon/generation/generate.py): ``parse`` (body bytes -> canonical request, the
format's converter; given the session's previous request where the tree has ``converters/delta.py``, as the
Generator does), ``splice`` (the prefix-graph match and the suffix render + tokenise, addon/generation/splice.py),
``engine_json`` (the engine request: the prompt ids as its JSON list, formatted from the session's previous prompt
where the tree has ``token_ids.json_list_extending`` or ``JsonIds``, else the whole list; then the
``GenerationRequest`` and its body), ``record_ahead`` (the row's first half, addon/generation/recording.py
``prelude``, built while the engine samples; 0 in older trees), ``graph_record``
(adding the call's node), ``record_build`` (the rest of the row: ``build_record``, the whole row in older trees), and
``append`` (the WAL frame + fsync, addon/records/store.py: a msgpack frame, addon/records/frames.py, holding only the
ids after its parent's where the tree has delta frames, and only the request blob's bytes after its parent's where
it has request deltas, or a one-row Arrow batch in older trees). ``wal_fsync`` is
the durable part of ``append`` alone: the same frame written and fsynced to a WAL segment in the same folder.
``total`` is the CPU time of all stages; ``after the engine`` is what lies between the engine's last token and the
client's (graph + record build + append). What is not here — mitmproxy's TLS and HTTP relay, the loopback hop to
the internal server, event-loop scheduling — is the rest of the measured added latency (benchmarks/side_by_side.py).

The record build is timed as the Generator runs it: one :class:`~addon.records.blobs.CanonicalJson` shared by the
whole run when the tree's ``build_record`` takes one (older trees encode the whole request every call), given the
call's session where the tree's ``prelude`` takes it (it then compares the request with the session's previous one).

Usage::

    python benchmarks/stage_costs.py --model-dir D [--contexts 8000 32000 128000] [--calls 6]
    git worktree add /tmp/base HEAD   # e.g. the last commit, to compare the working tree against
    python benchmarks/stage_costs.py --model-dir D --compare before=/tmp/base after=.   # before vs this checkout

``--compare LABEL=TREE ...`` runs each context once per tree, each in a fresh process (``--tree T --json``), tree
after tree within a context, ``--repeat`` rounds, and prints one table with a row per tree per context (medians
over the rounds), so all trees see about the same machine load.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("parse", "splice", "engine_json", "record_ahead", "graph_record", "record_build", "append", "wal_fsync")
# the stages between the engine's last token and the client's (the durable row comes first)
AFTER_ENGINE = ("graph_record", "record_build", "append")
MODULES = {
    "generate": "addon.generation.generate",
    "record_store": "addon.records.store",
    "records": "addon.records.schema",
    "wal": "addon.records.wal",
    "render": "addon.generation.render",
    "splice": "addon.generation.splice",
    "tree": "benchmarks.tree",
    "sessions": "benchmarks.sessions",
    "side_by_side": "benchmarks.side_by_side",
    "converters": "converters",
    "token_ids": "addon.records.token_ids",
    "protocol": "addon.engine.protocol",
    "base": "converters.base",
    "canonical": "converters.canonical",
}


def load(tree: Path) -> SimpleNamespace:
    """The modules of the source tree ``tree`` (put first on sys.path: one tree per process)."""
    sys.path.insert(0, str(tree))
    mods = {name: importlib.import_module(mod) for name, mod in MODULES.items()}
    for name, mod in mods.items():
        if not Path(mod.__file__ or "").resolve().is_relative_to(tree.resolve()):
            raise RuntimeError(f"{MODULES[name]} was imported from {mod.__file__}, not from {tree}")
    # trees before the row was built in two halves have no recording module: their whole row is built after
    has_recording = (tree / "addon" / "generation" / "recording.py").is_file()
    mods["recording"] = importlib.import_module("addon.generation.recording") if has_recording else None
    # trees that parse a session's request against its previous one (only the new conversation items)
    mods["delta"] = (
        importlib.import_module("converters.delta") if (tree / "converters" / "delta.py").is_file() else None
    )
    # trees whose WAL frames are not Arrow batches (addon.records.frames: the conversion is done a shard at a time)
    has_frames = (tree / "addon" / "records" / "frames.py").is_file()
    mods["frames"] = importlib.import_module("addon.records.frames") if has_frames else None
    has_blob_frames = (tree / "addon" / "records" / "blob_frames.py").is_file()
    mods["blob_frames"] = importlib.import_module("addon.records.blob_frames") if has_blob_frames else None
    return SimpleNamespace(**mods)


def routes(m: SimpleNamespace) -> dict[str, Any]:
    Route = m.base.Route
    return {
        "chat": Route("chat", "/v1/chat/completions"),
        "responses": Route("responses", "/v1/responses"),
        "anthropic": Route("anthropic", "/v1/messages"),
        "gemini": Route("gemini", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini-2.5-pro", True, True),
    }


def measure(m: SimpleNamespace, renderer: Any, splicer: Any, store: Any, tokens: int, calls: int, json_cache: Any):
    """Stage -> list of seconds over the steady-state calls (call >= 1) of one session per format."""
    times: dict[str, list[float]] = defaultdict(list)
    prompt_lens: list[int] = []
    eot = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    s, canonical, route_of = m.sessions, m.canonical, routes(m)
    engine_prompt: dict[str, Any] = {}
    extra = {"canonical_json": json_cache} if json_cache is not None else {}
    # trees whose prelude compares a request with its session's previous one take the session id
    takes_session = m.recording is not None and "session" in inspect.signature(m.recording.prelude).parameters
    # trees that pack a session's request blob as zstd frames, reusing the previous call's (addon.records.blob_frames)
    framed = m.blob_frames is not None and "frames" in inspect.signature(m.recording.prelude).parameters
    probe = m.wal.SegmentWriter(store.folder / f"probe-{tokens}.log", m.records.SCHEMA_VERSION)
    try:
        for fmt in s.FORMATS:
            conv = s.Conversation(s.context_script(9, tokens, fmt, int(tokens * m.side_by_side.CHARS_PER_TOKEN), calls))
            state = m.splice.SessionState(f"stage-{fmt}-{tokens}")
            request_frames = m.blob_frames.RequestFrames() if m.blob_frames is not None else None
            memo, parent_blob = None, b""
            for i in range(calls):
                body = conv.wire().body
                t = [time.perf_counter()]
                reuse = m.delta.ListReuse(memo) if m.delta is not None else None
                by_reuse = {"reuse": reuse} if reuse is not None else {}
                request = m.converters.dialect_for(fmt).parse_request(body, route_of[fmt], {}, **by_reuse)
                memo = reuse.memo() if reuse is not None else None
                t.append(time.perf_counter())
                plan = m.splice.plan(state, request, splicer)
                t.append(time.perf_counter())
                packed = m.token_ids.pack(plan.packed if plan.packed is not None else plan.prompt_ids)
                t_json = time.perf_counter()
                prompt_json: Any = None
                if hasattr(m.token_ids, "JsonIds"):  # the ids and their list made together
                    prompt_json = engine_prompt[fmt] = m.token_ids.JsonIds.extending(packed, engine_prompt.get(fmt))
                elif hasattr(m.token_ids, "json_list_extending"):  # formatted from the session's previous prompt
                    prompt_json = m.token_ids.json_list_extending(packed, engine_prompt.get(fmt))
                    engine_prompt[fmt] = (packed, prompt_json)
                gen = m.protocol.GenerationRequest(packed, 64, prompt_json=prompt_json)  # checks the list's ids
                m.protocol.completion_body(gen, stream=True)  # older trees format the whole list here
                times_json = time.perf_counter() - t_json
                reply = s.Reply(
                    "Reading it.", (s.ToolCallSeen(f"call_{fmt}_{i}", "read_file", '{"path": "a.py"}'),), True
                )
                text = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'
                ids = tuple(renderer.tokenizer.encode("Reading it.\n" + text, add_special_tokens=False)) + (eot,)
                completion = canonical.Completion(
                    "x",
                    request.model,
                    "Reading it.",
                    tool_calls=(canonical.ToolCall(reply.tool_calls[0].id, "read_file", '{"path": "a.py"}'),),
                    finish_reason="tool_calls",
                    usage=canonical.Usage(len(plan.prompt_ids), len(ids)),
                )
                info = m.generate.CallInfo(
                    "stage", state.session_id, route_of[fmt], {}, datetime.now(UTC), call_id=f"{fmt}-{tokens}-{i}"
                )
                turn = m.generate._Turn(
                    request, info, i, prompt_ids=plan.prompt_ids, completion_ids=list(ids), logprobs=[-0.5] * len(ids)
                )
                turn.plan = plan
                ahead, t_ahead = {}, 0.0
                if m.recording is not None:  # the row's first half, built while the engine samples
                    t0 = time.perf_counter()
                    by_session = {"session": state.session_id} if takes_session else {}
                    if framed:
                        by_session["frames"] = request_frames
                    ahead = {"prepared": m.recording.prelude(request, turn.prompt_ids, json_cache, **by_session)}
                    t_ahead = time.perf_counter() - t0
                t.append(time.perf_counter())
                m.splice.record(state, info.call_id, request, plan, completion, ids, "tool_calls")
                t.append(time.perf_counter())
                row = m.generate.build_record(turn, completion, "fake", None, **extra, **ahead)
                t.append(time.perf_counter())
                store.append(row)
                t.append(time.perf_counter())
                if m.frames is not None:  # the tree's own WAL frame, for the write + fsync probe below
                    base = None  # trees with delta frames write a call that extends its parent as one
                    if hasattr(m.frames, "PromptBase") and row.parent_call_id and row.prompt_reused_tokens:
                        shared = ()  # trees with request deltas: the blob's bytes after its parent's, as the store
                        if hasattr(m.frames, "request_base"):
                            shared = (m.frames.request_base(parent_blob, row.request_canonical),)
                        base = m.frames.PromptBase(row.parent_call_id, row.prompt_reused_tokens, *shared)
                    frame = m.frames.encode(m.records.row_parts(row), *([base] if base else []))
                    parent_blob = row.request_canonical
                else:
                    frame = m.records.to_batch([row]).serialize().to_pybytes()
                t.append(time.perf_counter())
                probe.append(frame)
                t.append(time.perf_counter())
                if i >= 1:
                    times["engine_json"].append(times_json)
                    times["record_ahead"].append(t_ahead)
                    spans = (("parse", 0, 1), ("splice", 1, 2), ("graph_record", 3, 4), ("record_build", 4, 5))
                    for name, a, b in (*spans, ("append", 5, 6), ("wal_fsync", 7, 8)):
                        times[name].append(t[b] - t[a])
                    prompt_lens.append(len(plan.prompt_ids))
                    if plan.reason != "extends":
                        raise RuntimeError(f"{fmt} call {i} did not extend its parent: {plan.reason}")
                conv.extend(reply, i)
    finally:
        probe.close()
    return times, prompt_lens


def run_tree(tree: Path, model_dir: str, contexts: list[int], calls: int) -> list[dict[str, Any]]:
    """Measure every context with the modules of ``tree``; one dict of median milliseconds per context."""
    m = load(tree)
    renderer = m.render.PromptRenderer.from_pretrained(model_dir)
    splicer = m.splice.SpliceRenderer(renderer)
    takes_cache = "canonical_json" in inspect.signature(m.generate.build_record).parameters
    json_cache = importlib.import_module("addon.records.blobs").CanonicalJson() if takes_cache else None
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        store = m.record_store.RecordStore.open(Path(tmp), "stage")
        try:
            for tokens in contexts:
                times, lens = measure(m, renderer, splicer, store, tokens, calls, json_cache)
                med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                total = sum(v for k, v in med.items() if k != "wal_fsync")  # wal_fsync is inside append
                after = sum(med[k] for k in AFTER_ENGINE)
                row = {"context": tokens, "prompt_tokens": int(statistics.median(lens)), **med, "total": total}
                out.append(row | {"after_engine": after})
        finally:
            store.close()
    return out


HEADER = (
    "| context | tree | prompt tokens p50 | parse ms | splice ms | engine JSON ms | record ahead ms | graph ms "
    "| record build ms | append ms | of which WAL write+fsync ms | total ms | after the engine ms |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(label: str, r: dict[str, Any]) -> str:
    cells = [f"{r[k]:.2f}" for k in STAGES]
    totals = f" | {r['total']:.1f} | {r['after_engine']:.1f} |"
    return f"| {r['context']} | {label} | {r['prompt_tokens']} | " + " | ".join(cells) + totals


def compare(trees: list[tuple[str, Path]], model_dir: str, contexts: list[int], calls: int, repeat: int) -> None:
    """Fresh processes of each tree, tree after tree within each context, ``repeat`` rounds; prints the median of
    each figure over the rounds (a shared machine's load drifts; rounds spread the trees over the same drift)."""
    runs: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for _ in range(repeat):
        for tokens in contexts:
            for label, tree in trees:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--model-dir", model_dir, "--calls", str(calls)]
                cmd += ["--contexts", str(tokens), "--tree", str(tree), "--json"]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{label} ({tree}) failed at {tokens} tokens:\n{done.stderr[-3000:]}")
                runs[(tokens, label)].extend(json.loads(done.stdout))
    for tokens in contexts:
        for label, _ in trees:
            results = runs[(tokens, label)]
            keys = (*STAGES, "total", "after_engine", "prompt_tokens")
            med = {k: statistics.median(r[k] for r in results) for k in keys}
            print(table_row(label, {"context": tokens, **med, "prompt_tokens": int(med["prompt_tokens"])}), flush=True)


def _labelled(ap: argparse.ArgumentParser, item: str) -> tuple[str, Path]:
    label, sep, path = item.partition("=")
    if not sep or not label or not Path(path, "addon").is_dir():
        ap.error(f"--compare takes LABEL=TREE with TREE a source tree holding addon/; got {item!r}")
    return label, Path(path).resolve()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--contexts", type=int, nargs="+", default=[8_000, 32_000, 128_000])
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--tree", type=Path, default=ROOT, help="source tree to measure (default: this checkout)")
    ap.add_argument("--compare", nargs="+", metavar="LABEL=TREE", help="measure these source trees side by side")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of --compare (medians over rounds are printed)")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON (what --compare reads)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.calls < 2:
        ap.error("--calls must be at least 2 (the first call of a session is not steady state)")
    if args.json:
        print(json.dumps(run_tree(args.tree.resolve(), args.model_dir, args.contexts, args.calls)))
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks import tree as tree_facts

    cmd = "python benchmarks/stage_costs.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print("# Stage costs of a steady-state call\n")
    print(f"Machine: {tree_facts.machine_facts().markdown()}. Load at start {tree_facts.loadavg()}.")
    print(f"\nCommand: `{cmd}`\n\n{HEADER}", flush=True)
    if args.compare:
        trees = [_labelled(ap, item) for item in args.compare]
        compare(trees, args.model_dir, args.contexts, args.calls, args.repeat)
    else:
        for result in run_tree(args.tree.resolve(), args.model_dir, args.contexts, args.calls):
            print(table_row("this", result), flush=True)
    print(f"\nLoad at end {tree_facts.loadavg()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""First calls of a harness's sessions: what a full render costs with and without the shared leading-turn ids.

Every rollout of a harness opens with the same system instructions and tool list (7k–19k tokens for the coding
harnesses) and a short task; the proxy renders and tokenises that first call in full. With
:class:`addon.generation.lead_cache.LeadCache` only the first session of the process tokenises the lead; later
sessions take its ids from the cache. This times ``splice.plan`` (render + tokenise, as the generator runs it) of the
first call of ``--sessions`` sessions sharing one lead of each size, with the cache on and off, interleaved session by
session in one process (the machine's drift hits both alike), and checks that both give the same ids.

Usage (proxy env)::

    python benchmarks/first_calls.py --model-dir D [--leads 8000 16000 32000] [--sessions 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon.generation.render import PromptRenderer  # noqa: E402
from addon.generation.splice import SessionState, SpliceRenderer, plan  # noqa: E402
from benchmarks import tree  # noqa: E402
from converters.canonical import Message, ModelRequest, TextPart, ToolSpec  # noqa: E402

CHARS_PER_TOKEN = 4.4  # of the lead text below under the SmolLM2 tokenizer (the page prints the measured sizes)


def lead(tokens: int) -> tuple[Message, tuple[ToolSpec, ...]]:
    """Instructions and a tool list of about ``tokens`` tokens, three quarters instructions, a quarter tools."""
    rule = "When a test fails, read the file, find the cause, change the smallest thing and run the tests again. "
    n_rules = max(1, int(tokens * 0.75 * CHARS_PER_TOKEN / len(rule)))
    system = Message("system", (TextPart("".join(f"{i}. {rule}" for i in range(n_rules))),))
    desc = "Run a shell command in the workspace and return its output; long outputs are cut. " * 4
    n_tools = max(1, int(tokens * 0.25 * CHARS_PER_TOKEN / (len(desc) + 120)))
    params = {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}
    return system, tuple(ToolSpec(f"tool_{i}", desc, params) for i in range(n_tools))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--leads", type=int, nargs="+", default=[8_000, 16_000, 32_000])
    ap.add_argument("--sessions", type=int, default=6)
    args = ap.parse_args(argv)
    if args.sessions < 2:
        ap.error("--sessions must be at least 2 (the first session fills the cache)")
    renderer = PromptRenderer.from_pretrained(args.model_dir)
    cmd = "python benchmarks/first_calls.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print("# First calls: the shared leading turn\n")
    print(f"Machine: {tree.machine_facts().markdown()}. Load at start {tree.loadavg()}.\n\nCommand: `{cmd}`\n")
    print("| lead (target tokens) | prompt tokens | first session ms (cache on) | later sessions p50 ms (cache on) "
          "| sessions p50 ms (cache off) | later / off |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for k, size in enumerate(args.leads):
        system, tools = lead(size)
        on, off = SpliceRenderer(renderer), SpliceRenderer(renderer)
        off.leads.enabled = False  # the same renderer, every text tokenised whole
        times: dict[str, list[float]] = {"on": [], "off": []}
        lengths = set()
        for i in range(args.sessions):
            user = Message("user", (TextPart(f"Task {k}.{i}: the test test_{i} fails; fix it."),))
            request = ModelRequest("chat", "m", (system, user), tools=tools)
            ids = {}
            for name, splicer in (("on", on), ("off", off)):
                t0 = time.perf_counter()
                p = plan(SessionState(f"{name}-{size}-{i}"), request, splicer)
                times[name].append(time.perf_counter() - t0)
                ids[name] = tuple(p.prompt_ids)
            if ids["on"] != ids["off"]:
                raise SystemExit(f"lead {size}, session {i}: the cached lead gave other ids than a whole render")
            lengths.add(len(ids["on"]))
        later = statistics.median(times["on"][1:]) * 1e3
        whole = statistics.median(times["off"]) * 1e3
        print(f"| {size} | {max(lengths)} | {times['on'][0] * 1e3:.1f} | {later:.1f} | {whole:.1f} | "
              f"{later / whole:.2f} |", flush=True)  # fmt: skip
    print(f"\nLoad at end {tree.loadavg()}. Same ids with and without the cache for every session.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

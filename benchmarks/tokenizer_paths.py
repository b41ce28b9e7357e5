"""What the proxy's tokenisation costs on each path, for each pre-tokeniser :mod:`addon.generation.bpe_tiktoken` takes.

A model's tokenizer.json is rebuilt with GPT-2's split (as it is, for SmolLM2), with Llama 3's Split pattern (and
``ignore_merges``, as Llama 3 sets it) and with Qwen 2's (and its NFC normaliser), over the same vocabulary and
merges: the real Llama 3 and Qwen 2 files need not be on the machine. For each, and for each text (2,000 characters
of ASCII code: a tool output; 500 KB of it: a first call's render), the Rust tokenizer's offset-free call
(``encode_batch_fast``, the ``backend-fast`` path) against :class:`~addon.generation.bpe_tiktoken.TiktokenBPE`,
interleaved, medians of ``--repeat`` timings; the ids are checked equal first, and the start-up check's time is
printed. Non-ASCII texts behind a Split go to the Rust tokenizer, so they cost what its column says.

Usage (proxy env)::

    python benchmarks/tokenizer_paths.py --model-dir D [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon.generation.bpe_tiktoken import SPLITS, TiktokenBPE, tiktoken_bpe  # noqa: E402
from addon.generation.token_encoder import PROBE_TEXTS  # noqa: E402
from benchmarks import tree  # noqa: E402


def variant(spec: dict[str, Any], name: str) -> dict[str, Any]:
    """``spec`` with the pre-tokeniser (and normaliser, ignore_merges) of ``name``: "GPT-2" leaves it as it is."""
    out = copy.deepcopy(spec)
    if name == "GPT-2":
        return out
    split = {"type": "Split", "pattern": {"Regex": SPLITS[name]}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, byte_level]}
    if name == "Qwen 2":
        out["normalizer"] = {"type": "NFC"}
    else:
        out["model"]["ignore_merges"] = True
    return out


def median_ms(encode: Callable[[str], list[int]], text: str, repeat: int) -> float:
    calls = max(1, 400_000 // max(1, len(text)))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            encode(text)
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    spec = json.loads((args.model_dir / "tokenizer.json").read_text())
    sources = [p.read_text() for p in sorted((ROOT / "addon").rglob("*.py"))]
    code = "".join(t for t in sources if t.isascii())
    texts = {"2,000 characters": code[:2000], "500 KB": (code * (1 + 500_000 // len(code)))[:500_000]}
    print(
        f"Machine: {tree.machine_facts().markdown()}. Commit {tree.git_rev()}. Vocabulary of {args.model_dir.name}.\n"
    )
    print("| pre-tokeniser | text | Rust encode_batch_fast ms | tiktoken ms | ratio | start-up check s |")
    print("|---|---|---|---|---|---|")
    for name in ("GPT-2", *SPLITS):
        text_spec = json.dumps(variant(spec, name))
        backend = Tokenizer.from_str(text_spec)

        def fast(t: str, backend: Any = backend) -> list[int]:
            ids: list[int] = backend.encode_batch_fast([t], add_special_tokens=False)[0].ids
            return ids

        def batch(ts: list[str], backend: Any = backend) -> list[list[int]]:
            return [e.ids for e in backend.encode_batch_fast(ts, add_special_tokens=False)]

        t0 = time.perf_counter()
        bpe = tiktoken_bpe(text_spec, fast, batch, list(PROBE_TEXTS))
        check_s = time.perf_counter() - t0
        if not isinstance(bpe, TiktokenBPE):
            print(f"| {name} | | not taken: {bpe} | | | |")
            continue
        for label, text in texts.items():
            if bpe.encode(text) != fast(text):
                raise SystemExit(f"{name}: tiktoken gave other ids than the tokenizer for {label}")
            rust = median_ms(fast, text, args.repeat)
            ours = median_ms(bpe.encode, text, args.repeat)
            print(f"| {name} | {label} | {rust:.3f} | {ours:.3f} | {rust / ours:.1f}x | {check_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

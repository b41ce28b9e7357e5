"""A byte-level BPE tokenizer run by tiktoken: the ids of the Rust tokenizer's ``encode``, in less time.

Contract
--------
:func:`tiktoken_bpe` reads a Hugging Face tokenizer's backend (its ``tokenizer.json`` as the backend holds it) and
returns a :class:`TiktokenBPE` whose ``encode(text)`` gives the ids ``tokenizer.encode(text,
add_special_tokens=False)`` gives, or the reason it cannot. Nothing is approximated: the tokenizer is taken only
when it is, piece by piece, what tiktoken computes:

* the model is BPE without dropout, unknown token, byte fallback, sub-word prefix or suffix (``ignore_merges``
  either way: tiktoken takes a piece that is a token whole, as ``ignore_merges`` does, and otherwise the checks
  below make merging reach it);
* the pre-tokeniser splits as tiktoken will: ``ByteLevel`` with GPT-2's split (``use_regex``, no prefix space),
  which :data:`GPT2_SPLIT` is in tiktoken's regex dialect; or a ``Split`` (``Isolated``, not inverted) by one of
  :data:`SPLITS`, Llama 3's or Qwen 2's pattern (the same text in both dialects), then ``ByteLevel`` without a
  regex or prefix space. Behind a ``Split`` only ASCII texts go to tiktoken (``str.isascii``, O(1)), the rest to
  ``fallback``: the two regex engines' Unicode classes (Oniguruma's, fancy-regex's) need not agree on every
  character outside ASCII, and ASCII is all a coding agent's traffic mostly is;
* there is no normaliser, or only NFC, which leaves ASCII as it is (and only ASCII texts then go to tiktoken);
* every token of the model's vocabulary is one byte or the product of exactly one merge, and the products' ids rise
  with the merges' order. tiktoken's rank is both a token's id and its merge priority, so the ids must order the
  merges as the merge list does (byte-level BPE as trained: the merges are appended to the vocabulary in order);
* the added tokens (``<|im_end|>``...) neither strip spaces nor match single words only, and none is a prefix of
  another: tiktoken finds them with one regex alternation, the Rust tokenizer longest first;
* characters whose bytes have no token (SmolLM2 has none for six control characters and for the lead bytes of
  two unassigned planes) and lone surrogates: a text holding one is encoded by ``fallback`` (the Rust tokenizer).
  A vocabulary missing a UTF-8 continuation byte is refused (nearly every non-ASCII text would fall back).

:func:`tiktoken_bpe` also checks every vocabulary token's text and the caller's probe texts both ways before it
answers (~0.2 s for SmolLM2's 49k tokens, once per renderer); the caller logs which path it took.

Why: the tokenizer was the largest single Python-level cost of a steady call through the proxy (12% of the
proxy's samples over lone 8k calls; ``benchmarks/results/round21.md``) and most of a first call's render. For
SmolLM2: 2,000 characters 0.45 -> 0.14 ms, 500 KB 152 -> 61 ms on one core (30 ms in two threads).
``tiktoken`` is OpenAI's BPE engine (Rust, releases the GIL); its byte-pair merge is the same algorithm given the
conditions above, which is what this module verifies.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

# GPT-2's pre-tokeniser split, as tokenizers' ByteLevel(use_regex=True) applies it
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# the Split patterns of tokenizer.json files taken as they are: each means the same in Oniguruma (tokenizers) and
# fancy-regex (tiktoken) on ASCII text; digits one at a time (Qwen 2) or by threes (Llama 3)
_SPLIT_TAIL = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_SPLIT_HEAD = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"""
SPLITS = {
    "Llama 3": _SPLIT_HEAD + r"|\p{N}{1,3}" + _SPLIT_TAIL,
    "Qwen 2": _SPLIT_HEAD + r"|\p{N}" + _SPLIT_TAIL,
}
# the ByteLevel pre-tokeniser's byte -> character map (printable bytes stand for themselves, the rest from U+0100)
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_UNPRINTABLE = [b for b in range(256) if b not in _PRINTABLE]
BYTE_OF_CHAR = {chr(b): b for b in _PRINTABLE} | {chr(256 + i): b for i, b in enumerate(_UNPRINTABLE)}
# each mapped character to the Latin-1 character of its byte; the unprintable bytes' own characters (never in a
# byte-level vocabulary) to a surrogate, which Latin-1 cannot encode
_TO_LATIN1 = str.maketrans(
    {c: chr(b) for c, b in BYTE_OF_CHAR.items() if ord(c) != b} | {chr(b): "\ud800" for b in _UNPRINTABLE}
)
# the code points whose UTF-8 begins with a lead byte: 0xC2-0xDF two bytes, 0xE0-0xEF three (from U+0800), 0xF0-0xF4
# four (from U+10000)
_LEAD_RANGES = {b: ((b - 0xC0) << 6, ((b - 0xC0) << 6) + 0x3F) for b in range(0xC2, 0xE0)}
_LEAD_RANGES |= {b: (max(0x800, (b - 0xE0) << 12), ((b - 0xE0) << 12) + 0xFFF) for b in range(0xE0, 0xF0)}
_LEAD_RANGES |= {
    b: (max(0x10000, (b - 0xF0) << 18), min(0x10FFFF, ((b - 0xF0) << 18) + 0x3FFFF)) for b in range(0xF0, 0xF5)
}
_NEVER_IN_UTF8 = {0xC0, 0xC1, *range(0xF5, 0x100)}


@dataclass(frozen=True)
class TiktokenBPE:
    """``encode(text)``: the tokenizer's ids for ``text`` (see the module docstring); ``encode_batch(texts)``: the
    same for each text, in threads."""

    encoding: Any  # tiktoken.Encoding
    fallback: Callable[[str], list[int]]
    fallback_chars: re.Pattern[str]  # a text with one of these goes to ``fallback``
    ascii_only: bool = False  # only ASCII texts go to tiktoken (behind a Split pattern or NFC)

    def _falls_back(self, text: str) -> bool:
        return (self.ascii_only and not text.isascii()) or self.fallback_chars.search(text) is not None

    def encode(self, text: str) -> list[int]:
        if self._falls_back(text):
            return self.fallback(text)
        ids: list[int] = self.encoding.encode(text, allowed_special="all")
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if any(self._falls_back(t) for t in texts):
            return [self.encode(t) for t in texts]
        threads = min(8, os.cpu_count() or 1)
        out: list[list[int]] = self.encoding.encode_batch(texts, num_threads=threads, allowed_special="all")
        return out


def tiktoken_bpe(
    backend_json: str,
    fallback: Callable[[str], list[int]],
    fallback_batch: Callable[[list[str]], list[list[int]]],
    probe: list[str],
) -> TiktokenBPE | str:
    """The tokenizer whose backend serialises to ``backend_json`` as a :class:`TiktokenBPE`, or why it cannot be
    one. ``fallback`` (``fallback_batch``: of many texts) must be the tokenizer's own exact encode; ``probe``: texts
    checked both ways besides every vocabulary token's text."""
    try:
        import tiktoken
    except ImportError:
        return "tiktoken is not installed"
    spec = msgspec.json.decode(backend_json)
    if (refusal := _refusal(spec)) is not None:
        return refusal
    split = _split(spec)
    if split is None:
        return (
            f"its pre-tokeniser is neither ByteLevel with GPT-2's split nor a known Split: {spec.get('pre_tokenizer')}"
        )
    ascii_only = split != GPT2_SPLIT or spec.get("normalizer") is not None
    model = spec["model"]
    added = {t["content"]: t["id"] for t in spec.get("added_tokens") or ()}
    # an added token's text is matched whole before the split, never merged: tiktoken's special tokens
    added_ids = set(added.values())
    vocab = ((token, i) for token, i in model["vocab"].items() if i not in added_ids)
    try:
        ranks = {token_bytes(token): i for token, i in vocab}
        if (refusal := _merge_refusal(model, ranks)) is not None:
            return refusal
    except UnicodeEncodeError as e:
        return f"its vocabulary is not byte-level: {e.object[e.start : e.end]!r} stands for no byte"
    missing = {b for b in range(256) if bytes([b]) not in ranks} - _NEVER_IN_UTF8
    if any(0x80 <= b < 0xC0 for b in missing):
        return f"its vocabulary has no token for the UTF-8 continuation byte(s) {sorted(missing)}"
    classes = ["\\ud800-\\udfff"] + [re.escape(chr(b)) for b in sorted(missing) if b < 0x80]
    classes += [f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in (_LEAD_RANGES[b] for b in sorted(missing) if b >= 0xC2)]
    encoding = tiktoken.Encoding("harnessrl-bpe", pat_str=split, mergeable_ranks=ranks, special_tokens=added)
    bpe = TiktokenBPE(encoding, fallback, re.compile(f"[{''.join(classes)}]"), ascii_only)
    texts = [t for t in (b.decode("utf-8", "ignore") for b in ranks) if t] + probe
    ours, theirs = [bpe.encode(t) for t in texts], fallback_batch(texts)  # one thread: 49k small texts
    if (i := next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)) is not None:
        return f"tiktoken gave other ids than the tokenizer for {texts[i][:60]!r}"
    return bpe


def token_bytes(token: str) -> bytes:
    """The bytes a vocabulary entry of a ByteLevel tokenizer stands for; UnicodeEncodeError for a character that
    stands for no byte."""
    return token.translate(_TO_LATIN1).encode("latin-1")


def _refusal(spec: dict[str, Any]) -> str | None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')!r}, not BPE"
    for key, ok in (("dropout", None), ("unk_token", None), ("byte_fallback", False)):
        if model.get(key, ok) != ok:
            return f"its BPE sets {key}={model.get(key)!r}"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE has a sub-word prefix or suffix"
    if spec.get("normalizer") not in (None, {"type": "NFC"}):
        return f"it has a normaliser other than NFC: {spec.get('normalizer')}"
    added = [t["content"] for t in spec.get("added_tokens") or ()]
    for t in spec.get("added_tokens") or ():
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            return f"its added token {t['content']!r} strips spaces or matches single words"
    if any(a != b and b.startswith(a) for a in added for b in added):
        return "one of its added tokens is a prefix of another"
    return None


def _split(spec: dict[str, Any]) -> str | None:
    """The split regex (tiktoken's dialect) the pre-tokeniser applies before its byte-level map, or None when it is
    not one this module takes (see the module docstring)."""
    pre = spec.get("pre_tokenizer") or {}
    if (pre.get("type"), pre.get("add_prefix_space"), pre.get("use_regex", True)) == ("ByteLevel", False, True):
        return GPT2_SPLIT
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, byte_level = steps
    if (byte_level.get("type"), byte_level.get("add_prefix_space"), byte_level.get("use_regex")) != (
        "ByteLevel",
        False,
        False,
    ):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    if (split.get("type"), split.get("behavior"), split.get("invert")) != ("Split", "Isolated", False):
        return None
    return pattern if pattern in SPLITS.values() else None


def _merge_refusal(model: dict[str, Any], ranks: dict[bytes, int]) -> str | None:
    """Why the merges are not what tiktoken's ranks can express (see the module docstring), or None."""
    made: set[bytes] = set()
    last = -1
    for merge in model["merges"]:
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        product = token_bytes(a + b)
        if product in made or product not in ranks:
            return f"the merge {a!r} + {b!r} makes a token twice or one not in the vocabulary"
        if ranks[product] <= last:
            return "its merged tokens' ids do not follow the merges' order"
        made.add(product)
        last = ranks[product]
    stray = [t for t in ranks if len(t) > 1 and t not in made]
    if stray:
        return f"{len(stray)} vocabulary token(s) are neither a byte nor a merge's product, e.g. {stray[0]!r}"
    return None


__all__ = ["BYTE_OF_CHAR", "GPT2_SPLIT", "SPLITS", "TiktokenBPE", "tiktoken_bpe", "token_bytes"]

"""Text -> token ids for the renderer: the Rust tokenizer's offset-free call where it gives the same ids.

Contract
--------
:func:`token_encoder` returns a :class:`TokenEncoder` whose ``encode(text)`` is exactly
``tokenizer.encode(text, add_special_tokens=False)`` (a list of ints) and whose ``path`` says how it is computed:

* ``"tiktoken"``: tiktoken's BPE engine over the tokenizer's own vocabulary and merges
  (:mod:`addon.generation.bpe_tiktoken`), taken when the backend-fast path below is (same settings) and the
  tokenizer is a byte-level BPE that tiktoken computes piece by piece; that module checks the conditions, every
  vocabulary token's text and the probe texts. ~3x less CPU than the Rust tokenizer on 2,000 characters of text
  (`benchmarks/results/round21.md`).
* ``"backend-fast"``: ``tokenizer.backend_tokenizer.encode_batch_fast([text], add_special_tokens=False)``, the
  same Rust pipeline without the character offsets ``encode`` tracks for every token (nothing here reads them).
  On SmolLM2's byte-level BPE that is ~23% less CPU per character (0.224 against 0.291 ms per 1,000 characters of
  tool output, `benchmarks/results/round14.md`), and the tokenizer is the largest single CPU cost of a steady call
  (`round13.md` section 3) and most of a first call's render. Taken only when the backend is set up as
  transformers' ``encode`` leaves it (no truncation, no padding, special tokens split or not as the tokenizer's
  ``split_special_tokens`` says) and a probe of texts with every special token gives the same ids both ways.
* ``"transformers"``: the tokenizer's own ``encode`` otherwise (a tokenizer without a Rust backend, a ``tokenizers``
  without ``encode_batch_fast``, a backend that truncates or pads, a probe that differs); the reason is logged.

``encode_batch(texts)`` is ``[encode(t) for t in texts]``; on the fast path the Rust backend tokenises the texts in
parallel on its thread pool (``None`` on the other path, which has no cheaper batch). :class:`LeadCache` uses it for
a full render's pieces.

The fast path never changes the backend's settings (transformers' ``encode`` may set them on the shared backend on
a call), so the renderer's worker threads may call it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from addon.generation.bpe_tiktoken import TiktokenBPE, tiktoken_bpe

log = logging.getLogger(__name__)

EncodePath = Literal["tiktoken", "backend-fast", "transformers"]

# Texts the two paths must agree on before the fast one is trusted: scripts, whitespace runs, digits, code, JSON;
# the tokenizer's special and added tokens are appended (in text and glued to words).
PROBE_TEXTS: tuple[str, ...] = (
    "Hello, world!  Two  spaces,\ttabs\t\tand\n\nnewlines\r\n  indented.",
    'def f(x: int) -> dict[str, int]:\n    return {"a": x ** 2, "b": [1, 2, 3]}  # comment\n',
    '{"path":"/tmp/a b.txt","lines":[12,345,6789],"ok":true,"note":"naïve café – 東京 🚀"}',
    "1234567890 3.14159 -42 1e-9 0x1F ███ \u00a0nbsp \u200bzero-width   ",
    # ASCII that Llama 3's and Qwen 2's splits cut otherwise than GPT-2's: upper-case contractions, digit runs,
    # CR LF, punctuation before newlines, space runs before a newline
    "I'M SURE HE'S RIGHT; WE'LL SEE. don't\r\n\r\n  x=1234567;y=89\n\t}\n\n\n    return   \n  ok",
)


@dataclass(frozen=True)
class TokenEncoder:
    """``encode(text)``: the ids ``tokenizer.encode(text, add_special_tokens=False)`` gives; ``path``: how."""

    encode: Callable[[str], list[int]]
    path: EncodePath
    encode_batch: Callable[[list[str]], list[list[int]]] | None = None


def token_encoder(tokenizer: Any) -> TokenEncoder:
    """The cheapest way to get ``tokenizer.encode(text, add_special_tokens=False)`` (see the module docstring)."""

    def slow(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    reason = _fast_path_refusal(tokenizer)
    if reason is None:
        backend = tokenizer.backend_tokenizer
        batch_fast = backend.encode_batch_fast

        def fast(text: str) -> list[int]:
            ids: list[int] = batch_fast([text], add_special_tokens=False)[0].ids
            return ids

        def batch(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in batch_fast(texts, add_special_tokens=False)]

        probe = _probe_texts(tokenizer)
        differs = [t for t in probe if fast(t) != slow(t)]
        if not differs:
            bpe = tiktoken_bpe(backend.to_str(), fast, batch, probe)
            if isinstance(bpe, TiktokenBPE):
                log.info("harnessrl: tokenising with tiktoken over the tokenizer's BPE (its checks gave encode's ids)")
                return TokenEncoder(bpe.encode, "tiktoken", bpe.encode_batch)
            log.info("harnessrl: tokenising with the Rust backend's encode_batch_fast; not tiktoken: %s", bpe)
            return TokenEncoder(fast, "backend-fast", batch)
        reason = f"its encode_batch_fast gave other ids than encode on the probe text {differs[0][:60]!r}"
    log.info("harnessrl: tokenising with the tokenizer's own encode: %s", reason)
    return TokenEncoder(slow, "transformers")


def _fast_path_refusal(tokenizer: Any) -> str | None:
    """Why the Rust backend cannot be called directly for ``tokenizer``, or None if it can (probe still to pass)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return f"{type(tokenizer).__name__} has no Rust backend (backend_tokenizer)"
    if not callable(getattr(backend, "encode_batch_fast", None)):
        return "the installed tokenizers has no encode_batch_fast (0.21 or later has it)"
    if backend.truncation is not None or backend.padding is not None:
        return "its backend truncates or pads (set in tokenizer.json)"
    if bool(getattr(backend, "encode_special_tokens", False)) != bool(
        getattr(tokenizer, "split_special_tokens", False)
    ):
        return "its backend splits special tokens otherwise than the tokenizer's split_special_tokens says"
    return None


def _probe_texts(tokenizer: Any) -> list[str]:
    specials = sorted(
        set(getattr(tokenizer, "all_special_tokens", ())) | set(getattr(tokenizer, "get_added_vocab", dict)())
    )[:200]
    texts = list(PROBE_TEXTS)
    if specials:
        texts.append("".join(specials))
        texts.append(" ".join(f"x{s}y {s}\n" for s in specials))
    return texts


__all__ = ["PROBE_TEXTS", "EncodePath", "TokenEncoder", "token_encoder"]

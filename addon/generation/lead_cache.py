"""The token ids of rendered prompts' leading turn, shared by every session of a proxy process.

Contract
--------
A session's first call (and every fork or side request) is rendered and tokenised in full. Its leading turn — the
system instructions and the tool list, 7k–19k tokens for the coding harnesses — is the same text for every session
of a harness, so :class:`LeadCache` keeps its ids: ``encode(text)`` splits ``text`` after the first end-of-turn
special token (ChatML ``<|im_end|>``), takes the ids of that head from the cache (tokenising it once) and tokenises
only the rest.

Why splitting there is exact: a special token is matched before the tokenizer's normaliser and pre-tokeniser run, so
the text on either side of it is tokenised on its own — the same fact the splice relies on when it tokenises only a
call's new suffix after the end-of-turn id (:mod:`addon.generation.splice`). :meth:`LeadCache.probe` checks it on the
loaded tokenizer at start-up; a tokenizer where it does not hold (or a template without a special end-of-turn token)
gets ``enabled = False`` and every text is tokenised whole, as before.

The rest of a long text is cut after each end-of-turn token into pieces of at least ``piece_chars`` characters,
tokenised in one ``encode_batch`` call when one is given (the Rust tokenizer works on the pieces in parallel on its
thread pool: a first call's prompt of 128k tokens is ~0.5 MB of text, ~110 ms on one core). Exact for the same
reason as the head's cut, and checked by the same probe.

Bounded (LRU by characters; a head over a quarter of the bound is tokenised but not kept) and thread-safe: renders
run in worker threads. Pure and synchronous.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

Encode = Callable[[str], tuple[int, ...]]
EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]

# the probe's texts: a lead, then what may follow the end-of-turn token (a newline, a next turn, spaces, unicode)
_PROBE_HEADS = ("system\nYou are a careful assistant. Tools: read, write.", "sys  \n\tx = 1 # é 東京 🙂", "x", "ab")
_PROBE_TAILS = ("\n", "\nuser\nhello", " leading space", "\n\n  indented\n", "é 東京 🙂", "")


class LeadCache:
    """Token ids of leading turns by their text (see the module docstring)."""

    def __init__(
        self,
        encode: Encode,
        eot_text: str,
        max_chars: int = 8 << 20,
        *,
        encode_batch: EncodeBatch | None = None,
        piece_chars: int = 16 << 10,
    ) -> None:
        if max_chars < 1 or piece_chars < 1:
            raise ValueError(f"LeadCache max_chars and piece_chars must be at least 1, got {max_chars}, {piece_chars}")
        self._encode = encode
        self._encode_batch = encode_batch
        self.piece_chars = piece_chars
        self.eot_text = eot_text
        self.max_chars = max_chars
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.enabled = bool(eot_text) and self.probe()

    def probe(self) -> bool:
        """Whether splitting after the end-of-turn token gives the ids of the whole text, on probe texts."""
        for head in _PROBE_HEADS:
            for tail in _PROBE_TAILS:
                text = head + self.eot_text + tail
                cut = len(head) + len(self.eot_text)
                if self._encode(text[:cut]) + (self._encode(text[cut:]) if text[cut:] else ()) != self._encode(text):
                    return False
        return True

    def encode(self, text: str) -> tuple[int, ...]:
        """The ids of ``text``: those of its lead from the cache, the rest tokenised now."""
        at = text.find(self.eot_text) if self.enabled else -1
        if at < 0:
            return self._encode(text)
        cut = at + len(self.eot_text)
        head, rest = text[:cut], text[cut:]
        with self._lock:
            ids = self._cache.get(head)
            if ids is not None:
                self._cache.move_to_end(head)
                self.hits += 1
            else:
                self.misses += 1
        if ids is None:
            ids = self._encode(head)
            self._keep(head, ids)
        return ids + self._encode_rest(rest) if rest else ids

    def _encode_rest(self, rest: str) -> tuple[int, ...]:
        """The ids of what follows the lead: in pieces cut after end-of-turn tokens, one batch, when it is long."""
        pieces = self.pieces(rest) if self._encode_batch is not None and len(rest) >= 2 * self.piece_chars else [rest]
        if len(pieces) == 1:
            return self._encode(rest)
        assert self._encode_batch is not None
        out: list[int] = []
        for ids in self._encode_batch(pieces):
            out.extend(ids)
        return tuple(out)

    def pieces(self, text: str) -> list[str]:
        """``text`` cut after end-of-turn tokens into pieces of at least ``piece_chars`` (the last may be shorter)."""
        out, start, eot = [], 0, self.eot_text
        while start < len(text):
            at = text.find(eot, start + self.piece_chars - len(eot)) if eot else -1
            if at < 0:
                out.append(text[start:])
                break
            cut = at + len(eot)
            out.append(text[start:cut])
            start = cut
        return out

    def _keep(self, head: str, ids: tuple[int, ...]) -> None:
        if len(head) > self.max_chars // 4:
            return
        with self._lock:
            if head not in self._cache:  # another thread may have tokenised the same head meanwhile
                self._cache[head] = ids
                self._chars += len(head)
            while self._chars > self.max_chars:
                self._chars -= len(self._cache.popitem(last=False)[0])

    def __len__(self) -> int:
        return len(self._cache)


__all__ = ["LeadCache"]

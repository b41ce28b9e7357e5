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

Bounded (LRU by characters; a head over a quarter of the bound is tokenised but not kept) and thread-safe: renders
run in worker threads. Pure and synchronous.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

Encode = Callable[[str], tuple[int, ...]]

# the probe's texts: a lead, then what may follow the end-of-turn token (a newline, a next turn, spaces, unicode)
_PROBE_HEADS = ("system\nYou are a careful assistant. Tools: read, write.", "sys  \n\tx = 1 # é 東京 🙂", "x", "ab")
_PROBE_TAILS = ("\n", "\nuser\nhello", " leading space", "\n\n  indented\n", "é 東京 🙂", "")


class LeadCache:
    """Token ids of leading turns by their text (see the module docstring)."""

    def __init__(self, encode: Encode, eot_text: str, max_chars: int = 8 << 20) -> None:
        if max_chars < 1:
            raise ValueError(f"LeadCache max_chars must be at least 1, got {max_chars}")
        self._encode = encode
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
        return ids + self._encode(rest) if rest else ids

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

"""A session's request blobs as concatenated zstd frames: what its previous call compressed is not compressed again.

Contract
--------
``RequestFrames.pack(text, layout, session)`` returns standard zstd data that decompresses to exactly ``text``, as
:func:`~addon.records.blobs.pack_json_text` does, but as several frames concatenated (RFC 8878 §3.1 allows it; the
frames of consecutive pieces of the text decompress to the whole): :func:`~addon.records.blobs.unpack_json` and
``zstd -dc`` read it alike. Without ``session`` (a side call) it is one frame.

Why: a tool loop resends its whole history every call, and the request blob was the one O(context) CPU cost left
on a call's path: zstd of the whole JSON text, 2.2 ms per call at 128k tokens (760 KB), 0.65 ms at 32k.

The frames of a call, in the text's order:

* **sealed segments** of the text's stable prefix (``layout.stable``: up to the messages before the last), each at
  least ``seal_chars`` long (the first: ``FIRST_SEAL_CHARS``), compressed once. The next call reuses a segment
  when its text repeats it at the same offset (``str.startswith(segment, offset)``: a compare, no copy); the first
  that differs is dropped with those after it, and the text from there is compressed anew (and sealed again once
  long enough);
* the text between the last segment and the ``tools`` array, compressed every call (under ``seal_chars`` plus the
  newest messages);
* the ``tools`` array (a harness's tools are tens of KB of JSON, the same every call), compressed once per
  session while it stays the same;
* the rest (``]}``).

Size: each frame is compressed alone, so matches across frames are lost. With 64 KiB segments a 150-call session's
last blob was 5-8% larger than one frame (32 KiB: 10-11%, 16 KiB: 17%; ``benchmarks/results/round17.md``).

Memory: per session, the sealed text (one more copy of the history's JSON) and its frames, plus the tools' text and
frame; least recently used sessions are dropped past ``max_chars`` of held text (a dropped session's next blob is
compressed whole, then sealed again); :meth:`RequestFrames.forget` drops one at once. Thread-safe: rows are built in
worker threads; each session's calls come one at a time, and a race between two of one session only costs reuse.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from addon.records.blobs import TextLayout, pack_json_text

SEAL_CHARS: Final = 64 << 10  # a sealed segment's least length; see the module docstring for the size it costs
# The first segment may be shorter: one more frame boundary costs little, and a session whose history stays under
# seal_chars (8k tokens is ~50 KB of messages) then compresses only its newest messages too.
FIRST_SEAL_CHARS: Final = 4 << 10
MIN_TOOLS_CHARS: Final = 4 << 10  # a shorter tools array goes with the text before it: a frame of its own saves less


@dataclass(frozen=True)
class _Held:
    """What one session's next call may reuse: its sealed segments (text, frame), and its tools (text, frame)."""

    segments: tuple[tuple[str, bytes], ...]
    tools: tuple[str, bytes] | None

    @property
    def chars(self) -> int:
        return sum(len(text) for text, _ in self.segments) + (len(self.tools[0]) if self.tools else 0)


class RequestFrames:
    """Packs request JSON text as zstd frames, reusing the frames of each session's previous call (see the module
    docstring)."""

    def __init__(
        self, seal_chars: int = SEAL_CHARS, max_chars: int = 32 << 20, tools_chars: int = MIN_TOOLS_CHARS
    ) -> None:
        if min(seal_chars, max_chars, tools_chars) < 1:
            raise ValueError(
                f"RequestFrames needs seal_chars, max_chars and tools_chars of at least 1, got {seal_chars}, "
                f"{max_chars}, {tools_chars}"
            )
        self.seal_chars = seal_chars
        self.tools_chars = tools_chars
        self.max_chars = max_chars
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.reused = 0  # frames taken from a session's previous call
        self.compressed = 0  # frames compressed

    def pack(self, text: str, layout: TextLayout, session: str | None) -> bytes:
        if session is None:
            return pack_json_text(text)
        with self._lock:
            held = self._held.get(session)
        kept: list[tuple[str, bytes]] = []
        at = 0
        for segment, frame in held.segments if held is not None else ():
            if at + len(segment) > layout.stable or not text.startswith(segment, at):
                break
            kept.append((segment, frame))
            at += len(segment)
        reused = len(kept)
        if layout.stable - at >= (self.seal_chars if kept else FIRST_SEAL_CHARS):
            segment = text[at : layout.stable]
            kept.append((segment, pack_json_text(segment)))
            at = layout.stable
        frames = [frame for _, frame in kept]
        tools = held.tools if held is not None else None
        span = layout.tools
        if span is not None and span[1] - span[0] >= self.tools_chars and span[0] >= at:
            start, end = span
            if tools is not None and len(tools[0]) == end - start and text.startswith(tools[0], start):
                reused += 1
            else:
                tools = (tools_text := text[start:end], pack_json_text(tools_text))
            frames += (pack_json_text(text[at:start]), tools[1], pack_json_text(text[end:]))
        else:
            frames.append(pack_json_text(text[at:]))
        self._remember(session, _Held(tuple(kept), tools), reused, len(frames) - reused)
        return b"".join(frames)

    def forget(self, session: str) -> None:
        """Drop what is held of ``session`` (the session closed)."""
        with self._lock:
            held = self._held.pop(session, None)
            if held is not None:
                self._chars -= held.chars

    @property
    def held_chars(self) -> int:
        return self._chars

    def __len__(self) -> int:
        return len(self._held)

    def _remember(self, session: str, held: _Held, reused: int, compressed: int) -> None:
        chars = held.chars
        with self._lock:
            self.reused += reused
            self.compressed += compressed
            old = self._held.pop(session, None)
            if old is not None:
                self._chars -= old.chars
            if chars > self.max_chars // 8:  # one session's history too long to hold: compressed whole each call
                return
            self._held[session] = held
            self._chars += chars
            while self._chars > self.max_chars:
                self._chars -= self._held.popitem(last=False)[1].chars


__all__ = ["FIRST_SEAL_CHARS", "MIN_TOOLS_CHARS", "SEAL_CHARS", "RequestFrames"]

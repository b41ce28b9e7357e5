"""Tests for addon.records.blob_frames: a session's request blobs as zstd frames, reused from call to call.

The oracle is :func:`pack_json_text` of the same text: every blob must decompress to exactly that text, whatever
the session did before (grew, rewrote its history, changed its tools, was dropped from the cache).
"""

from __future__ import annotations

import json
import subprocess
import threading

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records.blob_frames import FIRST_SEAL_CHARS, RequestFrames
from addon.records.blobs import CanonicalJson, TextLayout, pack_json_text, unpack_json, zstd_content_size
from converters.canonical import Message, ModelRequest, TextPart, ToolCallPart, ToolResultPart, ToolSpec


def _request(
    calls: int, *, result: str = "line of a file {i}\n", tools: int = 6, system: str = "Rules. "
) -> ModelRequest:
    """A tool loop's request after ``calls`` tool calls: a long system prompt, tool results of ~2 KB, big tools."""
    history = [Message("system", (TextPart(system * 800),)), Message("user", (TextPart("fix the bug"),))]
    for i in range(calls):
        history.append(Message("assistant", (ToolCallPart(f"c{i}", "read", json.dumps({"path": f"f{i}.py"})),)))
        history.append(Message("tool", (ToolResultPart(f"c{i}", (TextPart(result.format(i=i) * 120),)),)))
    specs = tuple(
        ToolSpec(f"tool{k}", "Does a thing. " * 60, {"type": "object", "properties": {"p": {"type": "string"}}})
        for k in range(tools)
    )
    return ModelRequest("anthropic", "m", tuple(history), tools=specs)


def _pack(frames: RequestFrames, json_cache: CanonicalJson, req: ModelRequest, session: str | None) -> bytes:
    text, layout = json_cache.request_layout(req, session)
    blob = frames.pack(text, layout, session)
    assert zstd_content_size(blob) == len(text.encode())
    assert unpack_json(blob) == json.loads(text)
    return blob


def _frames(blob: bytes) -> list[bytes]:
    """The frames of ``blob``, cut where each next one starts (a frame's content size and its magic number)."""
    starts = [i for i in range(len(blob) - 3) if blob[i : i + 4] == b"\x28\xb5\x2f\xfd"]
    out = []
    for a, b in zip(starts, [*starts[1:], len(blob)], strict=True):
        try:
            zstd_content_size(blob[a:b])
        except ValueError:
            continue  # the magic number inside compressed data
        out.append(blob[a:b])
    return out


def test_a_tool_loop_compresses_only_what_is_new() -> None:
    frames, json_cache = RequestFrames(seal_chars=8 << 10), CanonicalJson()
    blobs = [_pack(frames, json_cache, _request(n), "s") for n in range(12)]
    # every blob after the first starts with the previous blob's sealed frames, byte for byte
    for before, after in zip(blobs, blobs[1:], strict=False):
        shared = _frames(before)[:-3]  # all but the unsealed text, the tools and the end
        assert after.startswith(b"".join(shared))
    assert frames.reused > frames.compressed / 2
    # a segment is sealed once it holds seal_chars (the first: FIRST_SEAL_CHARS), so the text compressed each call
    # stays under seal_chars plus the newest messages, whatever the session's length
    assert len(_frames(blobs[-1])) > 5


def test_the_tools_frame_is_reused_while_the_tools_stay() -> None:
    frames, json_cache = RequestFrames(), CanonicalJson()
    first = _pack(frames, json_cache, _request(1), "s")
    reused = frames.reused
    _pack(frames, json_cache, _request(2), "s")
    assert frames.reused >= reused + 2  # the system prompt's segment and the tools
    changed = _request(3, tools=5)  # a tool removed: the tools array differs, compressed anew, still exact
    blob = _pack(frames, json_cache, changed, "s")
    assert unpack_json(blob)["tools"] == unpack_json(pack_json_text(json_cache.request(changed)))["tools"]
    assert len(_frames(first)) == 4  # the system prompt's segment, the text up to the tools, the tools, the end


def test_a_rewritten_history_drops_the_frames_from_the_first_change_on() -> None:
    frames, json_cache = RequestFrames(seal_chars=4 << 10), CanonicalJson()
    for n in range(8):
        _pack(frames, json_cache, _request(n), "s")
    compacted = _request(8, result="summary {i}\n")  # every tool result rewritten (a compaction)
    _pack(frames, json_cache, compacted, "s")
    new_system = _request(9, system="Other rules. ")  # the first message changed: no segment is reused
    reused = frames.reused
    _pack(frames, json_cache, new_system, "s")
    assert frames.reused == reused + 1  # the tools only
    shorter = _request(2)  # a session sent back to an earlier point
    _pack(frames, json_cache, shorter, "s")


def test_side_calls_and_short_requests_are_one_frame() -> None:
    frames, json_cache = RequestFrames(), CanonicalJson()
    req = _request(3)
    text, layout = json_cache.request_layout(req)
    assert frames.pack(text, layout, None) == pack_json_text(text)  # no session: not held
    assert len(frames) == 0
    small = ModelRequest("chat", "m", (Message("user", (TextPart("hi"),)),))
    text, layout = json_cache.request_layout(small, "t")
    assert layout.stable < FIRST_SEAL_CHARS and layout.tools is None
    assert frames.pack(text, layout, "t") == pack_json_text(text)


def test_held_text_is_bounded_and_forgotten() -> None:
    probe, json_cache = RequestFrames(), CanonicalJson()
    _pack(probe, json_cache, _request(4), "probe")
    one = probe.held_chars  # what one session holds
    frames = RequestFrames(max_chars=10 * one)  # a session may hold an eighth: ten fit
    for s in range(14):
        _pack(frames, json_cache, _request(4), f"s{s}")
        assert 0 < frames.held_chars <= 10 * one
    assert len(frames) == 10  # the least recently used sessions dropped
    frames.forget("s13")
    frames.forget("never-seen")
    assert (len(frames), frames.held_chars) == (9, 9 * one)
    _pack(frames, json_cache, _request(5), "s0")  # a dropped session is packed whole again, still exact
    huge = RequestFrames(max_chars=7 * one)  # one session over an eighth: packed, not held
    _pack(huge, json_cache, _request(4), "s")
    assert (len(huge), huge.held_chars) == (0, 0)
    with pytest.raises(ValueError, match="at least 1"):
        RequestFrames(seal_chars=0)


def test_the_zstd_tool_reads_a_blob_of_many_frames() -> None:
    frames, json_cache = RequestFrames(seal_chars=4 << 10), CanonicalJson()
    for n in range(6):
        blob = _pack(frames, json_cache, _request(n), "s")
    out = subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True)
    assert out.stdout.decode() == json_cache.request(_request(5))


def test_threads_packing_their_sessions_get_exact_blobs() -> None:
    frames, json_cache = RequestFrames(seal_chars=4 << 10, max_chars=1_000_000), CanonicalJson()
    errors: list[BaseException] = []

    def loop(s: int) -> None:
        try:
            for n in range(6):
                _pack(frames, json_cache, _request(n, result=f"s{s} " + "{i}\n"), f"s{s}")
        except BaseException as e:  # reported below: an assert in a thread would be lost
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


pieces = st.text(alphabet='ab{}[],"é\n中', min_size=0, max_size=300)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), pieces, st.booleans(), pieces, pieces, st.integers(0, 400)), max_size=10))
def test_any_sequence_of_texts_and_layouts_packs_exactly(calls: list[tuple[bool, str, bool, str, str, int]]) -> None:
    """Whatever a session's texts and layouts (a head that grows or is rewritten, a stable part that is not
    repeated, tools that stay, change or vanish), each blob holds exactly its text."""
    frames = RequestFrames(seal_chars=64, max_chars=10_000, tools_chars=16)
    head, tools = "", ""
    for grows, piece, same_tools, new_tools, tail, stable in calls:
        head = head + piece if grows else piece
        tools = tools if same_tools else new_tools
        text = head + tools + tail
        span = (len(head), len(head) + len(tools)) if tools else None
        blob = frames.pack(text, TextLayout(min(stable, len(head)), span), "s")
        assert zstd_content_size(blob) == len(text.encode())
        assert _unpack_text(blob) == text


def _unpack_text(blob: bytes) -> str:
    return pa.Codec("zstd").decompress(blob, decompressed_size=zstd_content_size(blob), asbytes=True).decode()

"""Tests for addon.records.blobs: the blobs' one JSON encoding, zstd packing, plain(), and the CanonicalJson cache.

The oracle for ``plain`` and the cache is what the record builder did before them: ``dataclasses.asdict`` followed
by ``_jsonable`` (copied below as it was in addon/generation/generate.py), encoded with the blobs' JSON settings.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.records.blobs import (
    CanonicalJson,
    dumps_json,
    pack_json,
    pack_json_text,
    plain,
    unpack_json,
    zstd_content_size,
)
from converters.canonical import (
    Completion,
    IdentityHints,
    ImagePart,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    ProviderState,
    ReasoningPart,
    ReasoningRequest,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolCallPart,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
    Usage,
)


def _jsonable(value: Any) -> Any:
    """The record builder's old conversion of ``asdict`` output (the oracle)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return value


def old_text(value: Any) -> str:
    return json.dumps(_jsonable(asdict(value)), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ------------------------------------------------------------------------------------------------ strategies

words = st.text(alphabet='abc xyz\u00e9\u4e2d"\\\n{}', max_size=12)
names = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True)
json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
json_value = st.recursive(
    json_leaf | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=8,
)
json_object = st.dictionaries(words, json_value, max_size=3)
states = st.none() | st.builds(
    ProviderState, st.sampled_from(["chat", "responses", "anthropic", "gemini"]), json_object
)
text_parts = st.builds(TextPart, words, provider_state=states)
parts = st.one_of(
    text_parts,
    st.builds(ImagePart, st.sampled_from(["url", "base64", "file_id"]), words, st.none() | words),
    st.builds(ReasoningPart, words, provider_state=states),
    st.builds(ToolCallPart, names, names, words, st.sampled_from(["function", "custom"]), provider_state=states),
    st.builds(
        ToolResultPart,
        names,
        st.lists(text_parts, max_size=2).map(tuple),
        is_error=st.booleans(),
        name=st.none() | names,
        provider_state=states,
    ),
)
messages = st.builds(
    Message,
    st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
    st.lists(parts, max_size=3).map(tuple),
    provider_state=states,
)
leaf_tools = st.builds(
    ToolSpec, names, words, st.none() | json_object, strict=st.none() | st.booleans(), provider_state=states
)
tools = leaf_tools | st.builds(
    ToolSpec, names, words, kind=st.just("namespace"), tools=st.lists(leaf_tools, max_size=2).map(tuple)
)
requests = st.builds(
    ModelRequest,
    st.sampled_from(["chat", "responses", "anthropic", "gemini"]),
    names,
    st.lists(messages, max_size=5).map(tuple),
    tools=st.lists(tools, max_size=3).map(tuple),
    tool_choice=st.none() | st.builds(ToolChoiceNamed, names),
    sampling=st.builds(SamplingParams, st.none() | st.integers(1, 10**6), stop=st.lists(words, max_size=2).map(tuple)),
    output_format=st.just(JsonSchemaFormat({"type": "object", "n": 1.5})),
    reasoning=st.none() | st.builds(ReasoningRequest, st.none() | st.booleans(), budget_tokens=st.integers(0, 9)),
    identity=st.builds(IdentityHints, st.dictionaries(names, words, max_size=2)),
    extras=json_object,
)


# ------------------------------------------------------------------------------------------------ plain and the cache


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1, max_size=4))
def test_cached_text_is_the_plain_text_and_the_old_text(reqs: list[ModelRequest]) -> None:
    cache = CanonicalJson()
    for req in reqs + reqs:  # the second pass is served (partly) from the cache
        expected = old_text(req)
        assert plain(req) == _jsonable(asdict(req))
        assert dumps_json(plain(req)) == expected
        assert cache.request(req) == expected
        assert json.loads(cache.request(req)) == json.loads(expected)


def _session(n_calls: int, reply: str = "ok") -> list[ModelRequest]:
    """A tool loop's requests: each resends the whole history as freshly built (equal, not identical) objects."""

    def build(calls: int) -> ModelRequest:
        history = [Message("system", (TextPart("You are a coding agent. " * 50),)), Message("user", (TextPart("go"),))]
        for i in range(calls):
            history.append(Message("assistant", (ToolCallPart(f"c{i}", "read", json.dumps({"path": f"f{i}.py"})),)))
            history.append(Message("tool", (ToolResultPart(f"c{i}", (TextPart(f"{reply} {i} " * 100),)),)))
        read = ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
        return ModelRequest("anthropic", "m", tuple(history), tools=(read,))

    return [build(k) for k in range(n_calls)]


def test_resent_history_is_served_from_the_cache() -> None:
    cache = CanonicalJson()
    session = _session(6)
    assert cache.request(session[0]) == old_text(session[0])
    assert (cache.hits, cache.misses) == (0, 3)  # system, user, the tool
    for k, req in enumerate(session[1:], start=1):
        hits, misses = cache.hits, cache.misses
        assert cache.request(req) == old_text(req)
        # Only the call's two new messages are encoded; the history it resends (2k messages + 2 + the tool) is hit.
        assert cache.misses - misses == 2
        assert cache.hits - hits == 2 * (k - 1) + 3
    assert len(cache) == 3 + 2 * 5


def test_equal_values_that_encode_differently_do_not_share_an_entry() -> None:
    """1 == 1.0 == True in Python but not in JSON: every variant must come back as its own text."""
    cache = CanonicalJson()
    variants: list[Any] = [1, 1.0, True, -0.0, 0.0]
    for v in variants * 2:
        msg = Message("user", (TextPart("x", provider_state=ProviderState("anthropic", {"n": v})),))
        inner = ToolSpec("t", parameters={"default": v})
        namespaced = ToolSpec("ns", kind="namespace", tools=(inner,))
        stateful = ToolSpec("s", provider_state=ProviderState("responses", {"n": v}))
        req = ModelRequest("responses", "m", (msg,), tools=(namespaced, stateful))
        assert cache.request(req) == old_text(req)
        assert f'"n":{json.dumps(v)}' in cache.request(req) and f'"default":{json.dumps(v)}' in cache.request(req)


def test_lru_bound_keeps_recent_fragments_and_skips_huge_ones() -> None:
    cache = CanonicalJson(max_chars=8_000)
    msgs = [Message("user", (TextPart(f"{i:04d}" + "x" * 96),)) for i in range(200)]
    cache.fragment(msgs[0])
    for msg in msgs[1:]:
        cache.fragment(msg)
        cache.fragment(msgs[0])  # kept warm: the least recently used entries go first
        assert cache.cached_chars <= 8_000
    assert 0 < len(cache) < 200
    hits = cache.hits
    assert cache.fragment(msgs[0]) == dumps_json(plain(msgs[0])) and cache.hits == hits + 1
    misses = cache.misses
    assert cache.fragment(msgs[1]) == dumps_json(plain(msgs[1])) and cache.misses == misses + 1  # evicted long ago
    huge = Message("user", (TextPart("y" * 2_000),))  # over max_chars / 8: encoded, never cached
    entries, misses = len(cache), cache.misses
    assert cache.fragment(huge) == dumps_json(plain(huge))
    assert cache.fragment(huge) == dumps_json(plain(huge))
    assert len(cache) == entries and cache.misses == misses + 2


class _CountedHashes(tuple):
    hashes = 0

    def __hash__(self) -> int:
        type(self).hashes += 1
        return super().__hash__()


def test_a_value_is_hashed_once_per_fragment() -> None:
    """A message or a tool hashes its whole content each time (no cached hash): a miss (lookup, insert) and a hit
    (lookup, move to the end) hash it once each, not two or three times."""
    cache = CanonicalJson()
    value = _CountedHashes(("a", 1))
    assert cache.fragment(value) == '["a",1]' and _CountedHashes.hashes == 1
    assert cache.fragment(_CountedHashes(("a", 1))) == '["a",1]' and _CountedHashes.hashes == 2
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


def test_unhashable_values_are_encoded_uncached() -> None:
    cache = CanonicalJson()
    assert (
        cache.fragment([TextPart("a"), {"k": (1, 2)}])
        == '[{"provider_state":null,"text":"a","type":"text"},{"k":[1,2]}]'
    )
    assert len(cache) == 0 and cache.misses == 0


def test_threads_sharing_one_cache_get_exact_texts() -> None:
    cache = CanonicalJson(max_chars=40_000)  # small: eviction races with lookups
    sessions = [_session(5, reply=f"r{t}") for t in range(4)]
    expected = {id(req): old_text(req) for s in sessions for req in s}
    wrong: list[str] = []

    def work(reqs: list[ModelRequest], own: str) -> None:
        for _ in range(5):
            for req in reqs:
                # without a session, as this thread's session, and as one session all threads race on
                for session in (None, own, "shared"):
                    if cache.request(req, session) != expected[id(req)]:
                        wrong.append(req.messages[-1].parts[0].type)

    threads = [threading.Thread(target=work, args=(s, f"t{i}")) for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and cache.cached_chars <= 40_000


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1, max_size=4), st.data())
def test_a_session_s_previous_request_gives_exact_texts(reqs: list[ModelRequest], data: st.DataObject) -> None:
    """Calls of one session compared with the previous one position by position: whatever changes between them
    (any message or tool, a 1 that becomes 1.0 in provider state or a schema), each text is the plain text."""
    cache = CanonicalJson()
    for req in reqs:
        # the same request again, with one message or tool swapped for another request's (or kept)
        other = data.draw(requests)
        again = replace(
            req,
            messages=req.messages[:1] + other.messages[:1] + req.messages[1:],
            tools=other.tools[:1] + req.tools[1:],
        )
        for r in (req, again, req):
            assert cache.request(r, session="s") == old_text(r)
            assert cache.request(r, session=str(len(r.messages))) == old_text(r)


@settings(max_examples=200, deadline=None)
@given(requests)
def test_the_layout_names_the_messages_before_the_last_and_the_tools(req: ModelRequest) -> None:
    text, layout = CanonicalJson().request_layout(req, session="s")
    assert text == old_text(req)
    head = text[: text.index('"messages":[') + len('"messages":[')]
    messages = [dumps_json(plain(m)) for m in req.messages]
    before_last = "".join(m + "," for m in messages[:-1])
    assert text[: layout.stable] == head + before_last
    if req.tools:
        assert layout.tools is not None
        assert text[layout.tools[0] : layout.tools[1]] == ",".join(dumps_json(plain(t)) for t in req.tools)
        assert text[layout.tools[1] :] == "]}"  # tools is the last field: nothing after it but the brackets
    else:
        assert layout.tools is None


def test_a_tool_loop_reuses_its_previous_texts_unhashed() -> None:
    cache = CanonicalJson()
    session = _session(6)
    assert cache.request(session[0], session="a") == old_text(session[0])
    assert (cache.reused, cache.misses, cache.sessions_held) == (0, 3, 1)
    for k, req in enumerate(session[1:], start=1):
        reused, hits, misses = cache.reused, cache.hits, cache.misses
        assert cache.request(req, session="a") == old_text(req)
        # the history (2 + 2(k-1) messages) and the tool are the previous call's; the two new messages are encoded
        assert (cache.reused - reused, cache.hits - hits, cache.misses - misses) == (2 * k + 1, 0, 2)
    # another session with the same history finds it in the shared cache, hashed
    hits = cache.hits
    assert cache.request(session[3], session="b") == old_text(session[3]) and cache.hits - hits == 2 * 3 + 3
    assert cache.sessions_held == 2
    cache.forget("a")
    cache.forget("never seen")
    assert cache.sessions_held == 1


def test_values_that_encode_differently_are_not_reused_from_the_previous_request() -> None:
    cache = CanonicalJson()
    for v in [1, 1.0, True, -0.0, 0.0] * 2:
        msg = Message("user", (TextPart("x", provider_state=ProviderState("anthropic", {"n": v})),))
        req = ModelRequest("responses", "m", (msg,), tools=(ToolSpec("t", parameters={"default": v}),))
        text = cache.request(req, session="s")
        assert text == old_text(req)
        assert f'"n":{json.dumps(v)}' in text and f'"default":{json.dumps(v)}' in text
    assert cache.reused == 0


def test_previous_requests_are_bounded_by_max_chars() -> None:
    cache = CanonicalJson(max_chars=20_000)
    session = _session(3)  # the last request's texts hold ~2,300 characters
    for i in range(40):
        assert cache.request(session[i % 3], session=f"s{i}") == old_text(session[i % 3])
        assert cache._recent_chars <= 20_000
    assert 0 < cache.sessions_held < 40
    huge = ModelRequest("chat", "m", (Message("user", (TextPart("y" * 3_000),)),))  # over max_chars / 8
    cache.request(huge, session="s39")
    assert cache.request(huge, session="s39") == old_text(huge)
    assert "s39" not in cache._recent and cache._recent_chars == sum(c for _, c in cache._recent.values())


def test_configuration_and_argument_errors() -> None:
    with pytest.raises(ValueError, match="max_chars must be at least 1"):
        CanonicalJson(max_chars=0)
    with pytest.raises(TypeError, match="needs a dataclass, got dict"):
        CanonicalJson().request({"messages": ()})


def test_plain_matches_asdict_for_completions_and_odd_containers() -> None:
    comp = Completion("r", "m", "hi", "think", (ToolCall("c", "f", "{}"),), "tool_calls", Usage(3, 4, 1, 2), 9)
    assert plain(comp) == _jsonable(asdict(comp))
    value = {1: frozenset({"a"}), "t": (SamplingParams(stop=("x",)),), "l": [None, 2.5]}
    assert plain(value) == {"1": ["a"], "t": [_jsonable(asdict(SamplingParams(stop=("x",))))], "l": [None, 2.5]}
    # plain does not copy leaves (asdict deep-copies every one): the strings are the request's own objects.
    msg = Message("user", (TextPart("z" * 1000),))
    assert plain(msg)["parts"][0]["text"] is msg.parts[0].text


def test_dumps_json_refuses_nan_and_keeps_unicode() -> None:
    assert dumps_json({"b": "é", "a": [1, 2.5]}) == '{"a":[1,2.5],"b":"é"}'
    with pytest.raises(ValueError):
        dumps_json({"x": float("nan")})
    req = replace(_session(1)[0], extras={"bad": float("inf")})
    with pytest.raises(ValueError):
        CanonicalJson().request(req)


# ------------------------------------------------------------------------------------------------ packing


@pytest.mark.parametrize("size", [0, 10, 300, 70_000, 2_000_000])
def test_pack_json_round_trip_at_every_content_size_width(size: int) -> None:
    value = {"text": "x" * size, "n": [1, 2.5, None, "é"]}
    blob = pack_json(value)
    assert blob[:4] == b"\x28\xb5\x2f\xfd"  # a standard zstd frame
    assert unpack_json(blob) == value
    assert pack_json_text(dumps_json(value)) == blob


def test_pack_json_is_a_standard_zstd_frame() -> None:
    """Any zstd decoder reads the column: the zstd tool itself decompresses a blob to the JSON text."""
    out = subprocess.run(["zstd", "-dc"], input=pack_json({"b": [1, 2], "a": "é"}), capture_output=True, check=True)
    assert out.stdout.decode() == '{"a":"é","b":[1,2]}'


def test_unpack_json_rejects_non_zstd() -> None:
    with pytest.raises(ValueError, match="not a zstd frame"):
        unpack_json(b'{"a": 1}')
    with pytest.raises(ValueError, match="not a zstd frame"):
        unpack_json(b"")


@pytest.mark.parametrize("cuts", [[0, 5], [1], [7, 300, 301, 69_999], [250_000]])
def test_concatenated_frames_read_as_their_joined_text(cuts: list[int]) -> None:
    """Several frames of consecutive pieces (what blob_frames writes) read as one blob: here and with zstd -dc."""
    text = dumps_json({"k": ["é x" * 40_000, list(range(9_000))]})
    bounds = [0, *cuts, len(text)]
    blob = b"".join(pack_json_text(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    assert zstd_content_size(blob) == len(text.encode())
    assert unpack_json(blob) == json.loads(text)
    out = subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True)
    assert out.stdout.decode() == text


def test_frame_walk_skips_skippable_frames_and_refuses_truncated_data() -> None:
    one, two = pack_json_text('{"a":'), pack_json_text("[1,2]}")
    skippable = (0x184D2A5E).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    assert unpack_json(skippable + one + skippable + two) == {"a": [1, 2]}
    big = pack_json({"t": "x" * 200_000})  # several blocks
    for cut in (len(big) - 1, len(big) // 2, 9):
        with pytest.raises(ValueError, match="truncated"):
            zstd_content_size(big[:cut])
    with pytest.raises(ValueError, match="not a zstd frame"):
        zstd_content_size(one + b"garbage!")


def test_records_module_still_exports_the_blob_functions() -> None:
    from addon.records import schema as records

    assert records.pack_json is pack_json and records.unpack_json is unpack_json

"""Call records for the record tests: a plain factory and a hypothesis strategy covering every field.

``make_record(i, ...)`` builds a valid record whose fields all differ from their defaults (so a round trip that
dropped any field would fail); ``extend_record(parent, i)`` the next call of its session, whose prompt is the
parent's prompt and answer then new ids (what a tool loop's calls are); ``session_chains(count)`` such calls of
three sessions, interleaved; ``records()`` draws arbitrary valid records with unique call ids.
``tool_loop_requests(calls)`` gives the ``request_canonical`` blobs of a growing tool loop, packed as the generator
packs them (:class:`~addon.records.blob_frames.RequestFrames`: each blob begins with its predecessor's sealed frames).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson
from addon.records.schema import CallRecord, TurnTokens, pack_json
from converters.canonical import WIRE_FORMATS, Message, ModelRequest, TextPart, ToolCallPart, ToolResultPart

T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)


def make_record(
    i: int,
    *,
    run_id: str = "run-1",
    session_id: str = "sess-a",
    prompt_len: int = 64,
    completion_len: int = 16,
    seed: int | None = None,
    **overrides: Any,
) -> CallRecord:
    """A record with every field set; ``seed`` draws random (poorly compressible) token ids."""
    rng = random.Random(i if seed is None else seed)
    prompt = [rng.randrange(0, 150_000) for _ in range(prompt_len)]
    completion = [rng.randrange(0, 150_000) for _ in range(completion_len)]
    logprobs = [-rng.random() * 5 for _ in range(completion_len)]
    fields: dict[str, Any] = {
        "run_id": run_id,
        "session_id": session_id,
        "call_index": i,
        "call_id": f"{run_id}/{session_id}/call-{i}",
        "harness": "claude-code",
        "harness_version": "2.0.1",
        "wire_format": "anthropic",
        "route": "/v1/messages",
        "model": "claude-sonnet-4-5",
        "served_model": "smollm2-135m",
        "policy_version": 7 + i,
        "received_at": T0 + timedelta(seconds=i),
        "first_token_at": T0 + timedelta(seconds=i, milliseconds=120),
        "done_at": T0 + timedelta(seconds=i, milliseconds=900),
        "tokens": TurnTokens(tuple(prompt), tuple(completion), tuple(logprobs)),
        "finish_reason": "tool_calls",
        "tool_call_names": ("Bash", "Read"),
        "auxiliary": True,
        "auxiliary_reason": "title generation",
        "sampling_requested": {"temperature": 1.0, "max_tokens": 32000},
        "sampling_applied": {"temperature": 1.0, "max_tokens": 4096, "seed": i},
        "request_canonical": pack_json({"messages": [{"role": "user", "text": f"list files {i}"}]}),
        "completion_canonical": pack_json({"text": "ok", "tool_calls": 2}),
        "error": None,
        "budget_stop": "max_calls",
        "incomplete": True,
        "identity_hints": {"x-claude-code-session-id": f"cc-{session_id}"},
        "parent_call_id": f"{run_id}/{session_id}/call-{i - 1}" if i else None,
        "fork_reason": "compaction" if i else None,
        "prompt_reused_tokens": min(prompt_len, 10),
    }
    fields.update(overrides)
    return CallRecord(**fields)


def extend_record(parent: CallRecord, i: int, *, new_len: int = 50, **overrides: Any) -> CallRecord:
    """Call ``i`` of ``parent``'s session: its prompt is ``parent``'s prompt + completion, then ``new_len`` new ids
    (``parent_call_id`` and ``prompt_reused_tokens`` say so)."""
    own = make_record(i, run_id=parent.run_id, session_id=parent.session_id, prompt_len=new_len)
    seq = (*parent.tokens.prompt_ids, *parent.tokens.completion_ids)
    tokens = TurnTokens((*seq, *own.tokens.prompt_ids), own.tokens.completion_ids, own.tokens.completion_logprobs)
    fields: dict[str, Any] = {"parent_call_id": parent.call_id, "prompt_reused_tokens": len(seq), "fork_reason": None}
    return replace(own, tokens=tokens, **(fields | overrides))


def tool_loop_requests(calls: int, session: str = "s", result_chars: int = 6000) -> Iterator[bytes]:
    """The request blobs of ``calls`` calls of one tool loop: call k's history is call k-1's plus a tool call and a
    ~``result_chars`` tool result (each different), packed by one :class:`RequestFrames` for ``session``."""
    frames, json_cache = RequestFrames(seal_chars=16 << 10), CanonicalJson()
    rng = random.Random(session)
    history = [Message("system", (TextPart("Work in the repository. " * 200),)), Message("user", (TextPart("fix"),))]
    for k in range(calls):
        text, layout = json_cache.request_layout(ModelRequest("anthropic", "m", tuple(history)), session)
        yield frames.pack(text, layout, session)
        lines = "".join(f"{rng.randrange(10**9)} line {i} of file {k}\n" for i in range(result_chars // 30))
        history.append(Message("assistant", (ToolCallPart(f"c{k}", "read", f'{{"path": "f{k}.py"}}'),)))
        history.append(Message("tool", (ToolResultPart(f"c{k}", (TextPart(lines),)),)))


def session_chains(count: int, sessions: int = 3, prompt_len: int = 2000) -> Iterator[CallRecord]:
    """Records ``0 .. count-1``: record ``i`` is the next call of session ``s{i % sessions}`` (its first: a
    ``make_record`` of ``prompt_len`` ids, with no parent)."""
    root: dict[str, Any] = {"parent_call_id": None, "fork_reason": None, "prompt_reused_tokens": 0}
    last: dict[str, CallRecord] = {}
    for i in range(count):
        session = f"s{i % sessions}"
        record = (
            extend_record(last[session], i)
            if session in last
            else make_record(i, session_id=session, prompt_len=prompt_len, **root)
        )
        last[session] = record
        yield record


_text = st.text(min_size=1, max_size=12)
_opt_text = st.none() | st.text(max_size=12)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_mapping = st.dictionaries(st.text(max_size=8), _json_value, max_size=4)


@st.composite
def records(draw: st.DrawFn, call_id: str, run_id: str = "run-p") -> CallRecord:
    """Any valid record of run ``run_id`` with id ``call_id`` (the caller keeps ids unique)."""
    prompt = draw(st.lists(st.integers(0, 2**31 - 1), max_size=40))
    n = draw(st.integers(0, 12))
    completion = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
    logprobs = draw(st.lists(st.floats(max_value=0.0, allow_nan=False, width=32), min_size=n, max_size=n))
    offset = timezone(timedelta(minutes=draw(st.integers(-600, 600))))
    received = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=draw(st.integers(0, 10**12)))
    first = received + timedelta(microseconds=draw(st.integers(0, 10**7)))
    done = first + timedelta(microseconds=draw(st.integers(0, 10**7)))
    auxiliary = draw(st.booleans())
    parent = draw(_opt_text)
    return CallRecord(
        run_id=run_id,
        session_id=draw(st.sampled_from(["s1", "s2", "s3"])),
        call_index=draw(st.integers(0, 2**31 - 1)),
        call_id=call_id,
        harness=draw(_text),
        harness_version=draw(_opt_text),
        wire_format=draw(st.sampled_from(WIRE_FORMATS)),
        route=draw(_text),
        model=draw(_text),
        served_model=draw(_opt_text),
        policy_version=draw(st.none() | st.integers(0, 2**63 - 1)),
        received_at=received.astimezone(offset),
        first_token_at=draw(st.none() | st.just(first)),
        done_at=done,
        tokens=TurnTokens(tuple(prompt), tuple(completion), tuple(logprobs)),
        finish_reason=draw(st.none() | st.sampled_from(["stop", "length", "tool_calls", "content_filter", "error"])),
        tool_call_names=tuple(draw(st.lists(_text, max_size=3))),
        auxiliary=auxiliary,
        auxiliary_reason=draw(_text) if auxiliary else None,
        sampling_requested=draw(_mapping),
        sampling_applied=draw(_mapping),
        request_canonical=draw(st.binary(max_size=30)),
        completion_canonical=draw(st.none() | st.binary(max_size=30)),
        error=draw(_opt_text),
        budget_stop=draw(_opt_text),
        incomplete=draw(st.booleans()),
        identity_hints=draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)),
        parent_call_id=parent,
        fork_reason=draw(_opt_text) if parent is not None else None,
        prompt_reused_tokens=draw(st.integers(0, len(prompt))),
    )

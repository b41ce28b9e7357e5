"""addon/generation/recording.py: a row built from its prelude equals the row built in one go."""

from __future__ import annotations

import math
from array import array
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.generation.recording import CallInfo, Turn, build_record, prelude
from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson, unpack_json
from addon.records.schema import TurnTokens, to_batch
from converters.base import Route
from converters.canonical import (
    Completion,
    JsonSchemaFormat,
    Message,
    ModelRequest,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolSpec,
    Usage,
)

TOOL = ToolSpec("Bash", "Run a command.", {"type": "object", "properties": {"cmd": {"type": "string"}}})


def _turn(i: int, prompt, completion_ids, logprobs, **request) -> Turn:
    msgs = (Message("system", (TextPart("be brief"),)), Message("user", (TextPart(f"step {i}"),)))
    req = ModelRequest("anthropic", "claude", msgs, **request)
    info = CallInfo("run", "s", Route("anthropic", "/v1/messages"), {}, datetime.now(UTC), call_id=f"c{i}")
    return Turn(req, info, i, prompt_ids=prompt, completion_ids=list(completion_ids), logprobs=list(logprobs))


@pytest.mark.parametrize("packed", [False, True])
def test_a_row_built_from_its_prelude_equals_the_row_built_in_one_go(packed):
    cache = CanonicalJson()
    ids = list(range(3, 4000))
    prompt = array("i", ids) if packed else tuple(ids)
    turn = _turn(1, prompt, [7, 8, 9], [-0.5, -1.0, -2.0], tools=(TOOL,), sampling=SamplingParams(temperature=0.3))
    completion = Completion("r", "claude", "ok", tool_calls=(ToolCall("t", "Bash", "{}"),), usage=Usage(1, 3))

    ahead = prelude(turn.request, turn.prompt_ids, cache)
    assert ahead.tokens.completion_ids == () and ahead.tokens.prompt_ids == tuple(ids)
    assert ahead.sampling_requested["temperature"] == 0.3
    two_halves = build_record(turn, completion, "served", None, cache, ahead)
    one_go = build_record(turn, completion, "served", None)
    assert two_halves == replace(one_go, done_at=two_halves.done_at)
    assert unpack_json(two_halves.request_canonical) == unpack_json(one_go.request_canonical)
    # a sampled token without a logprob (NaN) stays NaN through the two halves
    nan = build_record(replace(turn, logprobs=[-0.5, float("nan"), -2.0]), completion, "served", None, cache, ahead)
    assert math.isnan(nan.tokens.completion_logprobs[1])
    # the packed halves make the same Arrow row as a row built from plain tuples
    assert to_batch([two_halves]).column("prompt_ids").equals(to_batch([one_go]).column("prompt_ids"))
    assert to_batch([two_halves]).column("completion_ids").to_pylist() == [[7, 8, 9]]


def test_the_prelude_marks_a_side_request_and_keeps_identity_hints():
    turn = _turn(0, (1, 2), (), (), output_format=JsonSchemaFormat({"type": "object"}, "t"))
    ahead = prelude(turn.request, turn.prompt_ids, None)
    assert ahead.auxiliary_reason == "structured_output"
    row = build_record(turn, None, "served", "budget", prepared=ahead)
    assert row.auxiliary and row.auxiliary_reason == "structured_output" and row.budget_stop == "budget"
    assert row.completion_canonical is None and row.tokens.completion_ids == ()


def test_with_request_frames_the_blob_holds_the_same_request_in_several_frames():
    cache, frames = CanonicalJson(), RequestFrames(seal_chars=1)
    long = Message("user", (TextPart("a long first message " * 400),))
    turn = _turn(1, (1, 2), (), (), tools=(TOOL,))
    turn = replace(turn, request=replace(turn.request, messages=(long, *turn.request.messages)))
    framed = prelude(turn.request, turn.prompt_ids, cache, "s", frames)
    whole = prelude(turn.request, turn.prompt_ids, None)
    assert framed.request_canonical != whole.request_canonical  # the history's segment is a frame of its own
    assert unpack_json(framed.request_canonical) == unpack_json(whole.request_canonical)
    assert len(frames) == 1 and frames.compressed >= 2
    # a side request is neither compared with the session's previous one nor held: one frame, as without frames
    side = replace(turn.request, output_format=JsonSchemaFormat({"type": "object"}, "t"), tools=())
    assert prelude(side, (1, 2), cache, "s", frames).request_canonical == prelude(side, (1, 2), None).request_canonical


def test_the_prelude_refuses_what_the_row_would():
    with pytest.raises(ValueError, match="prompt_ids"):
        prelude(_turn(0, (1, -2), (), ()).request, (1, -2), None)


def test_with_completion_checks_the_sampled_part_as_the_constructor_does():
    head = TurnTokens((1, 2, 3))
    with pytest.raises(ValueError, match="exactly one logprob"):
        head.with_completion([4, 5], [-0.1])
    with pytest.raises(ValueError, match="completion_ids"):
        head.with_completion([-4], [-0.1])
    with pytest.raises(ValueError, match="float32"):
        head.with_completion([4], ["x"])  # type: ignore[list-item]
    assert head.completion_ids == ()  # the head itself is not changed


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50),
    completion=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.floats(-50, 0)), max_size=20),
    packed=st.booleans(),
)
def test_with_completion_equals_building_the_whole(prompt, completion, packed):
    ids = [c[0] for c in completion]
    lps = [c[1] for c in completion]
    head = TurnTokens(array("i", prompt) if packed else tuple(prompt))  # type: ignore[arg-type]
    whole = TurnTokens(tuple(prompt), tuple(ids), tuple(lps))
    joined = head.with_completion(ids, lps)
    assert joined == whole
    assert all(a.equals(b) for a, b in zip(joined.arrow(), whole.arrow(), strict=True))

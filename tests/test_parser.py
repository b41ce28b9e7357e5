"""Tests for addon.generation.parser: every fixture fed whole, at every split point, char by char and at random
splits."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from addon.generation.parser import CallKind, OutputParser, ParserSpec, parse_tool_calls, seeded_call_ids
from converters.canonical import (
    Finish,
    FinishReason,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
)

TOOLS: dict[str, CallKind] = {"shell": "function", "read_file": "function", "exec": "custom"}
USAGE = Usage(prompt_tokens=10, completion_tokens=5)
IDS = seeded_call_ids("test")


def merged(events: Sequence[StreamEvent]) -> list[StreamEvent]:
    """Adjacent text deltas and adjacent reasoning deltas joined: the split-independent view of a stream."""
    out: list[StreamEvent] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + ev.text)
        elif isinstance(ev, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + ev.text)
        else:
            out.append(ev)
    return out


def run(
    chunks: Sequence[str],
    reason: FinishReason = "stop",
    allowed: dict[str, CallKind] | None = TOOLS,
    spec: ParserSpec | None = None,
) -> tuple[list[StreamEvent], OutputParser]:
    parser = OutputParser(spec, allowed=allowed, call_ids=IDS)
    events: list[StreamEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish(reason, USAGE))
    return events, parser


def call(index: int, name: str, arguments: str, kind: CallKind = "function") -> list[StreamEvent]:
    return [ToolCallStarted(index, IDS(index), name, kind), ToolCallDelta(index, arguments), ToolCallEnded(index)]


@dataclass(frozen=True)
class Case:
    text: str
    events: list[StreamEvent]
    malformed: int = 0
    reason: FinishReason = "stop"


MALFORMED_SPAN = '<tool_call>{"name": "shell", "arguments": {</tool_call>'
UNKNOWN_SPAN = '<tool_call>\n{"name": "rm_everything", "arguments": {}}\n</tool_call>'

CASES: dict[str, Case] = {
    "plain": Case("Hello, world! Two\nlines.", [TextDelta("Hello, world! Two\nlines."), Finish("stop", USAGE)]),
    "reasoning_text_calls": Case(
        "<think>\nThe user wants the files.\n</think>\n\nI will list them.\n"
        '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls -la"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}\n</tool_call>\n',
        [
            ReasoningDelta("The user wants the files."),
            TextDelta("I will list them."),
            *call(0, "shell", '{"cmd":"ls -la"}'),
            *call(1, "read_file", '{"path":"a.py"}'),
            Finish("tool_calls", USAGE),
        ],
    ),
    "malformed_json": Case(
        f"Try: {MALFORMED_SPAN} done",
        [TextDelta(f"Try:{MALFORMED_SPAN}done"), Finish("stop", USAGE)],
        malformed=1,
    ),
    "unknown_tool": Case(UNKNOWN_SPAN, [TextDelta(UNKNOWN_SPAN), Finish("stop", USAGE)], malformed=1),
    "unclosed_call": Case(
        'Calling <tool_call>{"name": "shell", "argu',
        [TextDelta('Calling<tool_call>{"name": "shell", "argu'), Finish("stop", USAGE)],
        malformed=1,
    ),
    "unclosed_think": Case(
        "<think>still weighing it up ", [ReasoningDelta("still weighing it up"), Finish("stop", USAGE)]
    ),
    "partial_tag_at_end": Case("a <too", [TextDelta("a <too"), Finish("stop", USAGE)]),
    "lookalike_tags": Case(
        "if a<b, <thinking> and <tool> stay text </think",
        [TextDelta("if a<b, <thinking> and <tool> stay text </think"), Finish("stop", USAGE)],
    ),
    "array_of_calls": Case(
        '<tool_call>[{"name": "shell", "arguments": {"cmd": "pwd"}}, {"name": "shell"}]</tool_call>',
        [*call(0, "shell", '{"cmd":"pwd"}'), *call(1, "shell", "{}"), Finish("tool_calls", USAGE)],
    ),
    "custom_tool": Case(
        '<tool_call>{"name": "exec", "arguments": {"input": "print(1)\\n"}}</tool_call>'
        '<tool_call>{"name": "exec", "arguments": "x = 2"}</tool_call>',
        [*call(0, "exec", "print(1)\n", "custom"), *call(1, "exec", "x = 2", "custom"), Finish("tool_calls", USAGE)],
    ),
    "tool_tags_inside_think_are_reasoning": Case(
        '<think>maybe <tool_call>{"name": "shell"}</tool_call>?</think>No call.',
        [
            ReasoningDelta('maybe <tool_call>{"name": "shell"}</tool_call>?'),
            TextDelta("No call."),
            Finish("stop", USAGE),
        ],
    ),
    "call_then_text_unicode": Case(
        'héllo 🌍 <tool_call>{"name": "shell", "arguments": {"cmd": "echo ü"}}</tool_call>\nfertig ✓',
        [
            TextDelta("héllo 🌍"),
            *call(0, "shell", '{"cmd":"echo ü"}'),
            TextDelta("fertig ✓"),
            Finish("tool_calls", USAGE),
        ],
    ),
    "length_keeps_reason": Case(
        '<tool_call>{"name": "shell", "arguments": {}}</tool_call> and then',
        [*call(0, "shell", "{}"), TextDelta("and then"), Finish("length", USAGE)],
        reason="length",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_whole_every_split_and_char_by_char(name: str) -> None:
    case = CASES[name]
    whole, parser = run([case.text], case.reason)
    assert merged(whole) == case.events
    assert parser.malformed_tool_calls == case.malformed
    for i in range(len(case.text) + 1):
        split, _ = run([case.text[:i], case.text[i:]], case.reason)
        assert merged(split) == case.events, f"split at {i}"
    by_char, parser = run(list(case.text), case.reason)
    assert merged(by_char) == case.events
    assert parser.malformed_tool_calls == case.malformed


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(CASES)), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_fixture_any_split(name: str, cuts: list[int]) -> None:
    case = CASES[name]
    points = sorted({c % (len(case.text) + 1) for c in cuts})
    chunks = [case.text[a:b] for a, b in zip([0, *points], [*points, len(case.text)], strict=True)]
    events, _ = run(chunks, case.reason)
    assert merged(events) == case.events


FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<",
    "</",
    "<thi",
    "<tool",
    "</tool_c",
    " ",
    "\n",
    "word",
    "é🌍",
    '{"name": "shell", "arguments": {"cmd": "ls"}}',
    '{"name": "nope"}',
    "{",
]


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=10),
)
def test_generated_text_any_split_same_events(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    points = sorted({c % (len(text) + 1) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    whole, p1 = run([text])
    split, p2 = run(chunks)
    assert merged(split) == merged(whole)
    assert p1.state.malformed == p2.state.malformed


def test_text_streams_at_once_and_partial_tags_are_held() -> None:
    parser = OutputParser(allowed=TOOLS, call_ids=IDS)
    assert parser.feed("Hello") == [TextDelta("Hello")]
    assert parser.feed(" <too") == []  # could be "<tool_call>": held, with the space before it
    assert parser.feed("l") == []
    assert parser.feed("box> next") == [TextDelta(" <toolbox> next")]
    assert parser.feed("\n\n") == []  # trailing whitespace waits for what follows
    assert parser.feed("more") == [TextDelta("\n\nmore")]


def test_tool_call_is_buffered_until_closed() -> None:
    parser = OutputParser(allowed=TOOLS, call_ids=IDS)
    assert parser.feed('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_ca') == []
    events = parser.feed("ll>")
    assert events == call(0, "shell", '{"cmd":"ls"}')
    assert parser.tool_calls == 1
    assert parser.finish("stop", USAGE) == [Finish("tool_calls", USAGE)]


def test_reasoning_streams_and_stops_at_close_tag() -> None:
    parser = OutputParser(allowed=TOOLS, call_ids=IDS)
    assert parser.feed("<think>") == []
    assert parser.feed("step one") == [ReasoningDelta("step one")]
    assert parser.feed("</thi") == []
    assert parser.feed("nk>Answer") == [TextDelta("Answer")]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not JSON"),
        ('{"arguments": {}}', "no string name"),
        ('{"name": 3}', "no string name"),
        ('{"name": "shell", "arguments": [1]}', "not an object"),
        ('{"name": "shell", "arguments": "{bad"}', "not JSON"),
        ('{"name": "shell", "arguments": "[1, 2]"}', "not an object"),
        ('{"name": "exec", "arguments": {"code": "x"}}', "string input"),
        ('{"name": "ghost", "arguments": {}}', "unknown tool 'ghost'"),
        ("[]", "empty list"),
        ('[{"name": "shell"}, 5]', "not an object"),
    ],
)
def test_malformed_bodies_are_text_and_flagged(body: str, reason: str) -> None:
    assert reason in str(parse_tool_calls(body, TOOLS))
    raw = f"<tool_call>{body}</tool_call>"
    events, parser = run([raw])
    assert merged(events) == [TextDelta(raw), Finish("stop", USAGE)]
    assert parser.malformed_tool_calls == 1
    assert parser.malformed[0].raw == raw
    assert reason in parser.malformed[0].reason


def test_no_tools_offered_means_every_call_is_flagged() -> None:
    raw = '<tool_call>{"name": "shell", "arguments": {}}</tool_call>'
    events, parser = run([raw], allowed={})
    assert merged(events) == [TextDelta(raw), Finish("stop", USAGE)]
    assert parser.malformed_tool_calls == 1


def test_without_allow_list_any_name_is_a_function_call() -> None:
    events, _ = run(['<tool_call>{"name": "anything", "arguments": {"a": [1, 2]}}</tool_call>'], allowed=None)
    assert merged(events) == [*call(0, "anything", '{"a":[1,2]}'), Finish("tool_calls", USAGE)]


def test_arguments_are_compact_json_with_unicode_kept() -> None:
    events, _ = run(['<tool_call>{"name": "shell", "arguments": {"cmd": "echo \\u00fc",  "n": 1.5}}</tool_call>'])
    delta = next(e for e in events if isinstance(e, ToolCallDelta))
    assert delta.arguments == '{"cmd":"echo ü","n":1.5}'
    assert json.loads(delta.arguments) == {"cmd": "echo ü", "n": 1.5}


def test_call_ids_are_seeded_and_distinct() -> None:
    ids = [IDS(i) for i in range(50)]
    assert len(set(ids)) == 50
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)
    assert seeded_call_ids("test")(3) == IDS(3)
    assert seeded_call_ids("other")(3) != IDS(3)
    # Two parsers without an injected source do not share ids.
    a, b = OutputParser(allowed=TOOLS), OutputParser(allowed=TOOLS)
    assert a.config.call_ids(0) != b.config.call_ids(0)


def test_custom_spec_tags() -> None:
    spec = ParserSpec(think_open="[THINK]", think_close="[/THINK]", tool_open="[CALL]", tool_close="[/CALL]")
    text = '[THINK]plan[/THINK]Done. [CALL]{"name": "shell", "arguments": {}}[/CALL]'
    for chunks in ([text], list(text)):
        events, _ = run(chunks, spec=spec)
        assert merged(events) == [
            ReasoningDelta("plan"),
            TextDelta("Done."),
            *call(0, "shell", "{}"),
            Finish("tool_calls", USAGE),
        ]


@pytest.mark.parametrize(
    "tags",
    [("", "</think>", "<a>", "</a>"), ("<a>", "<a>", "<b>", "</b>"), (" <a>", "</a>", "<b>", "</b>")],
)
def test_spec_rejects_bad_tags(tags: tuple[str, str, str, str]) -> None:
    with pytest.raises(ValueError):
        ParserSpec(*tags)


def test_feed_after_finish_and_double_finish_raise() -> None:
    parser = OutputParser(allowed=TOOLS, call_ids=IDS)
    parser.finish("stop", USAGE)
    with pytest.raises(ValueError):
        parser.feed("x")
    with pytest.raises(ValueError):
        parser.finish("stop", USAGE)

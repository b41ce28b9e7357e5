"""converters/delta.py: a session's request decoded and parsed in O(what is new), never differently.

The property: for any chain of requests (a conversation growing, edited, truncated, reformatted, broken), parsing
each with the previous call's memo gives exactly what parsing it alone gives (the same request, or the same error),
and the items before the first changed byte are reused, as the very objects parsed before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dialects import ROUTES, conversations

from converters import WIRE_FORMATS, dialect_for
from converters.canonical import ConversionError, Message, ModelRequest
from converters.delta import REUSED, ListMemo, ListReuse, same_objects

KEYS = {"chat": "messages", "responses": "input", "anthropic": "messages", "gemini": "contents"}
STYLES = {
    "compact": {"separators": (",", ":")},
    "spaced": {},
    "indented": {"indent": 2},
    "ascii": {"ensure_ascii": True, "separators": (", ", ": ")},
}


def wire(fmt: str, request: ModelRequest) -> dict[str, Any]:
    return dialect_for(fmt).render_request(request)


def encode(body: dict[str, Any], style: str = "compact") -> bytes:
    return json.dumps(body, **({"ensure_ascii": False} | STYLES[style])).encode()


def parse(fmt: str, body: bytes, reuse: ListReuse | None = None) -> ModelRequest | str:
    try:
        return dialect_for(fmt).parse_request(body, ROUTES[fmt], reuse=reuse)
    except ConversionError as e:
        return f"{e.kind}: {e.message}"


def chain(fmt: str, bodies: list[bytes]) -> list[tuple[ListReuse, ModelRequest | str]]:
    """Each body parsed with the memo the previous successful one left, as the generator does."""
    memo: ListMemo | None = None
    out = []
    for body in bodies:
        reuse = ListReuse(memo)
        got = parse(fmt, body, reuse)
        if isinstance(got, ModelRequest):
            memo = reuse.memo()
        out.append((reuse, got))
    return out


def grown(fmt: str, request: ModelRequest) -> list[dict[str, Any]]:
    """The request's wire body cut after each item of its conversation list: a session's calls."""
    body = wire(fmt, request)
    items = body[KEYS[fmt]]
    return [body | {KEYS[fmt]: items[:n]} for n in range(1, len(items) + 1)]


@pytest.mark.parametrize("fmt", WIRE_FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=conversations(), style=st.sampled_from(sorted(STYLES)), data=st.data())
def test_a_growing_session_parses_as_each_body_alone(fmt: str, request: ModelRequest, style: str, data) -> None:
    bodies = [encode(b, style) for b in grown(fmt, request)]
    results = chain(fmt, bodies)
    for i, (body, (reuse, got)) in enumerate(zip(bodies, results, strict=True)):
        assert got == parse(fmt, body)
        if i and isinstance(got, ModelRequest) and isinstance(results[i - 1][1], ModelRequest):
            assert reuse.reused == i  # every item of the previous call
            # and every message of it is the very same object, but its last (the new item may extend that one: a
            # Responses assistant turn joined from several items); the session graph goes by identity
            before = results[i - 1][1].messages
            assert same_objects(before, got.messages) >= len(before) - 1
    last, previous = results[-1], results[-2] if len(results) > 1 else None
    if previous is not None and isinstance(last[1], ModelRequest) and isinstance(previous[1], ModelRequest):
        memo = previous[0].memo()
        assert memo is not None
        assert all(a is b for a, b in zip(last[0].memo().results, memo.results, strict=False))  # type: ignore[union-attr]
        assert last[1].tools and all(a is b for a, b in zip(last[1].tools, previous[1].tools, strict=True))


def _mutate(data, fmt: str, body: dict[str, Any]) -> dict[str, Any]:
    """One of the changes a harness makes between calls: an item edited, dropped or inserted, a field before or
    after the list changed or reordered, the list emptied or replaced by junk."""
    key = KEYS[fmt]
    items = list(body[key]) if isinstance(body[key], list) else []
    kind = data.draw(st.sampled_from(["edit", "drop", "insert", "field", "reorder", "empty", "junk", "number"]))
    i = data.draw(st.integers(0, max(0, len(items) - 1)))
    if kind == "edit" and items:
        items[i] = json.loads(json.dumps(items[i]).replace("a", "b", 1)) if "a" in json.dumps(items[i]) else {}
    elif kind == "drop" and items:
        del items[i]
    elif kind == "insert":
        items.insert(i, items[-1] if items else {})
    elif kind == "field":
        return body | {key: items, "zz_extra": data.draw(st.integers(0, 3)), "model": "other"}
    elif kind == "reorder":
        return {key: items} | {k: v for k, v in body.items() if k != key}
    elif kind == "empty":
        items = []
    elif kind == "junk":
        return body | {key: data.draw(st.sampled_from(["text", 7, None, {"a": 1}]))}
    elif kind == "number":
        items.append(data.draw(st.sampled_from([1, 1.5, True, "x", [1]])))
    return body | {key: items}


@pytest.mark.parametrize("fmt", WIRE_FORMATS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=conversations(), style=st.sampled_from(sorted(STYLES)), data=st.data())
def test_any_change_between_calls_parses_as_the_body_alone(fmt: str, request: ModelRequest, style: str, data) -> None:
    bodies = grown(fmt, request)
    for _ in range(data.draw(st.integers(1, 4))):
        bodies.append(_mutate(data, fmt, bodies[-1]))
    raw = [encode(b, data.draw(st.sampled_from([style, "compact"]))) for b in bodies]
    key = KEYS[fmt]
    for body, (reuse, got) in zip(raw, chain(fmt, raw), strict=True):
        assert got == parse(fmt, body)
        if reuse.reused:  # never more than the items the two bodies share, in order, from the first
            assert reuse.previous is not None
            before, now = json.loads(reuse.previous.body)[key], json.loads(body)[key]
            pairs = enumerate(zip(before, now, strict=False))
            same = next((n for n, (a, b) in pairs if a != b), min(len(before), len(now)))
            assert reuse.reused <= same


def test_items_after_the_first_changed_byte_are_parsed_again() -> None:
    messages = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    first = json.dumps({"model": "m", "messages": messages}).encode()
    second = json.dumps({"model": "m", "messages": messages[:2] + [{"role": "user", "content": "new"}]}).encode()
    one, two = ListReuse(), None
    parse("chat", first, one)
    two = ListReuse(one.memo())
    got = parse("chat", second, two)
    assert two.reused == 2
    assert isinstance(got, ModelRequest)
    assert [m.text for m in got.messages] == ["m0", "m1", "new"]
    assert got.messages[0] is one.memo().results[0]  # type: ignore[union-attr]


def test_a_number_item_that_goes_on_is_not_taken_for_the_same() -> None:
    # [.., 1] then [.., 1.5]: the bytes up to the first item's end agree, the item does not
    one = ListReuse()
    one.load(b'{"messages":[1]}', "messages", "test")
    one.items([1], lambda item, i: item)
    two = ListReuse(one.memo())
    obj = two.load(b'{"messages":[1.5]}', "messages", "test")
    assert two.reused == 0 and obj["messages"] == [1.5]


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}',  # duplicate
        b'{"mess\\u0061ges":[{"role":"user","content":"a"}]}',  # an escaped key
        b'{"messages":[{"role":"user","content":"a"}]} ',
        b' \n{ "messages" :\n[ {"role":"user","content":"a"} ] }\n',
    ],
)
def test_an_unusual_layout_decodes_as_the_standard_decoder_does(body: bytes) -> None:
    reuse = ListReuse()
    obj = reuse.load(body, "messages", "test")
    assert obj == json.loads(body)
    reuse.items(obj.get("messages", []), lambda item, i: item)
    memo = reuse.memo()
    if b"\\u0061" in body or body.count(b'"messages"') > 1:
        assert memo is None  # what cannot be verified is not compared with later
    else:
        assert memo is not None and memo.ends[-1] == body.index(b"}", body.index(b"{", 2)) + 1


@pytest.mark.parametrize(
    "second",
    [
        b'{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]',  # cut short
        b'{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":NaN}]}',
        b'{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"\\ud800"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"a"}],"model":"x","model":"y"}',
        b'{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[]}',
        b'{"model":"m","messages":[{"role":"user","content":"a"}] trailing',
    ],
)
def test_a_broken_body_after_a_good_one_fails_as_it_does_alone(second: bytes) -> None:
    first = b'{"model":"m","messages":[{"role":"user","content":"a"}]}'
    one = ListReuse()
    assert isinstance(parse("chat", first, one), ModelRequest)
    two = ListReuse(one.memo())
    assert parse("chat", second, two) == parse("chat", second)


def test_tools_are_parsed_again_when_their_bytes_change() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}], "tools": [tool]}
    one = ListReuse()
    first = parse("chat", json.dumps(body).encode(), one)
    changed = body | {"tools": [tool | {"function": tool["function"] | {"description": "new"}}]}
    two = ListReuse(one.memo())
    second = parse("chat", json.dumps(changed).encode(), two)
    assert isinstance(first, ModelRequest) and isinstance(second, ModelRequest)
    assert second.tools[0].description == "new" and second.tools[0] is not first.tools[0]
    three = ListReuse(two.memo())
    third = parse("chat", json.dumps(changed).encode(), three)
    assert isinstance(third, ModelRequest) and third.tools[0] is second.tools[0]


def test_unchanged_fields_keep_their_decoded_values_and_changed_ones_are_decoded() -> None:
    def body(temperature: float) -> bytes:
        return json.dumps(
            {"system": [{"x": 1}], "messages": [{"role": "user"}], "tools": [{"a": 1}], "temperature": temperature}
        ).encode()

    one = ListReuse()
    first = one.load(body(0.5), "messages", "test")
    one.items(first["messages"], lambda item, i: item)
    two = ListReuse(one.memo())
    second = two.load(body(0.7), "messages", "test")
    assert two.reused == 1 and second == json.loads(body(0.7)) | {"messages": [REUSED]}
    assert list(second) == ["system", "messages", "tools", "temperature"]  # the body's own order
    assert second["system"] is first["system"] and second["tools"] is first["tools"]
    assert second["temperature"] == 0.7


def test_a_memo_is_not_reused_by_another_format() -> None:
    # the same bytes are a Chat and an Anthropic message list; each format parses them its own way
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [tool_use]}]}
    chat = ListReuse()
    assert isinstance(parse("chat", json.dumps(body).encode(), chat), str)  # a tool_use block is not Chat
    first = ListReuse()
    assert isinstance(parse("anthropic", json.dumps(body).encode(), first), ModelRequest)
    again = body | {"messages": body["messages"] + [{"role": "user", "content": "next"}]}
    second = ListReuse(first.memo())
    assert parse("chat", json.dumps(again).encode(), second) == parse("chat", json.dumps(again).encode())
    assert second.reused == 0


def test_a_mapping_body_is_taken_as_it_is() -> None:
    reuse = ListReuse()
    body = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    assert reuse.load(body, "messages", "test") is body
    assert reuse.memo() is None


def test_reused_items_are_placeholders_until_parsed() -> None:
    one = ListReuse()
    one.items(one.load(b'{"input":[{"type":"message","role":"user","content":"a"}]}', "input", "test")["input"], _tag)
    two = ListReuse(one.memo())
    obj = two.load(b'{"input":[{"type":"message","role":"user","content":"a"}, {"x": 1}]}', "input", "test")
    assert obj["input"] == [REUSED, {"x": 1}]
    assert two.items(obj["input"], _tag) == [("parsed", 0), ("parsed", 1)]


def _tag(item: Any, i: int) -> tuple[str, int]:
    assert item is not REUSED
    return ("parsed", i)


def test_an_auxiliary_list_key_gives_no_memo() -> None:
    reuse = ListReuse()
    obj = reuse.load(b'{"input":"just text"}', "input", "test")
    assert obj == {"input": "just text"}
    assert reuse.memo() is None
    assert isinstance(parse("responses", b'{"model":"m","input":"hi"}', reuse), ModelRequest)


def test_memo_results_are_messages_for_each_format() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    reuse = ListReuse()
    parse("chat", json.dumps(body).encode(), reuse)
    memo = reuse.memo()
    assert memo is not None and isinstance(memo.results[0], Message) and memo.key == "messages"


SYSTEM_BODIES = {
    "anthropic": lambda system, n: {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": system}],
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)],
    },
    "responses": lambda system, n: {
        "model": "m",
        "instructions": system,
        "input": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(n)],
    },
    "gemini": lambda system, n: {
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": [{"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"m{i}"}]} for i in range(n)],
    },
    "gemini-snake": lambda system, n: {
        "system_instruction": {"parts": [{"text": system}]},
        "contents": [{"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"m{i}"}]} for i in range(n)],
    },
}


@pytest.mark.parametrize("variant", sorted(SYSTEM_BODIES))
def test_an_unchanged_system_prompt_is_the_previous_calls_message_object(variant: str) -> None:
    # The session graph keeps one copy of a session's history by identity (addon.generation.session_graph): a
    # system prompt parsed anew each call made it walk every node of the session on every call.
    fmt, make = variant.split("-")[0], SYSTEM_BODIES[variant]
    bodies = [json.dumps(make("be brief", 1)), json.dumps(make("be brief", 3)), json.dumps(make("be verbose", 5))]
    results = chain(fmt, [b.encode() for b in bodies])
    (_, first), (_, second), (_, third) = results
    assert isinstance(first, ModelRequest) and isinstance(second, ModelRequest) and isinstance(third, ModelRequest)
    assert first.messages[0].role == "system" and first.messages[0].text == "be brief"
    assert all(a is b for a, b in zip(first.messages, second.messages[: len(first.messages)], strict=True))
    assert third.messages[0].text == "be verbose" and third.messages[0] is not second.messages[0]
    for body, (_, got) in zip(bodies, results, strict=True):
        assert got == parse(fmt, body.encode())


def test_a_gemini_body_with_both_spellings_of_its_system_prompt_parses_as_alone() -> None:
    def body(camel: str, snake: str, n: int) -> bytes:
        contents = [{"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"m{i}"}]} for i in range(n)]
        system = {"systemInstruction": {"parts": [{"text": camel}]}, "system_instruction": {"parts": [{"text": snake}]}}
        return json.dumps(system | {"contents": contents}).encode()

    bodies = [body("a", "b", 1), body("a", "c", 3)]  # only the later spelling, the one that counts, changes
    for raw, (_, got) in zip(bodies, chain("gemini", bodies), strict=True):
        assert isinstance(got, ModelRequest) and got == parse("gemini", raw)
    assert got.messages[0].text == "c"


def test_chat_tool_results_take_their_calls_kind_from_reused_and_new_messages() -> None:
    # A result inherits the kind of the latest call of its id before it. Calls in the reused history are searched
    # only when needed (converters.chat._CallKinds): ids repeat across turns here with other kinds, and a result
    # answers a call several turns back.
    def call(cid: str, kind: str) -> dict[str, Any]:
        body = {"name": "f", "arguments": "{}"} if kind == "function" else {"name": "g", "input": "x"}
        return {"id": cid, "type": kind, kind: body}

    turns = [
        {"role": "assistant", "tool_calls": [call("a", "custom"), call("b", "function")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "assistant", "tool_calls": [call("a", "function"), call("c", "custom")]},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
        {"role": "tool", "tool_call_id": "a", "content": "4"},
        {"role": "assistant", "tool_calls": [call("b", "custom")]},
        {"role": "tool", "tool_call_id": "b", "content": "5"},
        {"role": "tool", "tool_call_id": "c", "content": "6"},
    ]
    bodies = [
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "go"}, *turns[:n]]}).encode()
        for n in range(1, len(turns) + 1)
    ]
    results = chain("chat", bodies)
    for body, (_, got) in zip(bodies, results, strict=True):
        assert isinstance(got, ModelRequest) and got == parse("chat", body)
    kinds = [m.parts[0].kind for m in results[-1][1].messages if m.role == "tool"]  # type: ignore[union-attr]
    assert kinds == ["custom", "function", "custom", "function", "custom", "custom"]
    assert results[-1][0].reused == len(turns)  # the user message and every turn but the last


def test_same_objects_counts_the_leading_run_of_identical_items() -> None:
    a, b, c = ["x"], ["x"], ["y"]  # a == b but not the same object
    assert same_objects((a, c), (a, c, b)) == 2
    assert same_objects((a, c, b), (a, c)) == 2
    assert same_objects((a, c), (b, c)) == 0
    assert same_objects((), (a,)) == 0


def test_derived_gives_back_what_the_previous_call_built_from_the_same_objects() -> None:
    a, b, c = ["a"], ["b"], ["c"]
    first = ListReuse(None)
    body = b'{"input": [1, 2]}'
    first.load(body, "input", "t")
    first.items([1, 2], _tag)
    built = first.derived("turn", (a, b), lambda: "ab")
    assert built == "ab" and first.derived("turn", (), lambda: "none") == "none"
    second = ListReuse(first.memo())
    second.load(body, "input", "t")
    second.items([1, 2], _tag)
    kept = ["ab, again"]
    assert second.derived("turn", (a, b), lambda: kept) == "ab"  # the very same sources: the previous result
    assert second.derived("turn", (a, b, c), lambda: kept) is kept  # a source more
    assert second.derived("other", (a, b), lambda: kept) is kept  # built under another name
    third = ListReuse(second.memo())
    assert third.derived("turn", (["a"], b), lambda: kept) is kept  # an equal source is not the same one
    assert third.derived("turn", (a, b, c), lambda: "new") is kept  # the second call's entry, not the first's


def test_a_responses_turn_of_several_items_is_the_previous_calls_message_until_it_grows() -> None:
    def body(items: list[dict[str, Any]]) -> bytes:
        return json.dumps({"model": "m", "input": items}).encode()

    user = {"type": "message", "role": "user", "content": "list the files"}

    def call(k: int) -> dict[str, Any]:
        return {"type": "function_call", "call_id": f"c{k}", "name": "ls", "arguments": "{}"}

    def output(k: int) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": f"c{k}", "output": "a.txt"}

    bodies = [
        body([user, call(1), call(2)]),
        body([user, call(1), call(2), call(3)]),  # the turn grows by a third call
        body([user, call(1), call(2), call(3), output(1), output(2), output(3)]),
    ]
    results = [got for _, got in chain("responses", bodies)]
    for raw, got in zip(bodies, results, strict=True):
        assert isinstance(got, ModelRequest) and got == parse("responses", raw)
    first, second, third = results
    assert [len(m.parts) for m in first.messages] == [1, 2]  # type: ignore[union-attr]
    assert second.messages[1] is not first.messages[1] and len(second.messages[1].parts) == 3  # type: ignore[union-attr]
    assert second.messages[1] is third.messages[1]  # type: ignore[union-attr]

"""Tests for converters.responses_items: Responses input items <-> canonical messages.

Checks each convention of the module docstring in both directions: a wire item list parses to the expected
messages and renders back to the same list (wire -> canonical -> wire identity for the shapes harnesses send),
and what cannot be represented is a 400 naming what is wrong.
"""

from __future__ import annotations

from typing import Any

import pytest

from converters.base import UnknownFields
from converters.canonical import (
    ConversionError,
    ImagePart,
    Message,
    ProviderState,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from converters.responses_items import parse_input, render_input


def parse(items: Any) -> tuple[Message, ...]:
    messages, carriers = parse_input(items, UnknownFields())
    assert carriers == []
    return messages


def ps(data: dict[str, Any]) -> ProviderState:
    return ProviderState("responses", data)


def assert_round_trip(items: list[Any]) -> tuple[Message, ...]:
    messages = parse(items)
    assert render_input(messages) == items
    return messages


def test_plain_codex_items_parse_to_plain_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look first"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd":"ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": '{"cmd":"pwd"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "c2", "output": "/repo"},
    ]
    messages = assert_round_trip(items)
    assert messages == (
        Message("developer", (TextPart("rules"),)),
        Message("user", (TextPart("fix it"),)),
        Message(
            "assistant",
            (
                ReasoningPart("look first"),
                TextPart("Looking."),
                ToolCallPart("c1", "exec_command", '{"cmd":"ls"}'),
                ToolCallPart("c2", "exec_command", '{"cmd":"pwd"}'),
            ),
        ),
        Message("tool", (ToolResultPart("c1", (TextPart("a.txt"),)),)),
        Message("tool", (ToolResultPart("c2", (TextPart("/repo"),)),)),
    )


def test_input_string_is_one_user_message() -> None:
    messages = parse("hello")
    assert messages == (Message("user", (TextPart("hello"),), ps({"source": "input_string"})),)
    assert render_input(messages) == "hello"


def test_untyped_string_messages_keep_their_shape() -> None:
    items = [
        {"role": "developer", "content": "You are terse."},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    ]
    messages = assert_round_trip(items)
    assert messages[0] == Message(
        "developer", (TextPart("You are terse."),), ps({"untyped": True, "string_content": True})
    )
    assert messages[1] == Message("user", (TextPart("hi"),), ps({"untyped": True}))


def test_assistant_item_details_ride_on_first_text_part() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "first", "annotations": []}],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_2",
            "phase": "final_answer",
            "content": [{"type": "output_text", "text": "second"}, {"type": "refusal", "refusal": "no"}],
        },
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc_9", "status": "completed"},
    ]
    messages = assert_round_trip(items)
    assert len(messages) == 2  # the two assistant items and the call are one turn
    first, second, refusal, call = messages[1].parts
    assert first == TextPart(
        "first",
        provider_state=ps(
            {
                "part": {"type": "output_text", "annotations": []},
                "item": {"extra": {"id": "msg_1", "status": "completed"}},
            }
        ),
    )
    assert second == TextPart(
        "second", provider_state=ps({"item": {"extra": {"id": "msg_2", "phase": "final_answer"}}})
    )
    assert refusal == TextPart("no", provider_state=ps({"part": {"type": "refusal"}}))
    assert call == ToolCallPart("c", "f", "{}", provider_state=ps({"extra": {"id": "fc_9", "status": "completed"}}))


def test_reasoning_prefers_raw_content_and_keeps_encrypted_items_verbatim() -> None:
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "short"}],
        "content": [{"type": "reasoning_text", "text": "long "}, {"type": "reasoning_text", "text": "form"}],
        "encrypted_content": "gAAAA-opaque",
    }
    (message,) = assert_round_trip([item])
    (part,) = message.parts
    assert part == ReasoningPart("long form", provider_state=ps({"item": item}))
    several = {"type": "reasoning", "summary": [{"type": "summary_text", "text": t} for t in ("a", "b")]}
    assert parse([several])[0].parts == (ReasoningPart("a\n\nb", provider_state=ps({"item": several})),)
    empty = {"type": "reasoning", "summary": []}
    assert assert_round_trip([empty])[0].parts == (ReasoningPart(""),)


def test_custom_tool_call_and_output() -> None:
    items = [
        {"type": "custom_tool_call", "call_id": "x1", "name": "exec", "input": "await tools.ls()"},
        {"type": "custom_tool_call_output", "call_id": "x1", "output": "ok"},
    ]
    messages = assert_round_trip(items)
    assert messages == (
        Message("assistant", (ToolCallPart("x1", "exec", "await tools.ls()", kind="custom"),)),
        Message("tool", (ToolResultPart("x1", (TextPart("ok"),), kind="custom"),)),
    )


@pytest.mark.parametrize(
    ("output", "content", "state"),
    [
        ("plain", (TextPart("plain"),), None),
        ([{"type": "input_text", "text": "one"}], (TextPart("one"),), {"array": True}),
        (
            [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "https://x/i.png", "detail": "auto"},
            ],
            (TextPart("see"), ImagePart("url", "https://x/i.png")),
            None,
        ),
        ({"exit_code": 0, "stdout": "ok"}, (TextPart('{"exit_code": 0, "stdout": "ok"}'),), {"json": True}),
        ([], (), None),
    ],
)
def test_tool_output_as_text_blocks_or_json(output: Any, content: tuple[Any, ...], state: Any) -> None:
    item = {"type": "function_call_output", "call_id": "c", "output": output}
    (message,) = assert_round_trip([item])
    assert message.parts == (ToolResultPart("c", content, provider_state=ps(state) if state else None),)


def test_images_by_url_data_and_file_id_with_detail() -> None:
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
                {"type": "input_image", "image_url": "https://example.com/a.jpg", "detail": "high"},
                {"type": "input_image", "file_id": "file-123", "detail": "auto"},
            ],
        }
    ]
    (message,) = assert_round_trip(items)
    assert message.parts == (
        ImagePart("base64", "iVBORw0KGgo=", "image/png"),
        ImagePart("url", "https://example.com/a.jpg"),
        ImagePart("file_id", "file-123"),
    )
    assert message.provider_state == ps({"image_detail": [None, "high", None]})


def test_carriers_are_returned_and_put_back_in_place() -> None:
    carrier = {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "wait"}]}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    messages, carriers = parse_input([user, carrier, user], UnknownFields())
    assert carriers == [(1, carrier)]
    assert len(messages) == 2
    assert render_input(messages, [(1, carrier)]) == [user, carrier, user]


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        ([{"type": "item_reference", "id": "msg_1"}], "item_reference"),
        ([{"type": "web_search_call", "id": "ws_1"}], "'web_search_call'"),
        ([{"type": "compaction", "encrypted_content": "x"}], "'compaction'"),
        ([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}], "'input_file'"),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "'input_audio'"),
        ([{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}], "'input_image'"),
        ([{"role": "tool", "content": "x"}], "role"),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "image_url or file_id"),
        ([{"type": "function_call", "call_id": "c", "name": "f"}], "arguments"),
        ([{"type": "function_call_output", "call_id": "c", "output": 3}], "output"),
        ([{"type": "reasoning", "summary": "text"}], "arrays"),
        (["just a string"], "expected an object"),
        ({"role": "user"}, "input"),
    ],
)
def test_unrepresentable_items_are_400s(items: Any, needle: str) -> None:
    with pytest.raises(ConversionError) as info:
        parse(items)
    assert info.value.status == 400 and needle in info.value.message


def test_unknown_message_fields_are_logged_and_kept() -> None:
    sink = UnknownFields()
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "hi"}],
        "internal_chat_message_metadata_passthrough": {"turn_id": "t1"},
    }
    messages, _ = parse_input([item], sink)
    assert "input.message.internal_chat_message_metadata_passthrough" in sink.seen
    assert render_input(messages) == [item]


def test_render_rejects_parts_the_format_cannot_hold() -> None:
    for message in (
        Message("user", (ReasoningPart("x"),)),
        Message("developer", (ToolCallPart("c", "f", "{}"),)),
        Message("assistant", (ImagePart("url", "https://x/i.png"),)),
    ):
        with pytest.raises(ConversionError) as info:
            render_input([message])
        assert info.value.status == 400


def test_foreign_shapes_render_as_responses_items() -> None:
    """Canonical requests parsed from other formats: tool results inside user turns, text in tool turns."""
    anthropic_turn = Message(
        "user",
        (
            ToolResultPart("t1", (TextPart("one"),), is_error=True),
            ToolResultPart("t2", (TextPart("two"),), provider_state=ProviderState("anthropic", {"x": 1})),
            TextPart("now continue"),
        ),
    )
    assert render_input([anthropic_turn, Message("tool", (ToolResultPart("t3", ()), TextPart("note")))]) == [
        {"type": "function_call_output", "call_id": "t1", "output": "one"},
        {"type": "function_call_output", "call_id": "t2", "output": "two"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "now continue"}]},
        {"type": "function_call_output", "call_id": "t3", "output": []},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "note"}]},
    ]
    chat_assistant = Message(
        "assistant", (TextPart("hi"), ToolCallPart("c", "f", "{}")), ProviderState("chat", {"refusal": "r"})
    )
    assert render_input([chat_assistant]) == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]

"""Header field lines folded to one line per name (addon/serving/field_lines.py)."""

from __future__ import annotations

import pytest

from addon.serving.field_lines import fold_field_lines
from addon.serving.server import harness_from_user_agent
from converters.canonical import ConversionError

# hermes' Anthropic provider: the SDK's agent plus its own, differing in case. aiohttp refused the second line.
HERMES_UA = [(b"User-Agent", b"Anthropic/Python 0.69.0"), (b"user-agent", b"claude-code/2.0.14")]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param(HERMES_UA, [(b"User-Agent", b"claude-code/2.0.14 Anthropic/Python 0.69.0")], id="ua"),
        pytest.param(
            [(b"user-agent", b"x/1"), (b"accept", b"*/*"), (b"User-Agent", b"x/1")],
            [(b"user-agent", b"x/1"), (b"accept", b"*/*")],
            id="ua-repeated",
        ),
        pytest.param(
            [(b"anthropic-beta", b"a"), (b"x-api-key", b"k"), (b"Anthropic-Beta", b"b,c")],
            [(b"anthropic-beta", b"a, b,c"), (b"x-api-key", b"k")],
            id="list-field",
        ),
        pytest.param([(b"cookie", b"a=1"), (b"cookie", b"b=2")], [(b"cookie", b"a=1; b=2")], id="cookie"),
        pytest.param(
            [(b"content-type", b"application/json"), (b"Content-Type", b"text/plain")],
            [(b"content-type", b"application/json")],
            id="singleton-first-kept",
        ),
        pytest.param(
            [(b"content-length", b"7"), (b"host", b"h"), (b"Content-Length", b"7")],
            [(b"content-length", b"7"), (b"host", b"h")],
            id="content-length-agreeing",
        ),
        pytest.param(
            [(b"b", b"2"), (b"a", b"1"), (b"c", b"3")], [(b"b", b"2"), (b"a", b"1"), (b"c", b"3")], id="untouched"
        ),
    ],
)
def test_fold_field_lines_leaves_one_line_per_name(fields, expected) -> None:
    assert list(fold_field_lines(fields)) == expected


def test_folded_user_agent_names_the_harness_not_its_sdk() -> None:
    (folded,) = (v for k, v in fold_field_lines(HERMES_UA) if k.lower() == b"user-agent")
    assert harness_from_user_agent(folded.decode()) == ("claude-code", None)
    reordered = fold_field_lines(HERMES_UA[::-1])  # whichever line comes first, the SDK's agent goes last
    assert reordered == ((b"user-agent", b"claude-code/2.0.14 Anthropic/Python 0.69.0"),)


@pytest.mark.parametrize(
    "fields",
    [
        [(b"content-length", b"7"), (b"Content-Length", b"70")],
        [(b"transfer-encoding", b"chunked"), (b"transfer-encoding", b"chunked")],
        [(b"transfer-encoding", b"chunked"), (b"content-length", b"7")],
    ],
    ids=["content-lengths-disagree", "two-transfer-encodings", "both"],
)
def test_ambiguous_framing_is_refused(fields) -> None:
    with pytest.raises(ConversionError) as err:
        fold_field_lines(fields)
    assert err.value.kind == "invalid_request" and "framing" in err.value.message

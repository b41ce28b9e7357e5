"""addon/generation/sessions.py: attribution order and budgets."""

from __future__ import annotations

import pytest

from addon.generation.sessions import UNATTRIBUTED, Budget, Evidence, SessionRegistry, attribute, parse_sources


def test_attribution_takes_the_first_source_that_has_a_value() -> None:
    sources = parse_sources("proxyauth,prefix,header")
    assert attribute(sources, Evidence(proxyauth_user="a", prefix_session="b", header_session="c")) == (
        "a",
        "proxyauth",
    )
    assert attribute(sources, Evidence(prefix_session="b", header_session="c")) == ("b", "prefix")
    assert attribute(sources, Evidence(header_session="c", api_key="k")) == ("c", "header")
    # the API key is never used unless asked for: a session id in a key leaks into graders
    assert attribute(sources, Evidence(api_key="k")) == (UNATTRIBUTED, None)
    assert attribute(parse_sources("api_key"), Evidence(api_key="k")) == ("k", "api_key")


def test_parse_sources_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown session source 'cookie'"):
        parse_sources("proxyauth,cookie")
    with pytest.raises(ValueError, match="at least one"):
        parse_sources(" , ")


def test_call_budget_stops_the_call_past_the_cap() -> None:
    reg = SessionRegistry(Budget(max_calls=2))
    assert reg.begin_call("s") == (0, None)
    assert reg.begin_call("s") == (1, None)
    assert reg.begin_call("s") == (2, "max_calls=2")
    assert reg.begin_call("other") == (0, None)
    assert reg.get("s").budget_stops == 1


def test_token_and_time_budgets() -> None:
    now = [0.0]
    reg = SessionRegistry(Budget(max_tokens=100, max_seconds=10), clock=lambda: now[0])
    reg.begin_call("s")
    reg.end_call("s", tokens=100)
    assert reg.begin_call("s")[1] == "max_tokens=100"
    reg2 = SessionRegistry(Budget(max_seconds=10), clock=lambda: now[0])
    reg2.begin_call("t")
    now[0] = 10.5
    assert reg2.begin_call("t")[1] == "max_seconds=10"


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="max_calls must be positive"):
        Budget(max_calls=0)


def test_close_marks_the_session_and_runs_every_on_close_callback() -> None:
    reg = SessionRegistry(Budget())
    freed: list[tuple[str, str]] = []
    reg.on_close(lambda sid: freed.append(("graphs", sid)))
    reg.on_close(lambda sid: freed.append(("other", sid)))
    reg.begin_call("s")
    state = reg.close("s")
    assert state is not None and state.closed
    assert freed == [("graphs", "s"), ("other", "s")]
    # An unknown session (its calls went to another proxy, or none was made) still frees what others may hold.
    assert reg.close("never-seen") is None
    assert freed[-2:] == [("graphs", "never-seen"), ("other", "never-seen")]
    # A closed session that calls again goes on counting.
    assert reg.begin_call("s") == (1, None)

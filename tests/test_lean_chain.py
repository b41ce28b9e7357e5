"""addon/serving/lean_chain.py: which of mitmproxy's default addons are idle under the options given.

Against mitmdump's real default chain (``DumpMaster``): the capture script's :func:`addon.capture.drop_idle_addons`
is tested in tests/test_capture.py; here the pure rules.
"""

from __future__ import annotations

import pytest

from addon.serving.lean_chain import DNS_ADDONS, IDLE_UNLESS_SET, REVERSE_ADDONS, idle_addons, woken

# mitmdump's default chain in mitmproxy 12 (the names AddonManager looks addons up by)
CHAIN = (
    "core browser block stripdnshttpsrecords blocklist anticache anticomp clientplayback commandhistory comment cut "
    "disableh2c export onboarding proxyauth proxyserver scriptloader dnsresolver nextlayer serverplayback mapremote "
    "maplocal modifybody modifyheaders stickyauth stickycookie save savehar tlsconfig upstreamauth updatealtsvc "
    "dumper keepserving readfilestdin errorcheck"
).split()
KEPT = {
    "core",
    "browser",
    "block",
    "clientplayback",
    "disableh2c",
    "onboarding",
    "proxyauth",
    "proxyserver",
    "scriptloader",
    "nextlayer",
    "serverplayback",
    "save",
    "tlsconfig",
    "dumper",
    "errorcheck",
}
REGULAR = [("regular", "")]


def nothing_changed(option: str) -> bool:
    return False


def test_a_regular_proxy_with_default_options_keeps_only_what_can_act() -> None:
    idle = idle_addons(CHAIN, nothing_changed, REGULAR)
    assert list(idle) == [name for name in CHAIN if name not in KEPT]  # in chain order
    assert idle["maplocal"] == ("map_local",) and idle["dnsresolver"] == ("mode",) and idle["cut"] == ()


@pytest.mark.parametrize("name", sorted(name for name, options in IDLE_UNLESS_SET.items() if options))
def test_an_addon_whose_option_is_set_stays(name: str) -> None:
    option = IDLE_UNLESS_SET[name][-1]
    idle = idle_addons(CHAIN, lambda o: o == option, REGULAR)
    assert name not in idle
    assert "cut" in idle  # the others are still dropped


@pytest.mark.parametrize(
    ("modes", "dns_kept", "altsvc_kept"),
    [
        ([("regular", ""), ("upstream", ""), ("socks5", "")], False, False),
        ([("reverse", "https")], False, True),
        ([("reverse", "tcp"), ("regular", "")], False, True),
        ([("reverse", "dns")], True, True),
        ([("regular", ""), ("dns", "")], True, False),
        ([("wireguard", "")], True, False),
        ([("local", "")], True, False),
        ([("transparent", "")], True, False),
    ],
)
def test_mode_bound_addons_stay_when_a_mode_needs_them(
    modes: list[tuple[str, str]], dns_kept: bool, altsvc_kept: bool
) -> None:
    idle = idle_addons(CHAIN, nothing_changed, modes)
    assert all((name not in idle) == dns_kept for name in DNS_ADDONS)
    assert all((name not in idle) == altsvc_kept for name in REVERSE_ADDONS)


def test_unknown_addons_are_never_dropped() -> None:
    assert idle_addons(["myaddon", "harnessrl-capture", "cut"], nothing_changed, REGULAR) == {"cut": ()}


def test_woken_names_the_dropped_addons_an_update_turns_on() -> None:
    dropped = idle_addons(CHAIN, nothing_changed, REGULAR)
    assert woken(dropped, {"map_local", "flow_detail"}) == ["maplocal"]
    assert woken(dropped, {"rfile"}) == ["keepserving", "readfilestdin"]
    assert woken(dropped, {"flow_detail", "harnessrl_seed"}) == []
    assert woken({}, {"map_local"}) == []

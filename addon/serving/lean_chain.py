"""Which of mitmproxy's default addons a capture proxy drops from mitmproxy's addon chain: those that cannot act on
any flow with the options the process started with.

Why
---
mitmproxy dispatches every hook of every flow (request headers, request, response headers, response, each followed
by an ``update``) to every addon of its chain, whether the addon has that hook or not: a context manager, a coroutine
and two generators per addon per hook. With mitmdump's 35 default addons that is ~180-300 us per hook
(``benchmarks/addon_chain.py``), and py-spy put it at ~15% of the CPU of a model call through mitmproxy (32-session
soak, ``benchmarks/results/round9.md``), nearly all of it spent on addons with nothing to do: map-local without a
map, sticky cookies without a filter, DNS addons in an HTTP proxy.

Contract
--------
:func:`idle_addons` is pure (no mitmproxy import; the capture script applies it with ``AddonManager.remove``,
mitmproxy's public API, which rebinds the chain so hooks already in flight finish on the old one). An addon listed
in :data:`IDLE_UNLESS_SET` is idle while every option that turns it on still has its default value; the DNS addons
are idle when no mode can produce a DNS flow, the Alt-Svc rewriter when no mode is a reverse proxy. Addons that
matter to every proxy (core, proxy server, script loader, next layer, TLS, proxy auth, block, save, dumper, error
check, onboarding, client/server replay, browser) are never dropped. Commands that a dropped addon registered stay
callable (mitmproxy's command manager keeps them). An option that would wake a dropped addon, set after start-up
(mitmproxy's ``set`` command), does not: :func:`woken` names the addons so the capture script can say so, with the
fix (``harnessrl_lean_chain=false``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

# addon name (mitmproxy's: the ``name`` attribute, else the lower-case class name) -> the options that turn it on
IDLE_UNLESS_SET: Final[Mapping[str, tuple[str, ...]]] = {
    "blocklist": ("block_list",),
    "anticache": ("anticache",),
    "anticomp": ("anticomp",),
    "commandhistory": (),  # the console's command history: mitmdump has no console
    "comment": (),  # commands only (flow.comment)
    "cut": (),  # commands only (cut.*)
    "export": (),  # commands only (export.*)
    "mapremote": ("map_remote",),
    "maplocal": ("map_local",),
    "modifybody": ("modify_body",),
    "modifyheaders": ("modify_headers",),
    "stickyauth": ("stickyauth",),
    "stickycookie": ("stickycookie",),
    "savehar": ("hardump",),
    "upstreamauth": ("upstream_auth",),
    "readfilestdin": ("rfile",),
    "keepserving": ("rfile", "client_replay", "server_replay"),
}
DNS_ADDONS: Final = ("stripdnshttpsrecords", "dnsresolver")  # act on DNS flows only
REVERSE_ADDONS: Final = ("updatealtsvc",)  # rewrites Alt-Svc of reverse-proxied answers only
# proxy modes (mitmproxy's mode kinds) that never carry a DNS flow; reverse modes by their target's scheme
_NO_DNS_KINDS: Final = frozenset({"regular", "upstream", "socks5"})
_NO_DNS_REVERSE_SCHEMES: Final = frozenset({"http", "https", "tls", "tcp"})


def _may_carry_dns(kind: str, scheme: str) -> bool:
    if kind == "reverse":
        return scheme not in _NO_DNS_REVERSE_SCHEMES
    return kind not in _NO_DNS_KINDS


def idle_addons(
    names: Iterable[str], changed: Callable[[str], bool], modes: Sequence[tuple[str, str]]
) -> dict[str, tuple[str, ...]]:
    """The addons of ``names`` (in their order) that cannot act with these options, each with the options that would
    turn it on. ``changed(option)`` says whether an option differs from its default (mitmproxy's
    ``OptManager.has_changed``); ``modes`` are the proxy's modes as (kind, scheme) pairs, as mitmproxy parses its mode
    specs (``ProxyMode.parse(spec).type_name`` and, for a reverse proxy, its target's scheme; else "")."""
    dns = any(_may_carry_dns(kind, scheme) for kind, scheme in modes)
    reverse = any(kind == "reverse" for kind, _ in modes)
    idle: dict[str, tuple[str, ...]] = {}
    for name in names:
        if name in IDLE_UNLESS_SET:
            options = IDLE_UNLESS_SET[name]
            if not any(changed(option) for option in options):
                idle[name] = options
        elif name in DNS_ADDONS and not dns:
            idle[name] = ("mode",)
        elif name in REVERSE_ADDONS and not reverse:
            idle[name] = ("mode",)
    return idle


def woken(dropped: Mapping[str, tuple[str, ...]], updated: Iterable[str]) -> list[str]:
    """The dropped addons that an options update would have turned on (``updated``: the options it changed)."""
    changed = set(updated)
    return [name for name, options in dropped.items() if changed.intersection(options)]


__all__ = ["DNS_ADDONS", "IDLE_UNLESS_SET", "REVERSE_ADDONS", "idle_addons", "woken"]

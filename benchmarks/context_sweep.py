"""The context sweep of ``side_by_side.py`` (and ``openenv_peer.py``, ``context_compare.py``, ``mitm_floor.py``): added
latency per call, one call at a time, at each context size, proxied minus direct for the same session and call.

:func:`context_sweeps` interleaves the targets session by session (see its docstring); :func:`context_sweep` is one
target without the warm-up, the name every tree ``context_compare.py`` compares has.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon.launch import ProxyHandle  # noqa: E402
from addon.records.schema import read_records  # noqa: E402
from benchmarks.replayer import BaseUrl, Direct, Proxied, ReplayLog, Target, replay  # noqa: E402
from benchmarks.sessions import FORMATS, context_script  # noqa: E402
from converters.canonical import WireFormat  # noqa: E402

CHARS_PER_TOKEN = 5.8  # of benchmarks.sessions.words() under the SmolLM2 tokenizer (measured; the page reports
# the real prompt lengths read back from the records)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --------------------------------------------------------------------------------------------------- context sweep


@dataclass(frozen=True)
class ContextRow:
    target_tokens: int
    prompt_tokens_p50: int
    steady_p50_ms: float
    steady_p99_ms: float
    first_p50_ms: float
    direct_p50_ms: float
    calls: int


def _paired(direct: ReplayLog, proxied: ReplayLog) -> tuple[list[float], list[float], list[float]]:
    """(steady-state added s, first-call added s, direct s), pairing calls by (session, call)."""
    d = {(c.session_id, c.call): c.total_s for c in direct.completed()}
    steady, first = [], []
    for c in proxied.completed():
        if (c.session_id, c.call) in d:
            (first if c.call == 0 else steady).append(c.total_s - d[(c.session_id, c.call)])
    return steady, first, list(d.values())


def context_sweep(
    engine_url: str,
    target: Target,
    contexts: Sequence[int],
    calls: int,
    seed: int,
    formats: Sequence[WireFormat] = FORMATS,
    sessions: int = 1,
) -> list[ContextRow]:
    """:func:`context_sweeps` of one target, without the warm-up (``context_compare.py`` calls this name in every
    tree it compares, and alternates the trees itself)."""
    rows = context_sweeps(engine_url, {"target": target}, contexts, calls, seed, formats, sessions, warmup=False)
    return rows["target"]


def context_sweeps(
    engine_url: str,
    targets: Mapping[str, Target],
    contexts: Sequence[int],
    calls: int,
    seed: int,
    formats: Sequence[WireFormat] = FORMATS,
    sessions: int = 1,
    warmup: bool = True,
) -> dict[str, list[ContextRow]]:
    """Sessions at each context size, one call at a time, interleaved: each session runs straight to
    ``engine_url``'s direct routes, then through every target in turn (the order rotating from one session to the
    next), each target under its own session id. A slow minute of a noisy machine then falls on the direct run and
    on every target alike; one sweep per target, one after the other, once gave the first a direct baseline 1.4x
    the last's (``side_by_side.md`` of 623e4a0). ``sessions`` of each format per size (a chat-only sweep takes 4
    per one of a four-format sweep: as many calls). ``warmup``: first one short session per format through each
    target, not counted: a proxy's first calls of a format load what every later call reuses (the page says so)."""
    names = list(targets)
    tags = {n: (f"-t{j}" if len(names) > 1 else "") for j, n in enumerate(names)}
    if warmup:
        for f in formats:
            script = context_script(seed, -1, f, 2_000, 2)
            for n in names:
                asyncio.run(replay(targets[n], [replace(script, session_id=f"warm{tags[n]}-{f}")], concurrency=1))
    out: dict[str, list[ContextRow]] = {n: [] for n in names}
    for k, tokens in enumerate(contexts):
        chars = int(tokens * CHARS_PER_TOKEN)
        scripts = [context_script(seed, k + 1000 * r, f, chars, calls) for r in range(sessions) for f in formats]
        added: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
        direct_s: list[float] = []
        for i, script in enumerate(scripts):
            direct = {
                c.call: c.total_s for c in asyncio.run(replay(Direct(engine_url), [script], concurrency=1)).completed()
            }
            direct_s += direct.values()
            for n in names[i % len(names) :] + names[: i % len(names)]:
                run = replace(script, session_id=script.session_id + tags[n])
                for c in asyncio.run(replay(targets[n], [run], concurrency=1)).completed():
                    if c.call in direct:
                        added[n][c.call != 0].append(c.total_s - direct[c.call])
        for n in names:
            first, steady = added[n]
            target = targets[n]
            ids = {s.session_id + tags[n] for s in scripts}
            lens = _prompt_lengths(target.proxies[0], ids) if isinstance(target, Proxied | BaseUrl) else []
            row = ContextRow(
                tokens,
                int(statistics.median(lens)) if lens else 0,
                pct(steady, 0.5) * 1e3,
                pct(steady, 0.99) * 1e3,
                pct(first, 0.5) * 1e3,
                pct(direct_s, 0.5) * 1e3,
                len(steady) + len(first),
            )
            out[n].append(row)
            print(f"context {tokens} {n}: {asdict(row)}", flush=True)
    return out


def _prompt_lengths(proxy: ProxyHandle, sessions: set[str]) -> list[int]:
    """Prompt lengths of these sessions' calls, after asking the proxy to flush them into shards."""
    for s in sessions:
        proxy.admin("POST", f"sessions/{s}/close")
    t = read_records(str(proxy.records), columns=["session_id", "prompt_ids"])
    return [
        len(p) for s, p in zip(t["session_id"].to_pylist(), t["prompt_ids"].to_pylist(), strict=True) if s in sessions
    ]


__all__ = ["CHARS_PER_TOKEN", "ContextRow", "context_sweep", "context_sweeps", "pct"]

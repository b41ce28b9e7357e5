"""Replay seeded agent sessions (:mod:`benchmarks.sessions`) through a target with real HTTP clients, honouring
streaming, keep a log of every call the clients saw, and check the proxy's shards against that log.

Contract
--------
* A :class:`Target` is :class:`Direct` (a base URL answering the vendor routes: the fake engine's direct routes, or
  vLLM's chat route), :class:`Internal` (a proxy's internal server without mitmproxy in front) or :class:`Proxied`
  (one or more mitmdump + capture processes in regular mode; session ``i`` goes to proxy ``i % n``, over TLS to the
  vendor host through ``HTTPS_PROXY`` credentials that name the session, exactly as a harness connects).
* :func:`replay` runs ``concurrency`` sessions at once, each its own ``httpx.AsyncClient`` (its own connection, as
  each harness is its own process). Each session is a tool loop: the next request is the history plus the assistant
  turn the client actually read from the stream plus the script's tool results. With ``duration_s`` a slot starts a
  fresh session whenever one ends, until the time is up (load and soak). A failed call is retried after its
  ``retry-after`` (at most ``retries`` times), as harnesses do. With ``close_sessions`` each session that reached
  a proxy is closed through the proxy's admin route when it ends (``POST .../sessions/{id}/close``), as
  ``tasks/collect.py`` does after each episode; ``ReplayLog.closed`` / ``close_errors`` count them.
* Every attempt is one :class:`CallLog` (the replayer's own truth): status, time to first byte, total time, whether
  the stream completed, and the fingerprint of the answer (text + tool call ids, ids unique per completion).
* :func:`verify` reads the shards and checks: every call a client saw complete is in exactly one row, of that
  session, complete (not lost, not duplicated, not misattributed), and no shard is unreadable.

CLI: ``python benchmarks/replayer.py --model-dir D [--sessions 8] [--calls 6]`` replays through a fresh proxy
against a fresh fake engine and prints the summary and the check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon.launch import ProxyHandle  # noqa: E402
from addon.records.schema import read_records, unpack_json  # noqa: E402
from addon.records.store import RecordStore  # noqa: E402
from addon.records.wal import list_segments  # noqa: E402
from addon.serving.server import CALL_PATH, HEADER_CALL_ID, HEADER_PATH  # noqa: E402
from benchmarks.sessions import FORMATS, Conversation, Reply, SessionScript, WireCall, decode_reply  # noqa: E402

# --------------------------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Direct:
    base_url: str
    kind: str = "direct"


@dataclass(frozen=True)
class Proxied:
    proxies: tuple[ProxyHandle, ...]
    kind: str = "proxy"


@dataclass(frozen=True)
class Internal:
    """A proxy's internal generation server, called without mitmproxy (as the addon's retargeted flow does): the
    difference to :class:`Proxied` is mitmproxy's own cost (TLS, HTTP relay, the hop to the internal server)."""

    proxy: ProxyHandle
    kind: str = "internal"


@dataclass(frozen=True)
class BaseUrl:
    """Proxies' internal servers used as a base URL (``http://127.0.0.1:<port>/s/<session>/v1/...``; the
    ``harnessrl_base_url`` endpoint): how a harness that takes a base URL reaches harnessrl without mitmproxy.
    Sessions are spread over the proxies as with :class:`Proxied`."""

    proxies: tuple[ProxyHandle, ...]
    kind: str = "base_url"


Target = Direct | Proxied | Internal | BaseUrl


@dataclass(frozen=True)
class CallLog:
    session_id: str
    call: int  # position in the script
    attempt: int
    format: str
    proxy: int  # which proxy process (-1: direct)
    status: int  # HTTP status; 0: no response (connection failed)
    started: float  # time.time()
    ttfb_s: float
    total_s: float
    request_bytes: int
    complete: bool
    error: str | None
    text: str
    tool_call_ids: tuple[str, ...]


@dataclass
class ReplayLog:
    calls: list[CallLog] = field(default_factory=list)
    wall_s: float = 0.0
    sessions: int = 0
    closed: int = 0  # sessions closed through the admin route (close_sessions)
    close_errors: list[str] = field(default_factory=list)

    def completed(self) -> list[CallLog]:
        return [c for c in self.calls if c.complete]

    def errors(self) -> Counter[str]:
        return Counter(f"{c.status}:{(c.error or '')[:60]}" for c in self.calls if not c.complete)

    def write(self, path: Path) -> None:
        with path.open("w") as f:
            for c in self.calls:
                f.write(json.dumps(asdict(c)) + "\n")


# --------------------------------------------------------------------------------------------------- one call


@dataclass
class _Client:
    http: httpx.AsyncClient
    base: str  # scheme://host[:port] prefix, or "" for proxied (the vendor host is per call)
    proxy: int
    internal: bool = False  # post to the internal server's call route, naming the original path in a header


def _client(target: Target, session: str, index: int, contexts: list[ssl.SSLContext], timeout: float) -> _Client:
    """A session's own client; ``contexts``: one per proxy of a proxied target, else one shared (plain HTTP)."""
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
    t = httpx.Timeout(timeout, connect=30.0)
    if isinstance(target, Internal):
        hdr = {"x-harnessrl-session": session}
        client = httpx.AsyncClient(timeout=t, limits=limits, headers=hdr, verify=contexts[0])
        return _Client(client, f"http://127.0.0.1:{target.proxy.admin_port}", 0, internal=True)
    if isinstance(target, BaseUrl):
        n = index % len(target.proxies)
        base = f"http://127.0.0.1:{target.proxies[n].admin_port}/s/{session}"
        return _Client(httpx.AsyncClient(timeout=t, limits=limits, verify=contexts[0]), base, n)
    if isinstance(target, Direct):
        # the session as the API key: how OpenEnv's capture server tells sessions apart (others ignore it)
        auth = {"authorization": f"Bearer {session}"}
        client = httpx.AsyncClient(timeout=t, limits=limits, headers=auth, verify=contexts[0])
        return _Client(client, target.base_url.rstrip("/"), -1)
    n = index % len(target.proxies)
    h = target.proxies[n]
    return _Client(httpx.AsyncClient(proxy=h.url(session), verify=contexts[n], timeout=t, limits=limits), "", n)


async def send(client: _Client, call: WireCall, session: str, index: int, attempt: int) -> tuple[CallLog, Reply, float]:
    """One streamed call; returns its log, the decoded reply and the retry-after the server asked for (0: none)."""
    url = (client.base or f"https://{call.host}") + (CALL_PATH if client.internal else call.path)
    headers = {"content-type": "application/json", "user-agent": "harnessrl-replayer/1.0"}
    if client.internal:
        headers |= {HEADER_PATH: call.path, HEADER_CALL_ID: uuid.uuid4().hex}
    t0, started = time.perf_counter(), time.time()
    ttfb, status, raw, err, retry = 0.0, 0, bytearray(), None, 0.0
    try:
        async with client.http.stream("POST", url, content=call.body, headers=headers) as resp:
            status = resp.status_code
            retry = float(resp.headers.get("retry-after", "0") or 0)
            async for chunk in resp.aiter_raw():
                if not ttfb:
                    ttfb = time.perf_counter() - t0
                raw += chunk
    except httpx.HTTPError as e:
        err = f"{type(e).__name__}: {e}"[:300]
    total = time.perf_counter() - t0
    reply = decode_reply(call.format, bytes(raw)) if status == 200 and err is None else Reply()
    if err is None and status != 200:
        err = bytes(raw[:4000]).decode("utf-8", "replace")
    log = CallLog(
        session_id=session,
        call=index,
        attempt=attempt,
        format=call.format,
        proxy=client.proxy,
        status=status,
        started=started,
        ttfb_s=ttfb,
        total_s=total,
        request_bytes=len(call.body),
        complete=reply.complete and err is None,
        error=err or reply.error,
        text=reply.text,
        tool_call_ids=tuple(c.id for c in reply.tool_calls),
    )
    return log, reply, retry


def _admin_port(target: Target, slot: int) -> int | None:
    if isinstance(target, Internal):
        return target.proxy.admin_port
    if isinstance(target, Proxied | BaseUrl):
        return target.proxies[slot % len(target.proxies)].admin_port
    return None


async def close_session(admin: httpx.AsyncClient, target: Target, session: str, slot: int, log: ReplayLog) -> None:
    """Close ``session`` on the proxy that served it, as the collector does when a harness's episode ends."""
    port = _admin_port(target, slot)
    if port is None:
        return
    try:
        r = await admin.post(f"http://127.0.0.1:{port}/_harnessrl/admin/sessions/{session}/close")
        r.raise_for_status()
        log.closed += 1
    except httpx.HTTPError as e:
        log.close_errors.append(f"{session}: {type(e).__name__}: {e}"[:200])


async def run_session(
    target: Target,
    script: SessionScript,
    slot: int,
    contexts: list[ssl.SSLContext],
    log: ReplayLog,
    *,
    retries: int = 3,
    timeout: float = 600.0,
    deadline: float | None = None,
    admin: httpx.AsyncClient | None = None,
) -> None:
    """One session's tool loop; closed through ``admin`` when given and at least one call was sent."""
    conv = Conversation(script)
    client = _client(target, script.session_id, slot, contexts, timeout)
    sent = False
    try:
        for i in range(script.calls):
            if deadline is not None and time.monotonic() > deadline:
                return
            call = conv.wire()
            for attempt in range(retries + 1):
                entry, reply, retry = await send(client, call, script.session_id, i, attempt)
                sent = True
                log.calls.append(entry)
                if entry.complete:
                    break
                await asyncio.sleep(min(retry or 0.5, 5.0))
            else:
                return  # the harness gives up on this session
            conv.extend(reply, i)
    finally:
        await client.http.aclose()
        if admin is not None and sent:
            await close_session(admin, target, script.session_id, slot, log)


async def replay(
    target: Target,
    scripts: Sequence[SessionScript] | None = None,
    *,
    concurrency: int,
    make: Callable[[int], SessionScript] | None = None,
    duration_s: float | None = None,
    retries: int = 3,
    timeout: float = 600.0,
    close_sessions: bool = False,
) -> ReplayLog:
    """Run ``scripts`` (all of them, ``concurrency`` at a time), or, with ``duration_s``, keep ``concurrency``
    sessions going from ``make(i) -> SessionScript`` until the time is up. ``close_sessions``: close each session
    on its proxy when it ends (the collector's way)."""
    # One SSL context per proxy (its CA), built once; plain-HTTP targets get one shared default context they never
    # use, because a client made without one loads the CA bundle: 42 ms per session's client on this VM, which
    # stalled the replayer for ~16 s at the start of a 384-session level of the direct, base-URL and OpenEnv
    # targets (and ~12% of its CPU afterwards), never of the proxied ones.
    if isinstance(target, Proxied):
        contexts = [h.ssl_context() for h in target.proxies]
    else:
        contexts = [ssl.create_default_context()]
    log = ReplayLog(sessions=0)
    deadline = time.monotonic() + duration_s if duration_s else None
    queue = list(scripts or [])
    counter = iter(range(10**9))

    async def worker(slot: int) -> None:
        while True:
            if deadline is not None:
                if time.monotonic() > deadline:
                    return
                assert make is not None, "duration_s needs make"
                script = make(next(counter))
            elif queue:
                script = queue.pop(0)
            else:
                return
            log.sessions += 1
            await run_session(
                target, script, slot, contexts, log, retries=retries, timeout=timeout, deadline=deadline, admin=admin
            )

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=120.0) as admin_client:
        admin = admin_client if close_sessions else None
        await asyncio.gather(*(worker(s) for s in range(concurrency)))
    log.wall_s = time.perf_counter() - t0
    return log


# --------------------------------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Verdict:
    """The shards checked against the replay log. ``ok`` when nothing seen complete is lost, doubled or misplaced."""

    seen_complete: int
    rows: int
    lost: int
    duplicated: int
    misattributed: int
    incomplete_rows_for_complete_calls: int
    unreadable: str | None
    examples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        bad = self.lost + self.duplicated + self.misattributed + self.incomplete_rows_for_complete_calls
        return bad == 0 and self.unreadable is None


def _fingerprint(text: str, ids: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    return text.strip(), tuple(ids)


def recover(records_dirs: Sequence[Path]) -> int:
    """Open and close each folder's record store (its writer must have stopped), turning rows a crash or an
    interrupted shutdown left in the write-ahead log into a shard, as the next proxy start would. Returns them."""
    recovered = 0
    stores = [p for d in outermost(records_dirs) for p in (Path(d), *sorted(Path(d).glob("worker-*")))]  # workers
    for d in stores:
        if list_segments(Path(d) / "wal"):
            store = RecordStore.open(d)
            recovered += store.recovery.recovered_rows
            store.close()
    return recovered


def outermost(records_dirs: Sequence[Path]) -> list[Path]:
    """The folders not inside another one of them (a shared-port proxy's handles name ``records`` and its
    ``records/worker-<k>``; shards are read recursively, so each must be read once)."""
    dirs = [Path(d).resolve() for d in records_dirs]
    return [d for d in dict.fromkeys(dirs) if not any(o != d and d.is_relative_to(o) for o in dirs)]


def verify(log: ReplayLog, records_dirs: Sequence[Path]) -> Verdict:
    """Match each completed call to shard rows by (text, tool call ids) — ids are random per completion, so a match
    in another session is a misattribution and two matches are a duplicate. Rows still in a write-ahead log are
    recovered into a shard first (:func:`recover`)."""
    try:
        recover(records_dirs)
        table = read_records(
            [str(d) for d in outermost(records_dirs)], columns=["session_id", "completion_canonical", "incomplete"]
        )
    except Exception as e:  # an unreadable shard is a finding, not a crash of the check
        return Verdict(len(log.completed()), 0, 0, 0, 0, 0, f"{type(e).__name__}: {e}")
    rows: dict[tuple[str, tuple[str, ...]], list[tuple[str, bool]]] = defaultdict(list)
    for session, blob, incomplete in zip(
        table["session_id"].to_pylist(),
        table["completion_canonical"].to_pylist(),
        table["incomplete"].to_pylist(),
        strict=True,
    ):
        if blob is None:
            continue
        c = unpack_json(blob)
        key = _fingerprint(c.get("text", ""), [t["id"] for t in c.get("tool_calls", [])])
        rows[key].append((session, incomplete))
    lost = dup = mis = inc = 0
    examples: list[str] = []
    for call in log.completed():
        found = rows.get(_fingerprint(call.text, call.tool_call_ids), [])
        mine = [r for r in found if r[0] == call.session_id]
        if not found:
            lost += 1
            examples.append(f"lost: {call.session_id} call {call.call}")
        elif not mine:
            mis += 1
            examples.append(f"misattributed: {call.session_id} call {call.call} -> {found[0][0]}")
        elif len(mine) > 1 and call.tool_call_ids:  # text-only answers may repeat legitimately
            dup += 1
            examples.append(f"duplicated: {call.session_id} call {call.call} x{len(mine)}")
        if mine and all(r[1] for r in mine):
            inc += 1
    return Verdict(len(log.completed()), table.num_rows, lost, dup, mis, inc, None, tuple(examples[:5]))


def summary(log: ReplayLog) -> dict[str, float]:
    done = log.completed()
    lat = sorted(c.total_s for c in done)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else 0.0

    return {
        "sessions": log.sessions,
        "calls": len(log.calls),
        "complete": len(done),
        "errors": len(log.calls) - len(done),
        "calls_per_s": round(len(done) / max(log.wall_s, 1e-9), 2),
        "p50_ms": round(pct(0.5), 1),
        "p99_ms": round(pct(0.99), 1),
        "wall_s": round(log.wall_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    from addon import launch
    from benchmarks import fake_engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--token-rate", type=float, default=200.0)
    args = ap.parse_args(argv)
    from benchmarks.sessions import make_script

    scripts = [make_script(args.seed, i, FORMATS[i % 4], calls=args.calls) for i in range(args.sessions)]
    engine = fake_engine.spawn(args.model_dir, launch.free_port(), token_rate=args.token_rate)
    with tempfile.TemporaryDirectory() as tmp:
        handle = launch.start(
            launch.ProxyConfig(engine.url, Path(tmp), options=(f"harnessrl_model_dir={args.model_dir}",))
        )
        try:
            log = asyncio.run(replay(Proxied((handle,)), scripts, concurrency=args.sessions))
        finally:
            handle.stop()
            engine.stop()
        print(json.dumps(summary(log)))
        print(verify(log, [handle.records]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""addon/serving/shared_port.py and ``launch.start_shared``: several mitmdump processes behind one port.

Fast tier: from whichever process a call arrives, its session goes to the same owner's port; a peer that stops
listening is marked down (its sessions get a 503) and up again when it listens; two ``SO_REUSEPORT`` listeners share
a port and both get connections; a port held without ``SO_REUSEPORT`` is a clear error; the options are checked.
Integration (two mitmdumps on one port in front of the FAKE engine of benchmarks/fake_engine.py, which isolates the
proxy: what is tested is routing and records, not sampling): the connections land on both processes, every call of
many sessions is answered and recorded once in its owner's folder, every tunnel reaches its owner (handed over when
it landed on the other process) so every call is relayed there, either admin port answers for both (stats, close,
policy version) without fan-out loops, a CONNECT sent a few bytes at a time is established and one without
credentials gets mitmproxy's 407 from either process, and when one process is killed the other answers its sessions
with the vendor's retryable 503 while its own sessions go on.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import time
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pyarrow.parquet as pq
import pytest

from addon import launch
from addon.serving.config import OPTIONS, CaptureConfig
from addon.serving.shared_port import StaticPeers, listen_shared, parse_ports
from addon.serving.workers import worker_of
from benchmarks import fake_engine
from tests.conftest import chat_through, wait_until

integration = pytest.mark.integration


def test_every_process_sends_a_session_to_the_same_owner() -> None:
    ports = (7001, 7002, 7003)
    views = [StaticPeers(ports, own) for own in ports]
    for s in (f"s-{i}" for i in range(300)):
        owner_port = ports[worker_of(s, 3)]
        for k, peers in enumerate(views):
            relative = peers.owner(s)
            assert (relative == 0) == (ports[k] == owner_port)  # 0: this process answers it
            assert (peers.port_of(relative) if relative else ports[k]) == owner_port
    assert [p["this"] for p in views[1].describe()] == [False, True, False]
    with pytest.raises(ValueError, match="must include"):
        StaticPeers(ports, 7009)


def test_a_peer_that_stops_listening_is_down_until_it_listens_again() -> None:
    async def scenario() -> None:
        async def nothing(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        peer = await asyncio.start_server(nothing, "127.0.0.1", 0)
        port = peer.sockets[0].getsockname()[1]
        peers = StaticPeers((launch.free_port(), port), port, probe_every=0.05)
        other = 1  # relative to the peer's own index 1: the process listed first, which never listens
        await peers.start()
        try:
            await wait_for(lambda: peers.port_of(other) is None)
            assert peers.port_of(0) == port
            again = await asyncio.start_server(nothing, "127.0.0.1", peers.ports[0])
            await wait_for(lambda: peers.port_of(other) == peers.ports[0])
            again.close()
        finally:
            await peers.stop()
            peer.close()

    asyncio.run(scenario())


async def wait_for(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


def test_two_listeners_share_a_port_and_both_get_connections() -> None:
    async def scenario() -> Counter[str]:
        seen: Counter[str] = Counter()

        def handler(name: str):
            async def handle(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                seen[name] += 1
                w.close()

            return handle

        port = launch.free_port()
        servers = [await listen_shared(handler(n), "127.0.0.1", port) for n in ("a", "b")]
        for _ in range(64):  # the kernel hashes each connection's addresses to one listener
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
        await wait_for(lambda: sum(seen.values()) == 64)
        for s in servers:
            s.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["a"] > 0 and seen["b"] > 0


def test_a_port_held_without_reuseport_is_a_clear_error() -> None:
    async def nothing(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(OSError, match="cannot listen on the shared port"):
            asyncio.run(listen_shared(nothing, "127.0.0.1", held.getsockname()[1]))


def options(**changes) -> SimpleNamespace:
    values = {name: default for name, _, default, _ in OPTIONS}
    return SimpleNamespace(**(values | changes))


def test_sharing_options_are_checked() -> None:
    ok = CaptureConfig.from_options(
        options(harnessrl_shared_port=9000, harnessrl_peer_ports="9101, 9102", harnessrl_server_port=9102)
    )
    assert (ok.shared_port, ok.peer_ports) == (9000, (9101, 9102))
    bad = {
        "needs harnessrl_peer_ports": dict(harnessrl_shared_port=9000),
        "must include": dict(harnessrl_peer_ports="9101,9102", harnessrl_server_port=9103),
        "unset: set it": dict(harnessrl_peer_ports="9101"),
        "names a port twice": dict(harnessrl_peer_ports="9101,9101", harnessrl_server_port=9101),
        "do not combine": dict(harnessrl_peer_ports="9101,9102", harnessrl_server_port=9101, harnessrl_workers=2),
        "not a port number": dict(harnessrl_peer_ports="9101,x"),
    }
    for message, change in bad.items():
        with pytest.raises(ValueError, match=message):
            CaptureConfig.from_options(options(**change))
    assert parse_ports("") == () and parse_ports("1,2,") == (1, 2)


# ------------------------------------------------------------------- through mitmdump, on the FAKE engine
@pytest.fixture
def shared_proxy(tmp_path: Path, smollm2_tokenizer_dir: Path):
    engine = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port(), tokens=12)
    try:
        config = launch.ProxyConfig(
            engine.url, tmp_path / "proxy", options=(f"harnessrl_model_dir={smollm2_tokenizer_dir}",)
        )
        handles = launch.start_shared(config, 2)
    except BaseException:
        engine.stop()
        raise
    try:
        yield handles
    finally:
        for h in handles:
            h.stop()
        engine.stop()


def own_rows(folder: Path) -> list[dict]:
    shards = sorted(str(p) for p in folder.glob("shard-*.parquet"))  # this folder's own, not its subfolders'
    return [row for p in shards for row in pq.read_table(p).to_pylist()]


@integration
def test_two_processes_on_one_port_answer_and_record_every_call_once_by_its_owner(shared_proxy) -> None:
    first, second = shared_proxy
    assert first.port == second.port and first.ca == second.ca and first.admin_port != second.admin_port
    sessions = [f"p-{uuid.uuid4().hex[:10]}" for _ in range(16)]
    for s in sessions:
        chat_through(first, s)  # a new connection per session: the kernel picks the process
    connects = [h.log.read_text().count("client connect") for h in shared_proxy]
    assert all(connects) and sum(connects) >= 16, connects
    for s in sessions:  # through either admin port: the owner flushes
        assert second.admin("POST", f"sessions/{s}/close")["flushed"]
    for h in shared_proxy:
        stats = h.admin("GET", "stats")
        assert stats["calls"] == 32 and stats["errors"] == {}
        assert [p["up"] for p in stats["worker_processes"]] == [True, True]
    folders = [own_rows(first.records), own_rows(second.records)]
    assert second.records == first.records / "worker-1"
    rows = [r for rs in folders for r in rs]
    assert len(rows) == 32 and len({r["call_id"] for r in rows}) == 32  # none lost, none duplicated
    for owner, folder_rows in enumerate(folders):
        assert folder_rows and all(worker_of(r["session_id"], 2) == owner for r in folder_rows)
    for s in sessions:
        assert sorted(r["call_index"] for r in rows if r["session_id"] == s) == [0, 1]
    listed = {row["id"]: row for row in first.admin("GET", "sessions")["sessions"]}
    assert len(listed) == 16 and all(listed[s]["closed"] and listed[s]["calls"] == 2 for s in sessions)
    r = httpx.post(f"http://127.0.0.1:{second.admin_port}/_harnessrl/admin/policy_version", json={"version": 4})
    assert r.status_code == 200 and r.json() == {"version": 4}
    # every tunnel reached its session's owner (harnessrl_handover), so every call was relayed there
    structures = [own_structures(h) for h in shared_proxy]
    assert [s["relay"]["requests"] for s in structures] == [len(rows) for rows in folders]
    moved = [s["handover"] for s in structures]
    assert sum(m["handed_out"] for m in moved) == sum(m["handed_in"] for m in moved) > 0
    assert sum(m["handed_out"] + m["kept"] for m in moved) == sum(connects)
    assert all(m["send_failed"] == m["refused"] == 0 for m in moved)


def own_structures(handle: launch.ProxyHandle) -> dict:
    """One process's own admin memory structures (``x-harnessrl-local``: no fan-out)."""
    url = f"http://127.0.0.1:{handle.admin_port}/_harnessrl/admin/memory?objects=0"
    return httpx.get(url, headers={"x-harnessrl-local": "1"}, timeout=30).json()["structures"]


@integration
def test_a_connect_in_pieces_or_without_credentials_gets_mitmproxy_s_answer_from_either_process(shared_proxy) -> None:
    """Whatever the routing reads of a head, mitmproxy still reads all of it: a CONNECT head sent a few bytes at a
    time is established, one without proxy credentials gets mitmproxy's 407 (proxyauth=any)."""
    first, _ = shared_proxy
    candidates = [f"c-{i}-{uuid.uuid4().hex[:6]}" for i in range(60)]
    sessions = [s for s in candidates if worker_of(s, 2) == 0][:4] + [s for s in candidates if worker_of(s, 2)][:4]
    for session in sessions:  # each process's own, and the other's, whichever process the kernel picks
        token = base64.b64encode(f"{session}:x".encode()).decode()
        bare = b"CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n"
        head = bare + f"Proxy-Authorization: Basic {token}\r\n\r\n".encode()
        assert connect_answer(first.port, head, piece=5).startswith(b"HTTP/1.1 200")
        assert connect_answer(first.port, bare + b"\r\n", piece=3).startswith(b"HTTP/1.1 407")


def connect_answer(port: int, head: bytes, piece: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i in range(0, len(head), piece):
            sock.sendall(head[i : i + piece])
            time.sleep(0.002)
        return sock.recv(4096)


@integration
def test_when_one_process_dies_its_sessions_get_a_retryable_503_and_the_others_go_on(shared_proxy) -> None:
    first, second = shared_proxy
    candidates = [f"d-{i}-{uuid.uuid4().hex[:6]}" for i in range(40)]
    mine = next(s for s in candidates if worker_of(s, 2) == 0)
    theirs = next(s for s in candidates if worker_of(s, 2) == 1)
    os.killpg(second.process.pid, signal.SIGKILL)
    second.process.wait()
    wait_until(lambda: not first.admin("GET", "stats")["worker_processes"][1]["up"], 10, "the peer seen down")
    chat_through(first, mine, turns=2)  # the survivor takes every connection now and answers its own sessions
    with pytest.raises(openai.APIStatusError) as refused:
        chat_through(first, theirs, turns=1)
    assert refused.value.status_code == 503 and refused.value.response.headers.get("retry-after")


def test_free_ports_are_distinct_and_avoid_the_taken_ones() -> None:
    """Ports for a proxy are picked together (one at a time the kernel may give the same port twice: CI saw a proxy
    whose admin port was its own listening port)."""
    taken = launch.free_ports(3)
    for _ in range(50):
        ports = launch.free_ports(9, taken=taken)
        assert len(set(ports)) == 9 and not set(ports) & set(taken)

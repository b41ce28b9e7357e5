"""addon/engine/pool.py: several engines behind one proxy with session affinity and failover.

The engines here are FAKES (named as such): :class:`benchmarks.fake_engine.FakeEngine`, our fast fake answering
vLLM's completions API, each served in-process on its own port, with the model id and weight version it reports made
settable (:class:`Replica`). An engine is "killed" by closing its server (connections are then refused) and "back" by
serving it again on the same port; mid-stream faults use the fake's own ``Faults``. The last test drives the real
mitmdump + addon against two such engines; everything but the engines is real.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from mitmproxy.options import Options

from addon.engine.client import (
    ClientTimeouts,
    EngineClient,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
)
from addon.engine.pool import (
    EnginePool,
    NoEngine,
    Routed,
    check_engines,
    parse_engine_urls,
    rendezvous_order,
)
from addon.records.schema import read_records
from addon.serving.aio import spawn
from addon.serving.config import CaptureConfig, add_options
from addon.serving.runtime import Runtime
from addon.serving.server import CALL_PATH, HEADER_PATH, HEADER_SESSION
from benchmarks.fake_engine import SERVED, FakeEngine, Faults
from tests.conftest import free_port, start_proxy, stop_process
from tests.netfaults import unreachable_port

REQ = GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=4)


@dataclass
class Replica(FakeEngine):
    """The fake engine reporting a settable model id and weight version (None: no ``/weight_info``, as a vLLM
    without the dev routes)."""

    served: str = SERVED
    version: str | None = "0"

    async def _models(self, _: web.Request) -> web.Response:
        card = {"id": self.served, "object": "model", "root": self.model_dir, "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _weight_info(self, _: web.Request) -> web.Response:
        if self.version is None:
            return web.json_response({"error": {"message": "Not Found"}}, status=404)
        return web.json_response({"weight_version": self.version})


class Served:
    """One replica served on a fixed port, which can be killed (refuses connections) and brought back."""

    def __init__(self, replica: Replica) -> None:
        self.replica, self.port = replica, free_port()
        self.server: TestServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = TestServer(self.replica.app(), port=self.port)
        await self.server.start_server()

    async def kill(self) -> None:
        assert self.server is not None
        await self.server.close()
        self.server = None


@pytest.fixture(scope="module")
def base_engine(smollm2_tokenizer_dir: Path) -> FakeEngine:
    return FakeEngine.build(smollm2_tokenizer_dir, tokens=8)  # loads the tokenizer once for every replica


def replica(base: FakeEngine, **kw) -> Replica:
    return Replica(base.answers, base.model_dir, max_model_len=8192, **kw)


@pytest.fixture
async def three(base_engine: FakeEngine) -> AsyncIterator[list[Served]]:
    engines = [Served(replica(base_engine, version=v)) for v in ("3", "4", "5")]
    for e in engines:
        await e.start()
    yield engines
    for e in engines:
        if e.server is not None:
            await e.kill()


async def bound(engines: list[Served], wait_s: float = 0.0) -> EnginePool:
    pool = EnginePool.from_urls([e.url for e in engines], wait_s=wait_s)
    await pool.bind()
    await pool.poll()
    return pool


async def one_call(pool: EnginePool, session: str) -> tuple[Routed, list[int]]:
    """One call's routing (the same for every chunk) and its sampled ids."""
    routes: set[Routed] = set()
    ids: list[int] = []
    async for routed, chunk in pool.stream(session, REQ):
        routes.add(routed)
        ids.extend(chunk.token_ids)
    assert len(routes) == 1, routes
    return routes.pop(), ids


# ------------------------------------------------------------------------------------------------ parsing, hashing


def test_engine_urls_are_parsed_and_normalised() -> None:
    assert parse_engine_urls("http://a:8000") == ("http://a:8000",)
    assert parse_engine_urls(" http://a:8000/, https://b:9000 ,") == ("http://a:8000", "https://b:9000")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no engine URL given"),
        (" , ", "no engine URL given"),
        ("http://a:1,localhost:2", "must be http\\(s\\) URLs, got 'localhost:2'"),
        ("http://a:1,http://a:1/", "listed twice: http://a:1"),
    ],
)
def test_bad_engine_url_lists_say_what_to_change(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_engine_urls(text)


def test_the_capture_option_takes_a_list_and_names_itself_in_errors() -> None:
    options = Options()
    add_options(options)
    options.update(harnessrl_engine_url="http://127.0.0.1:1, http://127.0.0.1:2/")
    assert CaptureConfig.from_options(options).engine_urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    options.update(harnessrl_engine_url="http://127.0.0.1:1,127.0.0.1:2")
    with pytest.raises(ValueError, match="harnessrl_engine_url: engine URLs must be http"):
        CaptureConfig.from_options(options)


def test_rendezvous_order_spreads_sessions_and_moves_only_a_removed_engines_share() -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    sessions = [f"rollout-{i}" for i in range(2000)]
    first = {s: rendezvous_order(s, urls)[0] for s in sessions}
    share = Counter(first.values())
    assert set(share) == set(urls) and all(400 <= n <= 600 for n in share.values()), share  # ~500 each
    assert all(rendezvous_order(s, urls[::-1]) == rendezvous_order(s, urls) for s in sessions[:50])  # order-free
    gone = urls[1]
    after = {s: rendezvous_order(s, [u for u in urls if u != gone])[0] for s in sessions}
    moved = [s for s in sessions if after[s] != first[s]]
    assert moved and all(first[s] == gone for s in moved)  # only the removed engine's sessions move...
    assert Counter(after[s] for s in moved).keys() == set(urls) - {gone}  # ...and they spread over the others


# ------------------------------------------------------------------------------------------------ affinity


async def test_every_call_of_a_session_goes_to_one_engine_and_sessions_spread(three: list[Served]) -> None:
    pool = await bound(three)
    by_url = {e.url: e for e in three}
    used: dict[str, str] = {}
    for turn in range(3):
        for i in range(30):
            routed, ids = await one_call(pool, f"s{i}")
            assert len(ids) == REQ.max_tokens
            assert used.setdefault(f"s{i}", routed.url) == routed.url, f"s{i} moved on call {turn}"
            # the record's version is the engine's own
            assert routed.policy_version == int(by_url[routed.url].replica.version or -1)
    counts = Counter(used.values())
    assert set(counts) == set(by_url)  # 30 sessions over 3 engines: each takes some
    for url, n in counts.items():
        assert by_url[url].replica.calls == 3 * n  # the engine saw exactly its sessions' calls
    assert pool.failovers == 0
    await pool.aclose()


async def test_the_trainers_push_sets_every_engine_and_the_poll_reads_each(three: list[Served]) -> None:
    pool = await bound(three)
    assert sorted(e.policy_version for e in pool.engines) == [3, 4, 5]
    pool.set_policy_version(9)
    assert {(await one_call(pool, f"s{i}"))[0].policy_version for i in range(10)} == {9}
    for e in three:
        e.replica.version = "10"  # the engines finished their sync; the next poll sees it
    await pool.poll()
    assert {e.policy_version for e in pool.engines} == {10}
    await pool.aclose()


# ------------------------------------------------------------------------------------------------ failover


async def test_a_killed_engine_fails_over_before_the_first_chunk_and_gets_its_sessions_back(
    three: list[Served],
) -> None:
    pool = await bound(three)
    by_url = {e.url: e for e in three}
    order = rendezvous_order("victim", pool.urls)
    home = by_url[order[0]]
    await home.kill()
    routed, ids = await one_call(pool, "victim")  # refused: sent again, nothing lost
    assert routed.url == order[1] and len(ids) == REQ.max_tokens
    assert pool.failovers == 1 and pool.pick("victim") is not None
    assert [e.status for e in pool.engines if e.url == home.url] == ["down"]
    routed, _ = await one_call(pool, "victim")
    assert routed.url == order[1] and pool.failovers == 1  # down engines are skipped, not retried per call
    await pool.poll()
    assert [e.status for e in pool.engines if e.url == home.url] == ["down"]  # the poll agrees
    await home.start()  # back on the same port
    await pool.poll()
    assert all(e.status == "up" for e in pool.engines)
    routed, _ = await one_call(pool, "victim")
    assert routed.url == home.url  # the session returns to its own engine (and its prefix cache)
    await pool.aclose()


async def test_a_connection_dropped_before_the_first_token_fails_over_after_it_does_not(
    three: list[Served],
) -> None:
    pool = await bound(three)
    by_url = {e.url: e for e in three}
    order = rendezvous_order("s", pool.urls)
    home, second = by_url[order[0]], by_url[order[1]]
    home.replica.faults = Faults(drop_after=0, calls=1)  # headers sent, then the connection closes
    routed, ids = await one_call(pool, "s")
    assert routed.url == second.url and len(ids) == REQ.max_tokens and pool.failovers == 1
    await pool.poll()  # the engine itself is alive: the poll brings it back at once
    assert pool.pick("s").url == home.url  # type: ignore[union-attr]

    home.replica.faults = Faults(drop_after=3, calls=1)  # tokens already reached the caller: no second engine
    calls_before = second.replica.calls
    got: list[int] = []
    with pytest.raises(EngineUnavailable):
        async for routed, chunk in pool.stream("s", REQ):
            assert routed.url == home.url
            got.extend(chunk.token_ids)
    assert len(got) == 3 and second.replica.calls == calls_before and pool.failovers == 1
    await pool.aclose()


async def test_a_connect_timeout_fails_over_like_a_refusal(base_engine: FakeEngine) -> None:
    live = Served(replica(base_engine))
    await live.start()

    def listing(request: httpx.Request) -> httpx.Response:  # FAKE: it lists the model, then its streams time out
        return httpx.Response(200, json={"data": [{"id": SERVED, "root": base_engine.model_dir}]})

    with unreachable_port() as port:  # a real host that never completes the handshake
        timeouts = ClientTimeouts(connect=0.5)
        dead = EngineClient(f"http://127.0.0.1:{port}", transport=httpx.MockTransport(listing), timeouts=timeouts)
        pool = EnginePool([dead, EngineClient(live.url)])
        await pool.bind()
        session = next(f"s{i}" for i in range(100) if rendezvous_order(f"s{i}", pool.urls)[0] == dead.base_url)
        routed, ids = await one_call(pool, session)
    assert routed.url == live.url and len(ids) == REQ.max_tokens and pool.failovers == 1
    await pool.aclose()
    await live.kill()


async def test_with_every_engine_down_a_call_waits_its_deadline_then_fails_with_no_engine(
    three: list[Served],
) -> None:
    pool = await bound(three, wait_s=1.0)
    for e in three:
        await e.kill()
    t0 = time.monotonic()
    with pytest.raises(NoEngine, match="no engine took the call within harnessrl_engine_wait_s=1 s") as err:
        await one_call(pool, "s")
    assert 1.0 <= time.monotonic() - t0 < 5.0 and err.value.waited_s >= 1.0
    assert isinstance(err.value, EngineUnavailable)  # the generator's retryable vendor error
    await pool.aclose()
    unbound = EnginePool.from_urls([e.url for e in three], wait_s=0.5)
    with pytest.raises(NoEngine, match="no engine is known to serve the model yet"):
        await one_call(unbound, "s")
    await unbound.aclose()


async def test_a_call_waits_for_its_only_engine_to_come_back_and_records_the_wait(base_engine: FakeEngine) -> None:
    only = Served(replica(base_engine))
    await only.start()
    pool = await bound([only], wait_s=30.0)
    await only.kill()  # e.g. restarting: connections refused for a while

    async def back_later() -> None:
        await asyncio.sleep(1.5)
        await only.start()

    comeback = spawn(back_later(), "comeback")
    routed, ids = await one_call(pool, "patient")
    await comeback
    assert routed.url == only.url and len(ids) == REQ.max_tokens
    assert 1.0 <= routed.waited_s < 10.0  # what the generator records as engine_wait_ms
    routed, _ = await one_call(pool, "patient")
    assert routed.waited_s == 0.0
    await pool.aclose()
    await only.kill()


@dataclass
class Stalling(Replica):
    """FAKE: an engine whose control routes stall (its API server starved by a long prefill) while it keeps
    streaming completions. The stall only has to outlast the poll's timeout (scaled down here from 5 s)."""

    stall_s: float = 3.0

    async def _models(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.stall_s)
        return await super()._models(request)

    async def _weight_info(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.stall_s)
        return await super()._weight_info(request)


async def test_a_busy_engine_whose_poll_stalls_is_never_taken_for_dead(
    base_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Stalling(base_engine.answers, base_engine.model_dir, max_model_len=8192)
    served = Served(engine)
    await served.start()
    pool = EnginePool.from_urls([served.url], wait_s=5.0)
    engine.stall_s = 0.0
    await pool.bind()
    engine.stall_s = 3.0
    pool.poll_timeout = 0.2
    caplog.set_level("INFO", logger="harnessrl.engine_pool")
    for _ in range(3):
        polls = spawn(pool.poll(), "poll")
        routed, ids = await one_call(pool, "busy")  # calls keep streaming while the poll hangs
        await polls
        assert len(ids) == REQ.max_tokens and routed.waited_s == 0.0
        assert [e.status for e in pool.engines] == ["up"]
    assert pool.engines[0].slow_polls == 3 and pool.failovers == 0
    busy = [r.message for r in caplog.records if "slow to answer its poll" in r.message]
    assert len(busy) == 1 and "busy, not down" in busy[0]  # logged once, not once per poll
    assert not [r for r in caplog.records if "is down" in r.message]
    await pool.aclose()
    await served.kill()


# ------------------------------------------------------------------------------------------------ model checks


async def test_engines_serving_different_models_are_refused(base_engine: FakeEngine) -> None:
    engines = [Served(replica(base_engine)), Served(replica(base_engine, served="other-model"))]
    for e in engines:
        await e.start()
    pool = EnginePool.from_urls([e.url for e in engines])
    with pytest.raises(EngineError, match="different models.*'fake-engine'.*'other-model'"):
        await pool.bind()
    await pool.aclose()
    with pytest.raises(ValueError, match="different models"):
        await check_engines([e.url for e in engines])
    for e in engines:
        await e.kill()


async def test_an_engine_down_at_bind_gets_calls_once_a_poll_finds_it_serving_the_model(
    base_engine: FakeEngine,
) -> None:
    up = Served(replica(base_engine))
    late = Served(replica(base_engine))
    late.replica.max_model_len = 4096
    await up.start()
    pool = EnginePool.from_urls([up.url, late.url])
    model = await pool.bind()
    assert model.id == SERVED and model.max_model_len == 8192
    assert [e.status for e in pool.engines] == ["up", "unverified"]
    with pytest.raises(ValueError, match=f"engine {late.url} does not answer /health"):
        await check_engines(pool.urls)
    sessions = [f"s{i}" for i in range(20)]
    assert {(await one_call(pool, s))[0].url for s in sessions} == {up.url}  # unverified: no calls
    await late.start()
    await pool.poll()
    assert [e.status for e in pool.engines] == ["up", "up"]
    assert {(await one_call(pool, s))[0].url for s in sessions} == {up.url, late.url}
    assert (await check_engines(pool.urls)).max_model_len == 4096  # the smallest context of the replicas
    await pool.aclose()
    for e in (up, late):
        await e.kill()


async def test_an_engine_that_comes_up_or_back_with_another_model_gets_no_calls(
    base_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    first, late, restarted = (Served(replica(base_engine)) for _ in range(3))
    late.replica.served = "other-model"
    for e in (first, restarted):
        await e.start()
    pool = EnginePool.from_urls([first.url, late.url, restarted.url])
    await pool.bind()
    await late.start()  # down at bind, then up with another model
    await restarted.kill()
    await pool.poll()
    assert [e.status for e in pool.engines] == ["up", "unverified", "down"]
    restarted.replica.served = "other-model"  # restarted with another model
    await restarted.start()
    with caplog.at_level("ERROR", logger="harnessrl.engine_pool"):
        for _ in range(3):
            await pool.poll()
    assert [e.status for e in pool.engines] == ["up", "unverified", "unverified"]  # not even a last resort
    refusals = [r.getMessage() for r in caplog.records if "gets no calls" in r.getMessage()]
    assert len(refusals) == 2 and all("'other-model', not 'fake-engine'" in m for m in refusals)  # once each
    assert {(await one_call(pool, f"s{i}"))[0].url for i in range(20)} == {first.url}
    restarted.replica.served = SERVED  # fixed: the next poll lets it back in
    await pool.poll()
    assert [e.status for e in pool.engines] == ["up", "unverified", "up"]
    await pool.aclose()
    for e in (first, late, restarted):
        await e.kill()


# ------------------------------------------------------------------------------------------------ the runtime


async def test_the_runtime_routes_by_session_and_the_admin_push_sets_every_engine(
    base_engine: FakeEngine, smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """Runtime + internal server in-process, two engines without ``/weight_info`` (so the poll keeps the push)."""
    engines = [Served(replica(base_engine, version=None)) for _ in range(2)]
    for e in engines:
        await e.start()
    options = Options()
    add_options(options)
    options.update(
        harnessrl_engine_url=",".join(e.url for e in engines),
        harnessrl_model_dir=str(smollm2_tokenizer_dir),
        harnessrl_records_dir=str(tmp_path / "records"),
    )
    runtime = await Runtime.start(CaptureConfig.from_options(options))
    base = f"http://127.0.0.1:{runtime.port}"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(f"{base}/_harnessrl/admin/policy_version", json={"version": 12})
        assert r.status_code == 200
        for i in range(12):
            headers = {HEADER_PATH: "/v1/chat/completions", HEADER_SESSION: f"rt-{i}"}
            assert (await client.post(f"{base}{CALL_PATH}", json=body, headers=headers)).status_code == 200
        for i in range(12):
            await client.post(f"{base}/_harnessrl/admin/sessions/rt-{i}/close")
    await asyncio.wait_for(runtime.stop(), 30)
    rows = read_records(tmp_path / "records").to_pylist()
    assert len(rows) == 12 and {r["policy_version"] for r in rows} == {12}
    assert sum(e.replica.calls for e in engines) == 12 and all(e.replica.calls for e in engines)
    for e in engines:
        await e.kill()


# ------------------------------------------------------------------------------------------------ end to end


class ThreadedReplica:
    """A replica served from its own thread and event loop, for the mitmdump process to reach."""

    def __init__(self, engine: Replica) -> None:
        self.engine, self.port = engine, free_port()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._runner = web.AppRunner(self.engine.app())
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)

    def stop(self) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


@pytest.fixture
def two_threaded(base_engine: FakeEngine) -> Iterator[list[ThreadedReplica]]:
    engines = [ThreadedReplica(replace(replica(base_engine), version=v)) for v in ("21", "22")]
    for e in engines:
        e.start()
    yield engines
    for e in engines:
        e.stop()


@pytest.mark.integration
def test_mitmdump_with_two_engines_keeps_each_session_on_one(
    two_threaded: list[ThreadedReplica], smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    urls = ",".join(e.url for e in two_threaded)
    proc, proxy = start_proxy(tmp_path, urls, "--set", f"harnessrl_model_dir={smollm2_tokenizer_dir}")
    try:
        sessions = [f"e2e-{i:02d}" for i in range(16)]
        for session in sessions:
            messages: list[dict] = [{"role": "user", "content": "List the files."}]
            with httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60) as http:
                for _ in range(3):  # a growing conversation: each call extends the last
                    r = http.post(
                        "https://api.openai.com/v1/chat/completions",
                        json={"model": "gpt-test", "messages": messages, "max_tokens": 16},
                    )
                    assert r.status_code == 200, r.text
                    messages += [r.json()["choices"][0]["message"], {"role": "user", "content": "Go on."}]
            proxy.admin("POST", f"sessions/{session}/close")
        rows = read_records(proxy.records).to_pylist()
    finally:
        stop_process(proc)
    versions = {s: {r["policy_version"] for r in rows if r["session_id"] == s} for s in sessions}
    assert all(len(v) == 1 for v in versions.values()), versions  # each session on one engine
    assert set().union(*versions.values()) == {21, 22}  # both engines used
    per_engine = Counter(next(iter(v)) for v in versions.values())
    assert [e.engine.calls for e in two_threaded] == [3 * per_engine[21], 3 * per_engine[22]]
    assert all(r["error"] is None for r in rows) and len(rows) == 48

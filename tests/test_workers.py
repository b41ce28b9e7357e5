"""addon/serving/workers.py and addon/serving/worker.py: the proxy spread over several generation processes.

Fast tier: session ownership is stable and spreads sessions evenly, stats merge by adding counters, a worker
rebuilds the proxy's configuration from its option values with its own records folder. Integration (mitmdump with
``harnessrl_workers=2`` in front of the FAKE engine of benchmarks/fake_engine.py, which isolates the proxy: what is
tested is routing and records, not sampling): every call of many sessions through ``HTTPS_PROXY`` is answered and
recorded once, in its owner's folder, under one run id; admin routes reach every worker; a worker killed with
SIGKILL is started again, its sessions get a retryable 503 meanwhile, and no call it had completed is lost.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import openai
import pyarrow.parquet as pq
import pytest

from addon import launch
from addon.serving.config import OPTIONS, CaptureConfig
from addon.serving.worker import worker_config
from addon.serving.workers import merge_stats, worker_of, worker_records_dir
from benchmarks import fake_engine
from tests.conftest import chat_through, wait_until

integration = pytest.mark.integration


def test_worker_of_is_stable_and_spreads_sessions() -> None:
    sessions = [f"s-{i}" for i in range(4000)]
    assert all(worker_of(s, 1) == 0 for s in sessions[:50])
    owners = [worker_of(s, 4) for s in sessions]
    assert owners == [worker_of(s, 4) for s in sessions]  # no per-process salt
    counts = Counter(owners)
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 850  # 1000 each expected
    assert worker_of("\udcff-odd", 3) in {0, 1, 2}  # any str a header can decode to


def test_worker_records_dir() -> None:
    assert worker_records_dir(Path("r"), 0) == Path("r")
    assert worker_records_dir(Path("r"), 2) == Path("r/worker-2")


def test_merge_stats_adds_counters_and_keeps_each_worker() -> None:
    own = {"calls": 3, "completion_tokens": 30, "calls_per_s_last_60s": 0.05, "errors": {"engine": 1},
           "missing_logprobs": {"tokens": 1, "calls": 1}, "overhead_ms": {"p50": 2.0}}  # fmt: skip
    other = {"worker": 1, "calls": 5, "completion_tokens": 50, "calls_per_s_last_60s": 0.1,
             "errors": {"engine": 2, "internal": 1}, "missing_logprobs": {"tokens": 0, "calls": 0}}  # fmt: skip
    down = {"worker": 2, "error": "starting"}
    merged = merge_stats(own, [other, down])
    assert (merged["calls"], merged["completion_tokens"], merged["calls_per_s_last_60s"]) == (8, 80, 0.15)
    assert merged["errors"] == {"engine": 3, "internal": 1}
    assert merged["missing_logprobs"] == {"tokens": 1, "calls": 1}
    assert merged["overhead_ms"] == {"p50": 2.0}  # percentiles do not add up: worker 0's, and each worker's below
    assert [w["worker"] for w in merged["workers"]] == [0, 1, 2] and merged["workers"][2]["error"] == "starting"
    assert merged["ready"] is False  # no snapshot said so, and a worker that did not answer is not ready


def test_merged_stats_are_ready_when_every_worker_is() -> None:
    own, other = {"ready": True, "calls": 0}, {"worker": 1, "ready": True, "calls": 0}
    assert merge_stats(own, [other])["ready"] is True
    assert merge_stats(own, [other | {"ready": False}])["ready"] is False
    assert merge_stats(own, [{"worker": 1, "error": "starting"}])["ready"] is False


def test_worker_config_rebuilds_the_proxys_configuration(tmp_path: Path) -> None:
    values = {name: default for name, _, default, _ in OPTIONS}
    values |= {"harnessrl_engine_url": "http://127.0.0.1:9", "harnessrl_workers": 3, "harnessrl_max_calls": 7,
               "harnessrl_server_port": 4321, "harnessrl_temperature": "0.5"}  # fmt: skip
    config = worker_config(json.dumps(values), "run-x", tmp_path / "worker-1")
    assert isinstance(config, CaptureConfig)
    assert (config.records_dir, config.run_id, config.server_port) == (tmp_path / "worker-1", "run-x", 0)
    assert (config.workers, config.base_url, config.relay) == (1, False, False)  # nor workers, a base URL, a relay
    assert (config.budget.max_calls, config.sampling.temperature) == (7, 0.5)
    assert config.engine_urls == ("http://127.0.0.1:9",)
    with pytest.raises(ValueError, match="harnessrl_workers"):
        worker_config(json.dumps(values | {"harnessrl_workers": 0}), "run-x", tmp_path)


# ------------------------------------------------------------------- through mitmdump, on the FAKE engine
@pytest.fixture
def two_worker_proxy(tmp_path: Path, smollm2_tokenizer_dir: Path):
    engine = fake_engine.spawn(smollm2_tokenizer_dir, launch.free_port(), tokens=12)
    try:
        options = (f"harnessrl_model_dir={smollm2_tokenizer_dir}", "harnessrl_workers=2")
        handle = launch.start(launch.ProxyConfig(engine.url, tmp_path / "proxy", options=options))
    except BaseException:
        engine.stop()
        raise
    try:
        yield handle
    finally:
        handle.stop()
        engine.stop()


def records_by_folder(proxy: launch.ProxyHandle) -> dict[str, list[dict]]:
    folders: dict[str, list[dict]] = {}
    for folder in (proxy.records, proxy.records / "worker-1"):
        shards = sorted(str(p) for p in folder.glob("shard-*.parquet"))  # this folder's own, not its subfolders'
        folders[folder.name] = [row for p in shards for row in pq.read_table(p).to_pylist()]
    return folders


@integration
def test_two_workers_answer_and_record_every_call_once_in_its_owners_folder(two_worker_proxy) -> None:
    proxy = two_worker_proxy
    sessions = [f"w-{uuid.uuid4().hex[:10]}" for _ in range(16)]
    for s in sessions:
        chat_through(proxy, s)
    for s in sessions:
        assert proxy.admin("POST", f"sessions/{s}/close")["flushed"]
    stats = proxy.admin("GET", "stats")
    assert stats["calls"] == 32 and stats["errors"] == {}
    assert [w["worker"] for w in stats["workers"]] == [0, 1] and sum(w["calls"] for w in stats["workers"]) == 32
    folders = records_by_folder(proxy)
    rows = [r for rs in folders.values() for r in rs]
    assert len(rows) == 32 and len({r["call_id"] for r in rows}) == 32  # none lost, none duplicated
    assert len({r["run_id"] for r in rows}) == 1
    for name, owner in ((proxy.records.name, 0), ("worker-1", 1)):
        for r in folders.get(name, []):
            assert worker_of(r["session_id"], 2) == owner  # attribution: the owner recorded it
    assert {worker_of(s, 2) for s in sessions} == {0, 1} and all(folders.values())
    for s in sessions:
        assert sorted(r["call_index"] for r in rows if r["session_id"] == s) == [0, 1]
    listed = {row["id"]: row for row in proxy.admin("GET", "sessions")["sessions"]}
    assert all(listed[s]["closed"] and listed[s]["calls"] == 2 for s in sessions)  # every worker's, closed
    r = httpx.post(f"http://127.0.0.1:{proxy.admin_port}/_harnessrl/admin/policy_version", json={"version": 3})
    assert r.status_code == 200 and r.json() == {"version": 3}


@integration
def test_a_killed_worker_is_started_again_and_loses_no_completed_call(two_worker_proxy) -> None:
    proxy = two_worker_proxy
    owned = [s for s in (f"k-{i}-{uuid.uuid4().hex[:6]}" for i in range(40)) if worker_of(s, 2) == 1][:4]
    for s in owned:
        chat_through(proxy, s, turns=1)
    (before,) = proxy.admin("GET", "stats")["worker_processes"]
    os.kill(before["pid"], signal.SIGKILL)  # no chance to flush: the write-ahead log must carry the calls
    refused = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # retry as a harness would, on the vendor's retryable answer
        try:
            chat_through(proxy, owned[0], turns=1)
            break
        except openai.APIStatusError as e:
            assert e.status_code in (502, 503), e
            refused = refused or e.status_code
        except openai.APIConnectionError:
            pass
        time.sleep(0.5)
    else:
        pytest.fail("the killed worker's session never got an answer again")
    wait_until(lambda: proxy.admin("GET", "stats")["worker_processes"][0]["restarts"] == 1, 30, "restart counted")
    (after,) = proxy.admin("GET", "stats")["worker_processes"]
    assert after["pid"] != before["pid"] and after["port"] is not None
    for s in owned:
        proxy.admin("POST", f"sessions/{s}/close")
    rows = records_by_folder(proxy)["worker-1"]
    for s in owned:
        completed = [r for r in rows if r["session_id"] == s and not r["incomplete"]]
        assert len(completed) == (2 if s == owned[0] else 1), s  # the recovered call plus the one after restart

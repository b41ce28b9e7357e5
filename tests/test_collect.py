"""tasks/collect.py: config validation, the rollout plan, scoring of one rollout, engine ownership, the CLI's env
mirroring, and one real mini collection (integration: real engine, mitmdump, Pi, the verifier)."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc
import pytest

from addon.launch import free_port
from addon.records.schema import read_records
from tasks import sandbox
from tasks.collect import (
    DEFAULT_HARNESSES,
    CollectConfig,
    CollectConfigError,
    Rollout,
    build_parser,
    collect,
    config_from_args,
    engine,
    episode,
    load_tasks,
    main,
    plan,
    rollout_timeout,
    uses_base_url,
)
from tasks.episodes import CallStats, read_episodes
from tasks.harnesses import HARNESSES, HarnessRun
from tasks.sandbox import SandboxConfig
from tasks.workspace import VerifierResult

ENGINE = "http://127.0.0.1:1"  # never contacted by the unit tests


def config(**kw) -> CollectConfig:
    return CollectConfig(**{"engine_url": ENGINE, "run_id": "r1", **kw})


# ------------------------------------------------------------------------------------------------ config


def test_defaults_are_the_harnesses_that_fit_the_context_and_a_run_dir_per_run() -> None:
    c = config()
    assert c.harnesses == DEFAULT_HARNESSES == ("pi", "mini-swe-agent")
    assert (c.tasks, c.group_size, c.concurrency, c.max_calls, c.reward) == ("smoke", 2, 2, 8, "pass_fail")
    assert c.run_dir == Path("runs/collect/r1")
    assert CollectConfig(engine_url=ENGINE).run_id != CollectConfig(engine_url=ENGINE).run_id


def test_all_expands_to_every_registered_harness() -> None:
    assert config(harnesses=("all",)).harnesses == tuple(HARNESSES)
    assert len(HARNESSES) == 10
    parsed = config_from_args(build_parser({"HARNESSES": "all"}).parse_args(["--engine-url", ENGINE]))
    assert parsed.harnesses == tuple(HARNESSES)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"harnesses": ("pi", "nope")}, "unknown harness.*nope.*known: claude-code"),
        ({"harnesses": ()}, "no harness selected"),
        ({"harnesses": ("pi", "pi")}, "listed twice"),
        ({"harnesses": ("all", "pi")}, "'all' already names every harness; list it alone"),
        ({"group_size": 0}, "group_size must be at least 1"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"max_calls": -1}, "max_calls must be >= 0"),
        ({"timeout_s": 0.0}, "timeout_s must be a positive"),
        ({"reward": "no_such_reward"}, "not a built-in"),
        ({"reward": "tasks.rewards:nothing_here"}, "has no attribute"),
        ({"run_id": "a:b"}, "run_id"),
        ({"engine_url": "localhost:8000"}, "http"),
        ({"engine_url": "", "engine_python": Path("/nonexistent/python")}, "make engine-env"),
        ({"tasks": ""}, "tasks is empty"),
        ({"temperature": 0.0}, r"temperature must be in \(0, 2\]"),
        ({"temperature": 2.5}, r"temperature must be in \(0, 2\]"),
        ({"route": "socks"}, "route must be one of proxy, base-url, got 'socks'"),
    ],
)
def test_invalid_settings_are_rejected_with_what_to_change(kw: dict, message: str) -> None:
    with pytest.raises(CollectConfigError, match=message):
        config(**kw)


def test_the_base_url_route_applies_to_harnesses_that_take_one() -> None:
    mini, pi = HARNESSES["mini-swe-agent"], HARNESSES["pi"]
    assert uses_base_url(config(route="base-url"), mini) and not uses_base_url(config(route="base-url"), pi)
    assert not uses_base_url(config(), mini)  # HTTPS_PROXY unless asked: the route a user configures


def test_tasks_resolve_from_a_subset_or_a_folder_and_unknown_names_list_the_known_ones(tmp_path: Path) -> None:
    smoke = load_tasks("smoke")
    assert {"hello-file", "write-number"} <= {t.id for t in smoke} and len(load_tasks("smoke", 2)) == 2
    assert [t.id for t in load_tasks(str(smoke.tasks[0].path))] == [smoke.tasks[0].id]
    with pytest.raises(CollectConfigError, match="no subset 'nonesuch'.*smoke"):
        load_tasks("nonesuch")


def test_plan_gives_every_rollout_its_session_and_group() -> None:
    c = config(harnesses=("pi", "mini-swe-agent"), group_size=3)
    tasks = load_tasks("smoke", 2)
    rollouts = plan(c, tasks)
    assert len(rollouts) == 2 * 2 * 3
    sessions = [r.session_id for r in rollouts]
    assert len(set(sessions)) == len(sessions)
    first = rollouts[0]
    assert first.session_id == f"r1-{first.task.id}-{first.spec.name}-0"
    assert first.group_id == f"{first.task.id}/{first.spec.name}"
    assert [r.sample_index for r in rollouts[:4]] == [0, 0, 0, 0]  # every group's first sample comes first
    # within a sample, one harness's rollouts follow each other (its prompt prefix is still cached)
    assert [r.spec.name for r in rollouts[:4]] == ["pi", "pi", "mini-swe-agent", "mini-swe-agent"]
    shuffled = plan(config(harnesses=("pi", "mini-swe-agent"), group_size=3, seed=7), tasks)
    assert sorted(r.session_id for r in shuffled) == sorted(sessions) and shuffled != rollouts
    assert shuffled == plan(config(harnesses=("pi", "mini-swe-agent"), group_size=3, seed=7), tasks)


def test_a_rollouts_time_limit_is_the_task_timeout_raised_to_the_harness_limit() -> None:
    task = load_tasks("smoke").tasks[0]  # agent timeout 120 s
    codex = Rollout(task, HARNESSES["codex"], 0, "s")
    assert rollout_timeout(codex, config()) == max(HARNESSES["codex"].timeout_s, task.agent_timeout_s) > 120
    assert rollout_timeout(codex, config(timeout_s=30.0)) == 30.0


# ------------------------------------------------------------------------------------------------ scoring


def rollout() -> Rollout:
    task = load_tasks("smoke").tasks[0]
    return Rollout(task, HARNESSES["pi"], 1, f"r1-{task.id}-pi-1")


def harness_run(exit_code: int | None = 0, timed_out: bool = False) -> HarnessRun:
    return HarnessRun("pi", "0.73.1", exit_code, "out", "err" * 1000, 3.0, timed_out)


def verdict(passed: bool) -> VerifierResult:
    return VerifierResult(1.0 if passed else 0.0, passed, "ok", 0, 0.2, "" if passed else "FAIL: missing")


def score(run, result, stats=CallStats(tool_call_count=3, calls=2), reward="tool_shaping", error=None):
    c = config(reward=reward)
    return episode(rollout(), c, c.rewarder(), datetime.now(UTC), 4.0, run, result, stats, error)


def test_a_passed_episode_is_scored_with_its_tool_calls() -> None:
    ep = score(harness_run(), verdict(True))
    assert ep.verifier_passed and not ep.crashed and ep.reward == pytest.approx(1 + 0.1 * 15 / 18)
    assert set(ep.reward_components) == {"correct", "tool_bonus"}
    assert (ep.group_id, ep.task_group_id, ep.sample_index) == (f"{ep.task_id}/pi", ep.task_id, 1)
    assert ep.harness_version == HARNESSES["pi"].version and len(ep.stderr_tail) == 2000


def test_a_nonzero_exit_is_a_crash_unless_a_budget_stopped_it() -> None:
    crashed = score(harness_run(exit_code=1), verdict(True))
    assert crashed.crashed and crashed.reward == 0.0 and crashed.reward_components == {"crash": 0.0}
    stopped = score(harness_run(exit_code=1), verdict(True), CallStats(calls=8, budget_stop="max_calls=8"))
    assert not stopped.crashed and stopped.reward_components == {"budget_stop": 0.0}
    timed_out = score(harness_run(exit_code=None, timed_out=True), verdict(False))
    assert timed_out.timed_out and not timed_out.crashed and timed_out.reward_components == {"budget_stop": 0.0}


def test_a_rollout_that_never_ran_is_an_error_episode() -> None:
    ep = score(None, None, CallStats(), "pass_fail", error="OSError: no space")
    assert ep.crashed and ep.error == "OSError: no space" and ep.verifier_reward is None and ep.reward == 0.0


# ------------------------------------------------------------------------------------------------ engine ownership


FAKE_ENGINE_CLI = """#!/usr/bin/env bash
# Stands in for `python -m trainer.engine`: logs each subcommand; `status` exits $FAKE_STATUS.
shift 2; echo "$1" >> "{log}"
case "$1" in
  status) exit "$FAKE_STATUS" ;;
  serve) echo "http://127.0.0.1:9/" ;;
esac
"""


@pytest.mark.parametrize(("status", "expected"), [(1, ["status", "serve", "stop"]), (0, ["status", "serve"])])
def test_the_engine_is_stopped_only_when_this_run_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, expected: list[str]
) -> None:
    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(FAKE_ENGINE_CLI.format(log=log))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_STATUS", str(status))
    c = config(engine_url="", engine_python=fake, engine_run_dir=tmp_path / "engine")
    with (tmp_path / "collect.log").open("w") as out, engine(c, out) as url:
        assert url == "http://127.0.0.1:9/"
    assert log.read_text().split() == expected


def test_an_unhealthy_engine_url_is_refused() -> None:
    with pytest.raises(CollectConfigError, match="does not answer /health"):
        with engine(config(engine_url=f"http://127.0.0.1:{free_port()}"), io.StringIO()):
            pass


def test_several_engine_urls_are_checked_and_passed_on_as_one_list(smollm2_tokenizer_dir: Path) -> None:
    """Two FAKE engines (benchmarks/fake_engine.py, subprocesses): both healthy -> the proxies get both; one of them
    killed -> refused, naming it."""
    from benchmarks import fake_engine

    fakes = [fake_engine.spawn(smollm2_tokenizer_dir, free_port()) for _ in range(2)]
    try:
        urls = f"{fakes[0].url}/, {fakes[1].url}"
        out = io.StringIO()
        with engine(config(engine_url=urls), out) as url:
            assert url == f"{fakes[0].url},{fakes[1].url}"
        assert "2 engine(s) serving fake-engine" in out.getvalue()
        fakes[1].kill()
        with pytest.raises(CollectConfigError, match=f"engine {fakes[1].url} does not answer /health"):
            with engine(config(engine_url=urls), io.StringIO()):
                pass
    finally:
        for f in fakes:
            f.stop()
    with pytest.raises(CollectConfigError, match="engine_url: engine URL listed twice"):
        config(engine_url=f"{fakes[0].url},{fakes[0].url}/")


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_flags_mirror_the_make_variables() -> None:
    env = {"HARNESSES": "pi", "TASKS": "easy", "GROUP_SIZE": "4", "MODEL": "some/model", "ENGINE_URL": ENGINE}
    c = config_from_args(build_parser(env).parse_args(["--run-id", "x1", "--on-crash", "score"]))
    assert (c.harnesses, c.tasks, c.group_size, c.model, c.engine_url) == (("pi",), "easy", 4, "some/model", ENGINE)
    assert c.on_crash == "score" and c.run_id == "x1" and c.on_budget_stop == 0.0
    budget = {"ON_BUDGET_STOP": "score", "ON_CRASH": "-1", "MAX_CALLS": "2"}
    c = config_from_args(build_parser(env | budget).parse_args([]))
    assert (c.on_budget_stop, c.on_crash, c.max_calls) == ("score", -1.0, 2)
    flags = build_parser(env).parse_args(["--harnesses", "pi,mini-swe-agent", "-G", "3", "--tasks", "smoke"])
    c = config_from_args(flags)
    assert (c.harnesses, c.group_size, c.tasks) == (("pi", "mini-swe-agent"), 3, "smoke")
    assert c.temperature is None  # the harness's own request decides
    assert config_from_args(build_parser(env).parse_args(["--temperature", "0.7"])).temperature == 0.7


def test_cli_reports_a_bad_setting_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--harnesses", "nope", "--engine-url", ENGINE], env={}) == 2
    assert "unknown harness(es) nope" in capsys.readouterr().err
    assert main(["--tasks", "nonesuch", "--engine-url", ENGINE], env={}) == 2


def test_sandbox_flags_and_an_unavailable_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--sandbox", "none", "--memory-mb", "512", "--cpu-seconds", "30", "--engine-url", ENGINE]
    c = config_from_args(build_parser({}).parse_args(args))
    assert c.sandbox == SandboxConfig(mode="none", memory_mb=512, cpu_seconds=30.0)
    assert config_from_args(build_parser({}).parse_args(["--engine-url", ENGINE])).sandbox.mode == "namespaces"
    with pytest.raises(CollectConfigError, match="memory_mb"):
        config_from_args(build_parser({}).parse_args(["--memory-mb", "0", "--engine-url", ENGINE]))
    monkeypatch.setattr(sandbox, "UNSHARE", ("unshare", "--no-such-namespace-flag"))
    with pytest.raises(CollectConfigError, match="pass --sandbox none"):
        config()  # no silent fallback to running unsandboxed
    assert config(sandbox=SandboxConfig(mode="none")).sandbox.mode == "none"


# ------------------------------------------------------------------------------------------------ integration


@pytest.mark.integration
def test_a_real_mini_collection(engine_url: str, tmp_path: Path) -> None:
    """2 smoke tasks x Pi x G=2 through a real proxy: episodes joined to captured calls, rewards, summary files."""
    c = CollectConfig(tasks="smoke", harnesses=("pi",), group_size=2, max_tasks=2, engine_url=engine_url,
                      run_dir=tmp_path / "run", max_calls=4, reward="tool_shaping", timeout_s=180.0)  # fmt: skip
    log = io.StringIO()
    result = collect(c, log)
    assert not result.interrupted
    eps = read_episodes(result.files["episodes"])
    assert len(eps) == 4 and {e.session_id for e in eps} == {r.session_id for r in plan(c, load_tasks("smoke", 2))}
    calls = read_records(tmp_path / "run" / "records")
    for e in eps:
        assert e.error is None, e.error
        rows = calls.filter(pc.field("session_id") == e.session_id)
        assert rows.num_rows == e.stats.calls >= 1, f"{e.session_id}: no captured call\n{e.stderr_tail}"
        assert set(rows["run_id"].to_pylist()) == {c.run_id}
        assert e.stats.tool_call_count == sum(rows["tool_call_count"].to_pylist())
        assert e.verifier_status == "ok" and e.reward_components and e.reward >= 0
        assert e.stats.session_grade in ("ok", "warn", "bad") and e.stats.calls <= c.max_calls + 1
    for name in ("csv", "markdown", "pass_at_1", "tool_calls"):
        assert result.files[name].stat().st_size > 0
    assert "4/4" in log.getvalue()
    print("\n" + result.files["markdown"].read_text())
    assert os.listdir(tmp_path / "run")  # nothing else asserted about the folder layout


@pytest.mark.integration
def test_the_base_url_route_records_every_call_without_a_mitmproxy_flow(engine_url: str, tmp_path: Path) -> None:
    """``--route base-url``: mini-swe-agent calls the internal server straight from its sandbox; mitmproxy, which logs
    each flow it relays (``POST http://127.0.0.1:PORT/_harnessrl/call``), sees none of them."""
    c = config(tasks="smoke", max_tasks=1, harnesses=("mini-swe-agent",), group_size=1, engine_url=engine_url,
               run_dir=tmp_path / "run", route="base-url")  # fmt: skip
    log = io.StringIO()
    result = collect(c, log=log)
    (e,) = result.episodes
    assert e.error is None and e.stats.calls >= 1, e.stderr_tail
    calls = read_records(tmp_path / "run" / "records")
    assert calls.filter(pc.field("session_id") == e.session_id).num_rows == e.stats.calls
    assert "base URL (no mitmproxy hop) for mini-swe-agent" in log.getvalue()
    (proxy_log,) = (tmp_path / "run").glob("proxy-*/mitmdump.log")
    assert "/_harnessrl/call" not in proxy_log.read_text()


@pytest.mark.integration
def test_sigterm_stops_the_collection_and_everything_it_started(engine_url: str, tmp_path: Path) -> None:
    """`kill <collect>` mid-rollout: it exits 130 and no process it started (proxy, relay, harness) survives."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "tasks.collect", "--tasks", "warmup", "--max-tasks", "1", "--harnesses",
           "mini-swe-agent", "--group-size", "1", "--engine-url", engine_url,
           "--run-dir", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    started: set[int] = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any("mini" in cmdline(p) for p in started):
        started |= descendants(proc.pid)  # wait until the harness itself runs
        time.sleep(0.2)
    assert started, "collect started no process"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    time.sleep(1)
    survivors = [f"{p}: {cmdline(p)}" for p in started if alive(p)]
    assert not survivors, survivors


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat_file.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


KILL_PROBE = """
import signal, subprocess, sys
from tasks.collect import kill_child_groups
leader = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
grandchild = int(leader.stdout.readline())
kill_child_groups(signal.SIGTERM)
print(leader.wait(timeout=10), grandchild)
"""


def test_interrupt_kills_each_child_process_group(tmp_path: Path) -> None:
    """In a subprocess of its own: in the test process it would also hit the fixtures' proxies."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", KILL_PROBE], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    status, grandchild = out.stdout.split()
    assert int(status) == -signal.SIGTERM
    assert not alive(int(grandchild)), "the harness's own child survived"


STOP_PROBE = """
import subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from tasks.collect import stop_rollouts
def rollout():
    time.sleep(0.6)  # starts its process after the first round of signals: what a single kill would miss
    return subprocess.Popen(["bash", "-c", sys.argv[1]], start_new_session=True).wait()
fut = ThreadPoolExecutor(1).submit(rollout)
t0 = time.monotonic()
stop_rollouts([fut], sys.stderr, grace_s=float(sys.argv[2]))
print(fut.result(), time.monotonic() - t0)
"""


@pytest.mark.parametrize(
    ("script", "grace_s", "status"),
    [("sleep 300", 30.0, -signal.SIGTERM), ("trap '' TERM; sleep 300", 1.0, -signal.SIGKILL)],
    ids=["sigterm", "sigkill_after_grace"],
)
def test_stop_rollouts_ends_a_process_started_after_the_first_signal(script: str, grace_s: float, status: int) -> None:
    """The stop signals the child groups until the rollouts return: SIGTERM, then SIGKILL for one that ignores it."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", STOP_PROBE, script, str(grace_s)], cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=60,
                         check=True)  # fmt: skip
    got, waited = out.stdout.split()
    assert int(got) == status
    assert float(waited) < grace_s + 5


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

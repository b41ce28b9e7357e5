"""Workspace preparation, script isolation (HOME, TMPDIR, process group, timeout) and reading the reward file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tasks.sandbox import SandboxConfig
from tasks.taskset import load_task
from tasks.workspace import prepare_workspace, read_reward, run_solution, run_verifier
from tests.task_factory import DEFAULT_TOML, make_task


def _verifier(tmp_path: Path, body: str, toml: str = DEFAULT_TOML, files: dict[str, str] | None = None):
    task = load_task(make_task(tmp_path / "src", "t", toml=toml, test_sh=f"#!/usr/bin/env bash\n{body}\n", files=files))
    ws = prepare_workspace(task, tmp_path / "ws").path
    return task, ws


def test_prepare_copies_environment_and_records_dockerfile(tmp_path: Path) -> None:
    files = {"a.txt": "A\n", "pkg/b.py": "B = 1\n", "Dockerfile": "FROM python:3.12\n", ".dockerignore": "x\n"}
    task = load_task(make_task(tmp_path / "src", "t", files=files))
    ws = prepare_workspace(task, tmp_path / "ws")
    assert ws.path == (tmp_path / "ws").resolve()
    assert sorted(str(p.relative_to(ws.path)) for p in ws.path.rglob("*")) == ["a.txt", "pkg", "pkg/b.py"]
    assert (ws.path / "pkg" / "b.py").read_text() == "B = 1\n"
    assert [n.split(":")[0] for n in ws.not_applied] == ["environment/.dockerignore", "environment/Dockerfile"]
    assert "no container engine" in ws.not_applied[0]
    # tests/ and solution/ never reach the workspace
    assert not (ws.path / "tests").exists() and not (ws.path / "solution").exists()


def test_prepare_without_environment_and_refuses_non_empty(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "src", "t"))
    assert prepare_workspace(task, tmp_path / "ws").not_applied == ()
    (tmp_path / "ws" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        prepare_workspace(task, tmp_path / "ws")


def test_verifier_reward_and_isolated_environment(tmp_path: Path) -> None:
    body = """\
echo "home=$HOME tmp=$TMPDIR tests=$TESTS_DIR logs=$LOGS_DIR pwd=$(pwd) extra=$EXTRA flag=$FLAG"
echo 0.75 > "$REWARD_FILE"
exit 3"""
    toml = DEFAULT_TOML.replace("[verifier]\n", '[verifier]\nenv = { FLAG = "from-toml" }\n')
    task, ws = _verifier(tmp_path, body, toml)
    result = run_verifier(task, ws, extra_env={"EXTRA": "given"})
    assert (result.reward, result.status, result.passed, result.exit_status) == (0.75, "ok", False, 3)
    fields = dict(kv.split("=", 1) for kv in result.output_tail.split())
    assert fields["pwd"] == str(ws) and fields["extra"] == "given" and fields["flag"] == "from-toml"
    for key in ("home", "tmp", "tests", "logs"):
        assert not fields[key].startswith(str(ws)), key  # nothing of the run lands in the workspace
        assert fields[key] != os.environ.get("HOME")
        assert not Path(fields[key]).exists(), key  # the scratch folder is removed afterwards
    assert result.duration_s > 0


def test_passed_needs_max_reward(tmp_path: Path) -> None:
    toml = DEFAULT_TOML.replace("[verifier]", "max_reward = 2.0\n\n[verifier]")
    task, ws = _verifier(tmp_path, 'echo 2 > "$REWARD_FILE"', toml)
    assert task.max_reward == 2.0
    result = run_verifier(task, ws)
    assert result.passed and result.reward == 2.0


def test_reward_json_fallback(tmp_path: Path) -> None:
    task, ws = _verifier(tmp_path, 'echo \'{"reward": 1, "runtime_sec": 2.5}\' > "$LOGS_DIR/verifier/reward.json"')
    result = run_verifier(task, ws)
    assert (result.reward, result.status, result.passed) == (1.0, "ok", True)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, (0.0, "no_reward")),
        ({"reward.txt": "yes\n"}, (0.0, "bad_reward")),
        ({"reward.txt": "nan\n"}, (0.0, "bad_reward")),
        ({"reward.txt": " 0.5 \n"}, (0.5, "ok")),
        ({"reward.json": '{"accuracy": 0.25}'}, (0.25, "ok")),
        ({"reward.json": '{"a": 1, "b": 2}'}, (0.0, "bad_reward")),
        ({"reward.json": '{"reward": "high"}'}, (0.0, "bad_reward")),
        ({"reward.json": "{"}, (0.0, "bad_reward")),
        ({"reward.txt": "1", "reward.json": '{"reward": 0}'}, (1.0, "ok")),
    ],
)
def test_read_reward(tmp_path: Path, files: dict[str, str], expected: tuple[float, str]) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    reward, status, why = read_reward(tmp_path / "reward.txt")
    assert (reward, status) == expected
    assert bool(why) == (status != "ok")


def test_missing_reward_is_reported_in_output(tmp_path: Path) -> None:
    task, ws = _verifier(tmp_path, "echo checking")
    result = run_verifier(task, ws)
    assert (result.reward, result.status, result.passed, result.exit_status) == (0.0, "no_reward", False, 0)
    assert "checking" in result.output_tail and "wrote no reward" in result.output_tail


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = f"""\
sleep 60 &
echo $! > {pidfile}
echo 1 > "$REWARD_FILE"
sleep 60"""
    task, ws = _verifier(tmp_path, body)
    start = time.monotonic()
    result = run_verifier(task, ws, timeout_s=1.0)
    assert time.monotonic() - start < 10
    assert (result.status, result.reward, result.exit_status, result.passed) == ("timeout", 0.0, None, False)
    assert "timed out" in result.output_tail
    _assert_dead(int(pidfile.read_text()))


def test_background_processes_die_when_the_script_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    task, ws = _verifier(tmp_path, f'sleep 60 &\necho $! > {pidfile}\necho 1 > "$REWARD_FILE"')
    assert run_verifier(task, ws).passed
    _assert_dead(int(pidfile.read_text()))


def _assert_dead(pid: int) -> None:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if _zombie(pid):  # killed, waiting for its (re)parent to reap it
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} is still running")


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_run_solution(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "src", "t"))
    ws = prepare_workspace(task, tmp_path / "ws").path
    run = run_solution(task, ws)
    assert (run.exit_status, run.timed_out) == (0, False)
    assert (ws / "done.txt").read_text() == "done\n"
    assert run_verifier(task, ws).passed

    bare = load_task(make_task(tmp_path / "src", "bare", solve_sh=None))
    with pytest.raises(FileNotFoundError, match="no oracle solution"):
        run_solution(bare, ws)


def test_sandboxed_scripts_see_the_harbor_paths_and_no_network(tmp_path: Path) -> None:
    body = """\
echo "pwd=$(pwd) work=$TASK_WORKDIR tests=$TESTS_DIR reward=$REWARD_FILE"
cat /app/given.txt /tests/test.sh > /dev/null && echo seen
python3 -c "import socket; socket.getaddrinfo('pypi.org', 443)" 2>/dev/null || echo offline
echo 1 > /logs/verifier/reward.txt"""
    task, ws = _verifier(tmp_path, body, files={"given.txt": "x\n"})
    result = run_verifier(task, ws, sandbox=SandboxConfig())
    assert (result.reward, result.status, result.passed) == (1.0, "ok", True), result.output_tail
    first, seen, offline = result.output_tail.splitlines()[:3]
    assert first == "pwd=/app work=/app tests=/tests reward=/logs/verifier/reward.txt"
    assert (seen, offline) == ("seen", "offline")
    assert not Path("/app/given.txt").exists()  # mapped, never written on the host


def test_sandboxed_solution_writes_into_the_workspace(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path / "src", "t", solve_sh="#!/usr/bin/env bash\necho done > /app/out.txt\n"))
    ws = prepare_workspace(task, tmp_path / "ws").path
    run = run_solution(task, ws, sandbox=SandboxConfig())
    assert run.exit_status == 0, run.output_tail
    assert (ws / "out.txt").read_text() == "done\n"

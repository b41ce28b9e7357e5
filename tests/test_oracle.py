"""The oracle check: the whole built-in set passes; broken tasks are caught and named; the CLI's output and exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.oracle import check_task, check_taskset, main, summary_table
from tasks.sandbox import SandboxConfig
from tasks.taskset import TaskSet, builtin_taskset, load_task, load_taskset
from tasks.workspace import prepare_workspace, run_verifier
from tests.task_factory import make_task

ROOT = Path(__file__).resolve().parents[1]


def test_every_builtin_task_passes_the_oracle_check() -> None:
    ts = builtin_taskset()
    seen: list[str] = []
    start = time.monotonic()
    outcomes = check_taskset(ts, jobs=2, progress=lambda done, total, o: seen.append(f"{done}/{total}"))
    elapsed = time.monotonic() - start
    failing = {o.task.id: o.problems for o in outcomes if not o.ok}
    assert not failing, failing
    assert [o.task.id for o in outcomes] == [t.id for t in ts]
    assert seen == [f"{i}/{len(ts)}" for i in range(1, len(ts) + 1)]
    for o in outcomes:
        assert o.untouched is not None and o.untouched.reward == 0 and o.untouched.status == "ok", o.task.id
        assert o.solved is not None and o.solved.passed, o.task.id
        # verifiers take well under 2 s on an idle machine; the bound leaves room for a loaded CI runner
        assert o.untouched.duration_s < 5 and o.solved.duration_s < 5, o.task.id
    assert elapsed < 120


def test_untouched_failures_print_a_reason() -> None:
    outcome = check_task(builtin_taskset().get("fix-off-by-one"))
    assert outcome.untouched is not None
    assert "FAIL: page(items, 1, 10): expected" in outcome.untouched.output_tail


# Passes whatever the workspace holds: a task that teaches nothing.
ALWAYS_PASS = '#!/usr/bin/env bash\necho 1 > "$REWARD_FILE"\n'


def test_broken_tasks_are_caught(tmp_path: Path) -> None:
    cases = {
        "passes-untouched": make_task(tmp_path, "passes-untouched", test_sh=ALWAYS_PASS),
        "wrong-solution": make_task(tmp_path, "wrong-solution", solve_sh="#!/usr/bin/env bash\necho nope > done.txt\n"),
        "failing-solution": make_task(tmp_path, "failing-solution", solve_sh="#!/usr/bin/env bash\nexit 4\n"),
        "no-solution": make_task(tmp_path, "no-solution", solve_sh=None),
        "no-reward": make_task(tmp_path, "no-reward", test_sh="#!/usr/bin/env bash\necho hi\n"),
    }
    expect = {
        "passes-untouched": "untouched workspace: reward 1 (ok), must be 0",
        "wrong-solution": "solved workspace: reward 0 (ok), needs 1",
        "failing-solution": "solution/solve.sh exited 4",
        "no-solution": "no solution/solve.sh",
        "no-reward": "untouched workspace: reward 0 (no_reward)",
    }
    for name, path in cases.items():
        outcome = check_task(load_task(path))
        assert not outcome.ok, name
        assert any(expect[name] in p for p in outcome.problems), (name, outcome.problems)
    good = check_task(load_task(make_task(tmp_path, "good")))
    assert good.ok, good.problems


def test_summary_table_lists_each_task(tmp_path: Path) -> None:
    make_task(tmp_path, "good")
    make_task(tmp_path, "bad", test_sh=ALWAYS_PASS)
    outcomes = check_taskset(load_taskset(tmp_path), jobs=2)
    lines = summary_table(outcomes).splitlines()
    assert lines[0].split() == ["task", "difficulty", "untouched", "solved", "secs", "result"]
    assert lines[1].split()[:4] == ["bad", "easy", "1", "1"] and lines[1].endswith("FAIL")
    assert lines[2].split()[:4] == ["good", "easy", "0", "1"] and lines[2].endswith("ok")


def test_cli_exit_codes_and_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_task(tmp_path, "good")
    make_task(tmp_path, "lazy-verifier", test_sh=ALWAYS_PASS)
    assert main(["--tasks", str(tmp_path), "--jobs", "2"]) == 1
    out = capsys.readouterr()
    assert "oracle check FAILED for 1 task(s): lazy-verifier" in out.out
    assert "2 tasks (easy 2) checked in" in out.out
    assert "[  2/2]" in out.err  # progress line
    assert main(["--tasks", str(tmp_path / "good")]) == 0
    assert "oracle check passed" in capsys.readouterr().out
    assert main(["--tasks", str(tmp_path / "missing")]) == 2
    assert main(["--tasks", str(tmp_path), "--subset", "nope"]) == 2
    assert "no subset 'nope'" in capsys.readouterr().err


def test_cli_as_module_on_the_smoke_subset() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tasks.oracle", "--subset", "smoke", "--jobs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/local/bin:/usr/bin:/bin:" + str(Path(sys.executable).parent)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "oracle check passed" in run.stdout and "hello-file" in run.stdout


def test_the_warmup_and_smoke_subsets_pass_in_the_sandbox_with_the_harbor_paths() -> None:
    tasks = TaskSet("sandboxed", builtin_taskset("warmup").tasks + builtin_taskset("smoke").tasks[:2])
    outcomes = check_taskset(tasks, jobs=2, sandbox=SandboxConfig())
    assert {o.task.id: o.problems for o in outcomes if not o.ok} == {}


@pytest.mark.parametrize(
    ("task_id", "attempt", "reward"),
    [
        ("warmup-echo-hello", {}, 0.0),
        ("warmup-echo-hello", {".hidden-state": "x"}, 0.0),  # a harness's own files earn nothing
        ("warmup-echo-hello", {"hello": "hello"}, 0.25),  # something was made, not the right file
        ("warmup-echo-hello", {"hello.txt": "Hello, world"}, 0.5),  # the right file, wrong content
        ("warmup-echo-hello", {"hello.txt": "hello\n"}, 1.0),
        ("warmup-touch", {"done": ""}, 0.5),
        ("warmup-copy", {"copy.txt": "morning"}, 0.5),
        ("warmup-rename", {"final.txt": "version one\n"}, 0.5),  # copied, not moved: draft.txt is still there
        ("warmup-rename", {"draft.txt": None}, 0.0),  # deleting alone earns nothing
        ("warmup-copy", {"greeting.txt": "good night\n"}, 0.25),  # a given file's content changed
    ],
)
def test_warmup_verifiers_climb_a_ladder(
    tmp_path: Path, task_id: str, attempt: dict[str, str | None], reward: float
) -> None:
    task = builtin_taskset("warmup").get(task_id)
    ws = prepare_workspace(task, tmp_path / "ws").path
    for name, content in attempt.items():
        if content is None:
            (ws / name).unlink()
        else:
            (ws / name).write_text(content)
    result = run_verifier(task, ws)
    assert (result.status, result.reward) == ("ok", reward), result.output_tail

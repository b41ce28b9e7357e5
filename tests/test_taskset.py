"""The Task model and loader: the built-in set's shape, subsets, Harbor fields, and errors naming file and field."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tasks.taskset import BUILTIN_DIR, TaskFormatError, builtin_taskset, load_task, load_taskset
from tests.task_factory import DEFAULT_TOML, make_task


def test_builtin_set_has_forty_varied_tasks() -> None:
    ts = builtin_taskset()
    assert len(ts) >= 40
    per = {d: len(ts.subset(d)) for d in ("easy", "medium", "hard")}
    assert min(per.values()) >= 8, per
    categories = {t.category for t in ts}
    assert {"file-ops", "bugfix", "implement", "config", "repo-qa", "refactor"} <= categories
    for task in ts:
        assert task.solution_script is not None, task.id
        assert (task.tests_dir / "test.sh").is_file(), task.id
        assert task.instruction.strip(), task.id
        # the verifier's files stay out of the workspace source
        assert not (task.environment_dir / "test.sh").exists(), task.id
        assert task.verifier_timeout_s == 30.0 and task.agent_timeout_s >= 120.0


def test_smoke_subset_is_a_handful_of_trivial_tasks() -> None:
    smoke = builtin_taskset("smoke")
    assert 3 <= len(smoke) <= 8
    assert {t.difficulty for t in smoke} == {"easy"}
    assert "hello-file" in {t.id for t in smoke}
    assert smoke.name == "builtin:smoke"


def test_warmup_subset_names_the_command_and_gives_partial_credit() -> None:
    warmup = builtin_taskset("warmup")
    assert len(warmup) >= 5
    for task in warmup:
        assert task.difficulty == "easy" and "partial-credit" in task.tags, task.id
        assert "```" in task.instruction and "shell command" in task.instruction, task.id  # the one command to run


def test_subset_names_and_unknown_subset() -> None:
    ts = builtin_taskset()
    names = ts.subset_names()
    assert names[:4] == ("all", "easy", "hard", "medium")
    assert "smoke" in names and "python" in names
    assert ts.subset("all") is ts
    with pytest.raises(KeyError, match="no subset 'nope'.*smoke"):
        ts.subset("nope")


def test_get_by_id() -> None:
    ts = builtin_taskset()
    assert ts.get("hello-file").difficulty == "easy"
    with pytest.raises(KeyError, match="missing-task"):
        ts.get("missing-task")


def test_load_single_task_and_fields(tmp_path: Path) -> None:
    toml = DEFAULT_TOML.replace("[verifier]\ntimeout_sec = 20.0", '[verifier]\ntimeout_sec = 20.0\nenv = { A = "b" }')
    task_dir = make_task(tmp_path, "one", toml=toml + '\n[solution]\nenv = { S = "t" }\n')
    ts = load_taskset(task_dir)
    assert [t.id for t in ts] == ["one"]
    task = ts.get("one")
    assert task.path == task_dir.resolve()
    assert task.instruction == "Write done into done.txt.\n"
    assert (task.version, task.difficulty, task.category, task.tags) == ("1.0", "easy", "file-ops", ("demo",))
    assert (task.verifier_timeout_s, task.agent_timeout_s, task.max_reward) == (20.0, 60.0, 1.0)
    assert dict(task.verifier_env) == {"A": "b"} and dict(task.solution_env) == {"S": "t"}
    assert task.dockerfile is None
    assert {task: 1}[load_task(task_dir)] == 1  # hashable, equal when loaded twice


def test_load_directory_sorted_skipping_hidden(tmp_path: Path) -> None:
    for name in ("b-task", "a-task", ".hidden", "_private"):
        make_task(tmp_path, name)
    ts = load_taskset(tmp_path, name="mine")
    assert [t.id for t in ts] == ["a-task", "b-task"]
    assert ts.name == "mine"


def test_harbor_newer_schema_and_defaults(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    toml = """\
schema_version = "1.1"
source = "somewhere"
surprise = 1

[task]
name = "org/thing"
keywords = ["k1", "demo"]

[metadata]
difficulty_explanation = "why"

[environment]
cpus = 2
memory_mb = 1024
allow_internet = false
"""
    with caplog.at_level(logging.INFO, logger="harnessrl.tasks"):
        task = load_task(make_task(tmp_path, "newer", toml=toml, files={"Dockerfile": "FROM scratch\n"}))
    assert task.version == "1.1"
    assert task.difficulty == "unknown"
    assert task.tags == ("k1", "demo")
    assert task.verifier_timeout_s == 600.0 and task.agent_timeout_s == 600.0
    assert task.metadata["difficulty_explanation"] == "why"
    assert task.environment["cpus"] == 2
    assert task.dockerfile == task.path / "environment" / "Dockerfile"
    text = caplog.text
    assert "environment.allow_internet, environment.cpus, environment.memory_mb" in text  # recorded but not enforced
    assert "surprise" in text  # unknown to Harbor: logged, not dropped silently


def _error(tmp_path: Path, **kw: object) -> str:
    task_dir = make_task(tmp_path, "bad", **kw)  # type: ignore[arg-type]
    with pytest.raises(TaskFormatError) as e:
        load_task(task_dir)
    return str(e.value)


@pytest.mark.parametrize(
    ("kw", "file", "words"),
    [
        ({"instruction": None}, "instruction.md", "missing"),
        ({"instruction": "  \n"}, "instruction.md", "empty"),
        ({"test_sh": None}, "tests/test.sh", "missing"),
        ({"toml": None}, "task.toml", "missing"),
        ({"toml": "version = \n"}, "task.toml", "not valid TOML"),
        ({"toml": "[metadata]\n"}, "task.toml", "'version' is required"),
        ({"toml": 'version = "1.0"\n[metadata]\ndifficulty = "extreme"\n'}, "task.toml", "'metadata.difficulty'"),
        ({"toml": 'version = "1.0"\n[verifier]\ntimeout_sec = -1\n'}, "task.toml", "'verifier.timeout_sec'"),
        ({"toml": 'version = "1.0"\n[agent]\ntimeout_sec = "long"\n'}, "task.toml", "'agent.timeout_sec'"),
        ({"toml": 'version = "1.0"\n[metadata]\ntags = "a,b"\n'}, "task.toml", "'metadata.tags'"),
        ({"toml": 'version = "1.0"\n[verifier]\nenv = { A = 1 }\n'}, "task.toml", "'verifier.env'"),
        ({"toml": 'version = "1.0"\nverifier = 3\n'}, "task.toml", "'verifier' must be a table"),
        ({"toml": 'version = "1.0"\n[metadata]\nmax_reward = 0\n'}, "task.toml", "'metadata.max_reward'"),
        ({"toml": 'version = "1.0"\n[metadata]\ncategory = 7\n'}, "task.toml", "'metadata.category'"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, kw: dict, file: str, words: str) -> None:
    message = _error(tmp_path, **kw)
    assert str(tmp_path / "bad" / file) in message
    assert words in message


def test_multi_step_tasks_rejected(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, "steps")
    (task_dir / "steps" / "one").mkdir(parents=True)
    with pytest.raises(TaskFormatError, match="multi-step"):
        load_task(task_dir)


def test_empty_or_missing_directories(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="no such task directory"):
        load_taskset(tmp_path / "nothing")
    with pytest.raises(TaskFormatError, match="holds no task directories"):
        load_taskset(tmp_path)
    with pytest.raises(TaskFormatError, match="not a task directory"):
        load_task(tmp_path / "nothing")


def test_builtin_dir_is_inside_the_package() -> None:
    assert BUILTIN_DIR.parent.name == "tasks" and (BUILTIN_DIR / "hello-file" / "task.toml").is_file()

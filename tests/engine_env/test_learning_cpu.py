"""benchmarks/learning_cpu.py's wiring, with the engine, the training loop and the collects replaced by recorders
(named fakes: a real run takes tens of minutes and is the benchmark itself). Checked: both arms of a seed get the
same collect seed and run-folder name, the control learns at rate 0, held-out tasks never reach training, every
checkpoint is evaluated on the held-out side, and the page and chart are written."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import learning_cpu
from tasks.episodes import CallStats, EpisodeRecord, write_episodes
from trainer import evaluate

T0 = datetime(2026, 12, 4, tzinfo=UTC)


def ep(task: str, reward: float) -> EpisodeRecord:
    return EpisodeRecord(
        run_id="r", session_id=f"{task}-{reward}", task_id=task, task_version="1", harness="mini-swe-agent",
        harness_version="1", group_id=f"{task}/mini-swe-agent", task_group_id=task, sample_index=0, started_at=T0,
        reward=reward, reward_components={}, verifier_passed=reward >= 1, verifier_reward=reward, verifier_status="ok",
        verifier_output_tail="", exit_status=0, timed_out=False, crashed=False, wall_s=1.0, harness_s=1.0,
        stderr_tail="", stats=CallStats(calls=2, tool_call_count=1),
    )  # fmt: skip


def test_both_arms_share_seed_and_names_and_only_the_treatment_learns(tmp_path: Path, monkeypatch) -> None:
    trained: list[dict[str, Any]] = []
    evaluated: list[tuple[str, str]] = []

    def fake_train_run(run: Any, args: Any) -> Any:  # writes what a finished run leaves: episodes per iteration
        trained.append({"run": run, "lr": args.learning_rate})
        treated = args.learning_rate > 0
        for i in range(1, run.iterations + 1):
            folder = run.run_dir / f"iter-{i:04d}" / "collect"
            folder.mkdir(parents=True)
            write_episodes(folder / "episodes.parquet", [ep("t", 0.5 * i * treated), ep("t", 0.0)])
        last = run.run_dir / "checkpoints" / "last"
        last.mkdir(parents=True)
        (last / "config.json").write_text("{}")
        return SimpleNamespace(checkpoint=str(last))

    def fake_collect(config: Any, tasks_dir: Path, url: str, run_dir: Path) -> list[EpisodeRecord]:
        evaluated.append((str(config.checkpoint), str(tasks_dir)))
        good = "treatment" in str(run_dir)
        return [ep(t.name, 1.0 if good else 0.0) for t in sorted(tasks_dir.iterdir())]

    @contextmanager
    def fake_reloaded(url: str, checkpoint: Path, base: str):
        yield url

    monkeypatch.setattr("trainer.loop.train_run", fake_train_run)
    monkeypatch.setattr(evaluate, "run_collect", fake_collect)
    monkeypatch.setattr(evaluate, "reloaded", fake_reloaded)
    monkeypatch.setattr("trainer.model.resolve_model", lambda model, cache_dir: str(tmp_path / "base"))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    out, work = tmp_path / "results", tmp_path / "work"
    argv = ["--tasks", "all", "--seeds", "2", "--iterations", "2", "--engine-url", "http://127.0.0.1:9"]
    assert learning_cpu.main([*argv, "--work-dir", str(work), "--out", str(out)]) == 0

    assert [(t["run"].collect_seed, t["run"].run_dir.name, t["lr"]) for t in trained] == [
        (1, "run", 2e-5),
        (1, "run", 0.0),
        (2, "run", 2e-5),
        (2, "run", 0.0),
    ]
    train_ids = {p.name for p in (work / "tasks-train").iterdir()}
    held_ids = {p.name for p in (work / "tasks-heldout").iterdir()}
    assert train_ids and held_ids and not train_ids & held_ids
    assert all(t["run"].tasks == str(work / "tasks-train") for t in trained)
    # per seed: the base, then each arm's final checkpoint, all on the held-out tasks
    assert [c for c, _ in evaluated] == [
        str(c)
        for seed in (1, 2)
        for c in (
            tmp_path / "base",
            work / f"seed-{seed}" / "treatment" / "run" / "checkpoints" / "last",
            work / f"seed-{seed}" / "control" / "run" / "checkpoints" / "last",
        )
    ]
    assert {d for _, d in evaluated} == {str(work / "tasks-heldout")}
    text = (out / "learning_cpu.md").read_text()
    assert "Treatment - control" in text and "significant at 95% (treatment higher)" in text
    assert (out / "learning_cpu.png").stat().st_size > 1000


def test_arguments_that_cannot_make_a_controlled_run_are_refused() -> None:
    for bad in (["--seeds", "0"], ["--group-size", "1"], ["--learning-rate", "0"]):
        with pytest.raises(SystemExit):
            learning_cpu.parse(bad)

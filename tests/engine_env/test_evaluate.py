"""trainer/evaluate.py and trainer/comparison.py (through evaluate's re-exports): the held-out split, the
before/after comparison math (incl. the solved-both subset), its outputs, the trained harnesses read from a run's
config.json, and the fast ``compare`` and ``split`` commands on crafted collect run dirs. The cross-harness
aggregation (intervals, transfer) is checked number by number in tests/test_comparison.py."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from addon.engine.client import EngineClient, GenerationRequest, GenerationResult
from tasks.episodes import ALL, CallStats, EpisodeRecord, write_episodes
from tasks.figures import mean_interval, wilson_interval
from tasks.taskset import builtin_taskset, load_taskset
from trainer import comparison
from trainer import evaluate as ev

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def ep(task: str, harness: str, passed: bool, tools: int, i: int = 0) -> EpisodeRecord:
    return EpisodeRecord(
        run_id="r", session_id=f"{task}-{harness}-{i}", task_id=task, task_version="1", harness=harness,
        harness_version="1", group_id=f"{task}/{harness}", task_group_id=task, sample_index=i, started_at=T0,
        reward=float(passed), reward_components={}, verifier_passed=passed, verifier_reward=float(passed),
        verifier_status="ok", verifier_output_tail="", exit_status=0, timed_out=False, crashed=False, wall_s=1.0,
        harness_s=1.0, stderr_tail="", stats=CallStats(calls=tools + 1, tool_call_count=tools),
    )  # fmt: skip


BEFORE = [
    ep("a", "pi", True, 10), ep("a", "pi", False, 2, 1),  # a/pi solved before and after
    ep("b", "pi", True, 6),  # b/pi solved before only
    ep("c", "pi", False, 4),  # c/pi solved after only
    ep("a", "mini-swe-agent", False, 5),
]  # fmt: skip
AFTER = [
    ep("a", "pi", True, 4), ep("a", "pi", True, 8, 1),
    ep("b", "pi", False, 3),
    ep("c", "pi", True, 1),
    ep("a", "mini-swe-agent", False, 7),
]  # fmt: skip


def test_comparison_math_and_solved_both_subset() -> None:
    rows = {r.harness: r for r in ev.compare(BEFORE, AFTER)}
    assert list(rows) == ["pi", "mini-swe-agent", ALL]
    pi = rows["pi"]
    assert (pi.before.episodes, pi.after.episodes) == (4, 4)
    assert pi.before.pass_at_1 == pytest.approx(2 / 4) and pi.after.pass_at_1 == pytest.approx(3 / 4)
    assert pi.before.tool_calls == pytest.approx(22 / 4) and pi.after.tool_calls == pytest.approx(16 / 4)
    # only a/pi was solved on both sides; its passing episodes: before [10], after [4, 8]
    assert pi.solved_both == 1
    assert pi.shaped_tool_calls_before == pytest.approx(10.0)
    assert pi.shaped_tool_calls_after == pytest.approx(6.0)
    assert pi.tool_call_change == pytest.approx(-0.4)
    mini = rows["mini-swe-agent"]
    assert mini.before.pass_at_1 == 0.0 and mini.solved_both == 0 and mini.tool_call_change is None
    assert rows[ALL].before.pass_at_1 == pytest.approx(2 / 5) and rows[ALL].solved_both == 1


def test_a_harness_on_one_side_only() -> None:
    rows = {r.harness: r for r in ev.compare([ep("a", "pi", True, 3)], [ep("a", "codex", True, 1)])}
    assert rows["pi"].after == ev.Side(0, None, None)
    assert rows[ALL].solved_both == 0  # same task, different harness: not the same pair
    assert "| pi | - | 1 | 0 | 1.000 [0.207, 1.000] | - | - |" in ev.comparison_markdown(list(rows.values()))


def test_split_is_deterministic_and_partitions() -> None:
    tasks = builtin_taskset("all")
    held = ev.split_tasks(tasks, "heldout")
    train = ev.split_tasks(tasks, "train")
    assert {t.id for t in held} | {t.id for t in train} == {t.id for t in tasks}
    assert not {t.id for t in held} & {t.id for t in train}
    assert 0 < len(held) < len(tasks) / 2
    # depends on the id alone: the same verdict from any subset, and a pinned value guards the salt
    assert [t.id for t in ev.split_tasks(builtin_taskset("smoke"), "heldout")] == ["copy-file", "rename-file"]
    assert ev.split_of("copy-file", 0.0) == "train" and ev.split_of("copy-file", 1.0) == "heldout"
    with pytest.raises(ValueError, match="no heldout task"):
        ev.split_tasks(builtin_taskset("smoke"), "heldout", fraction=0.0)


def test_task_folder_loads_as_the_split(tmp_path: Path) -> None:
    held = ev.split_tasks(builtin_taskset("smoke"), "heldout")
    folder = ev.task_folder(held, tmp_path / "tasks")
    assert [t.id for t in load_taskset(folder)] == [t.id for t in held]


def _png_size(path: Path) -> tuple[int, int]:
    image = Image.open(path)
    assert image.format == "PNG"
    image.load()  # decodes every row
    return image.size


def test_compare_command_writes_table_json_and_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_episodes(tmp_path / "before" / "episodes.parquet", BEFORE)
    write_episodes(tmp_path / "after" / "episodes.parquet", AFTER)
    out = tmp_path / "cmp"
    code = ev.main(["compare", "--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"),
                    "--out", str(out), "--trained-harnesses", "pi"])  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(ev.COMPARISON_FILES)
    table = (out / "comparison.md").read_text()
    assert table in capsys.readouterr().out  # the command prints the table it wrote
    assert "| pi | 1 | 10.000 | 6.000 | -40% |" in table  # the shaping effect
    assert "| pi | yes | 4 | 4 | 0.500 [0.150, 0.850] | 0.750 [0.301, 0.954] | +0.250 [" in table
    assert "| mini-swe-agent | no | 1 | 1 | 0.000 [0.000, 0.793] |" in table
    assert "| trained | pi | 4 | 4 | +0.250 [" in table and "| other | mini-swe-agent | 1 | 1 | +0.000 [" in table
    data = json.loads((out / "comparison.json").read_text())
    assert data["rows"][0]["tool_call_change"] == pytest.approx(-0.4)
    assert data["transfer"]["trained_harnesses"] == ["pi"]
    for name in ev.COMPARISON_FILES[2:]:
        width, height = _png_size(out / name)
        assert width > 400 and height > 200


def test_comparison_figures_show_before_and_after_with_intervals() -> None:
    after = [*AFTER, ep("a", "codex", True, 3)]  # a harness only after: no before bar
    rows = ev.compare(BEFORE, after)
    labels = ("base default", "checkpoint /a/b/c/checkpoints/it-3")
    figs = ev.comparison_figures(rows, labels, "smoke")
    ax = figs["pass_at_1"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["pi", "mini-swe-agent", "codex"]
    heights = [b.get_height() for b in ax.patches]
    assert heights == [0.5, 0.0, 0.0, 0.75, 0.0, 1.0]  # before pi, mini, codex; after pi, mini, codex
    assert [t.get_text() for t in ax.texts] == ["0.50", "0.00", "n/a", "0.75", "0.00", "1.00"]
    legend = [t.get_text() for t in figs["pass_at_1"].legends[0].get_texts()]
    assert legend == ["before: base default", "after: checkpoint /a/b/c/checkpoints/it-3"]
    assert comparison._short("checkpoint /work/main/runs/train/2026-12-02T12-00/checkpoints/iteration-0003") == (
        "checkpoint …/checkpoints/iteration-0003"
    )
    assert "smoke" in ax.get_title(loc="left") and "Wilson" in ax.get_title(loc="left")
    assert ax.get_ylabel() == "pass@1 (fraction of episodes passed)" and ax.get_xlabel() == "harness"
    ends = sorted(tuple(seg[:, 1]) for c in ax.collections for seg in c.get_segments())
    assert pytest.approx(wilson_interval(2, 4)) in ends and pytest.approx(wilson_interval(3, 4)) in ends
    ax = figs["tool_calls"].axes[0]
    assert [b.get_height() for b in ax.patches][:2] == [5.5, 5.0]
    low, high = mean_interval([10, 2, 6, 4])  # type: ignore[misc]
    ends = [tuple(seg[:, 1]) for c in ax.collections for seg in c.get_segments()]
    assert (pytest.approx(max(0.0, low)), pytest.approx(high)) in ends
    assert not any(math.isnan(v) for e in ends for v in e)


def test_eval_metrics_row() -> None:
    row = ev.eval_metrics_row(3, 12.0, ev.compare(BEFORE, AFTER))
    assert row["phase"] == "eval" and row["iteration"] == 3 and row["step"] is None
    assert row["pass_at_1_after/pi"] == pytest.approx(0.75) and row["pass_at_1_before"] == pytest.approx(0.4)
    assert row["tool_calls_mean_after/mini-swe-agent"] == 7.0
    assert row["reward_mean_before/pi"] == pytest.approx(0.5) and row["reward_mean_after"] == pytest.approx(0.6)


def test_trained_harnesses_come_from_the_run_config(tmp_path: Path) -> None:
    from trainer.config import RunConfig, to_json

    train = tmp_path / "train"
    train.mkdir()
    (train / "config.json").write_text(to_json(RunConfig(harnesses=("opencode", "pi"))))
    assert ev.trained_harnesses(train) == ("opencode", "pi")
    teacher = tmp_path / "teacher"
    write_episodes(teacher / "episodes.parquet", [*BEFORE, replace(ep("x", "codex", True, 1), error="crashed")])
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "config.json").write_text(json.dumps({"runs": [str(teacher)], "filter": {"min_reward": None}}))
    assert ev.trained_harnesses(sft) == ("pi",)  # only pi passed; the codex episode is a collector error
    (sft / "config.json").write_text(json.dumps({"runs": [str(teacher)], "filter": {"min_reward": 0.0}}))
    assert ev.trained_harnesses(sft) == ("pi", "mini-swe-agent")
    (sft / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--trained-harnesses"):
        ev.trained_harnesses(sft)


def test_split_command_writes_a_task_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ev.main(["split", "--tasks", "smoke", "--split", "train", "--out", str(tmp_path / "t")]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == (tmp_path / "t").resolve()
    train = [t.id for t in load_taskset(folder)]
    assert train == [t.id for t in ev.split_tasks(builtin_taskset("smoke"), "train")]
    assert not {"copy-file", "rename-file"} & set(train)  # the held-out ones stay out


def test_run_mode_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a model folder"):
        ev.EvalConfig(checkpoint=tmp_path, out=tmp_path / "o")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs engine_url"):
        ev.EvalConfig(checkpoint=tmp_path, out=tmp_path / "o", serve="reload")
    cfg = ev.EvalConfig(checkpoint=tmp_path, out=tmp_path / "o", engine_url="http://e:1", group_size=2)
    cmd = ev.collect_command(cfg, tmp_path / "tasks", "http://e:1", tmp_path / "o" / "after")
    assert cmd[1:3] == ["-m", "tasks.collect"] and cmd[cmd.index("--group-size") + 1] == "2"
    assert cmd[cmd.index("--run-dir") + 1] == str(tmp_path / "o" / "after")
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.json").write_text(json.dumps({"iteration": 2, "policy_version": 2}))
    assert ev.main(["run", "--run", str(run)]) == 2  # no checkpoint yet: a clear error, not a traceback
    assert ev.main(["compare", "--before", str(tmp_path / "x"), "--after", str(tmp_path / "y"), "--out",
                    str(tmp_path / "z")]) == 2  # fmt: skip


def test_collector_errors_count_as_failures() -> None:
    broken = replace(ep("a", "pi", False, 0), error="harness crashed", crashed=True)
    (pi, _) = ev.compare([broken, ep("b", "pi", True, 2)], [ep("a", "pi", True, 1)])
    assert pi.before.pass_at_1 == 0.5 and pi.before.episodes == 2


async def _probe(url: str) -> tuple[str, GenerationResult]:
    async with EngineClient(url) as engine:
        req = GenerationRequest(prompt_ids=(1, 9690, 28, 2), max_tokens=1, temperature=0.0)
        return await engine.weight_version(), await engine.generate(req)


@pytest.mark.integration
def test_reload_mode_serves_the_checkpoint_then_restores_the_base(
    engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    """The test tier's one engine serves a checkpoint inside ``reloaded`` and the base weights again after it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(3.0)  # sharper logits: the greedy token's logprob must move
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    original, base = asyncio.run(_probe(engine_url))
    with ev.reloaded(engine_url, checkpoint, str(model_dir)) as url:
        version, during = asyncio.run(_probe(url))
        assert version == f"eval:{checkpoint}"
        assert abs(during.logprobs[0] - base.logprobs[0]) > 1e-3
    version, after = asyncio.run(_probe(engine_url))
    assert version == original  # restored under the label it had: other tests see the engine unchanged
    assert after.completion_ids == base.completion_ids
    assert after.logprobs[0] == pytest.approx(base.logprobs[0], abs=1e-4)

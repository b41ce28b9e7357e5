"""trainer/train.py (the CLI) and trainer/config.py: flags -> RunConfig + GRPOConfig, and clear rejections."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer import train
from trainer.config import ConfigError, RunConfig, default_grpo_config, run_config_from_json, to_json

REPO = Path(__file__).resolve().parents[2]


def configs(*argv: str) -> tuple[RunConfig, object]:
    return train.configs(train.build_parser().parse_args(list(argv)))


def test_flags_map_onto_run_config_and_grpo_config(tmp_path: Path) -> None:
    run, args = configs(
        "--tasks", "easy", "--harnesses", "pi,mini-swe-agent", "--harness-weights", "pi=2", "--grouping",
        "task_harness", "--iterations", "3", "--run-dir", str(tmp_path), "-G", "6", "--learning-rate", "3e-6",
        "--loss-type", "grpo", "--epsilon-high", "0.28", "--scale-rewards", "none", "--is-cap", "4",
        "--staleness", "refuse", "--grpo", "max_grad_norm=0.5", "--grpo", "optim=adamw_torch_fused",
    )  # fmt: skip
    assert run.tasks == "easy" and run.harnesses == ("pi", "mini-swe-agent")
    assert run.harness_weight("pi") == 2.0 and run.harness_weight("mini-swe-agent") == 1.0
    assert run.grouping == "task_harness" and run.iterations == 3 and run.run_dir == tmp_path
    assert run.is_cap == 4.0 and run.staleness == "refuse"
    assert args.num_generations == 6 and args.learning_rate == 3e-6  # type: ignore[attr-defined]
    assert args.loss_type == "grpo" and args.epsilon_high == 0.28  # type: ignore[attr-defined]
    assert args.scale_rewards == "none" and args.max_grad_norm == 0.5  # type: ignore[attr-defined]
    assert args.optim == "adamw_torch_fused"  # type: ignore[attr-defined]  # not JSON: taken as a string
    assert args.generation_batch_size % 6 == 0  # type: ignore[attr-defined]  # GRPOConfig's own check holds


def test_environment_defaults_feed_make_train(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKS", "smoke")
    monkeypatch.setenv("HARNESSES", "pi")
    monkeypatch.setenv("GROUP_SIZE", "2")
    monkeypatch.setenv("ITERATIONS", "5")
    monkeypatch.setenv("ENGINE_URL", "http://127.0.0.1:1234")
    run, args = configs()
    assert (run.tasks, run.harnesses, run.iterations) == ("smoke", ("pi",), 5)
    assert run.engine_url == "http://127.0.0.1:1234" and args.num_generations == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loss-type", "cispo"], "loss_type='cispo': use one of"),
        (["--grpo", "use_vllm=true"], "use_vllm=True"),
        (["--grpo", "beta=0.04"], "beta=0.04: no KL reference model"),
        (["--grpo", "no_such_field=1"], "GRPOConfig has no such field"),
        (["-G", "1"], "at least 2 generations"),  # TRL's own check, passed through
        (["--harness-weights", "pi"], "is not NAME=WEIGHT"),
        (["--harnesses", "pi", "--harness-weights", "codex=2"], "not in harnesses"),
        (["--is-cap", "0.5"], "is_cap must be > 1"),
        (["--scale-rewards", "median"], "scale_rewards must be"),
        (["--iterations", "0"], "iterations must be >= 1"),
        (["--engine-url", "http://a:1,b:2"], "must be http.* URLs, got 'b:2'"),
        (["--engine-url", "http://a:1, http://a:1/"], "listed twice: http://a:1"),
        (["--engine-url", " , "], "no engine URL given"),
    ],
)
def test_unsupported_settings_are_rejected_with_what_to_change(argv: list[str], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message.replace("(", r"\(").replace("[", r"\[")):
        configs(*argv)


def test_cli_exits_2_with_the_message(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--run-dir", str(tmp_path), "--grpo", "use_vllm=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "use_vllm=True: generation happens in the collect phase" in done.stderr
    assert not (tmp_path / "state.json").exists()


def test_several_engine_urls_are_parsed_and_kept_as_given() -> None:
    run, _ = configs("--engine-url", "http://10.0.0.1:8000, http://10.0.0.2:8000/")
    assert run.engine_urls == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert run.engine_url == "http://10.0.0.1:8000, http://10.0.0.2:8000/"  # config.json records what was asked
    assert RunConfig().engine_urls == ()  # no URL: the run starts its own engine


def test_config_json_round_trips(tmp_path: Path) -> None:
    run = RunConfig(harnesses=("pi", "mini-swe-agent"), harness_weights={"pi": 0.5}, run_dir=tmp_path, is_cap=2.0)
    text = to_json(run, default_grpo_config(tmp_path / "t", num_generations=2))
    assert run_config_from_json(text) == run
    with pytest.raises(ConfigError, match="unknown run settings"):
        run_config_from_json('{"run": {"tasks": "smoke", "colour": "red"}}')

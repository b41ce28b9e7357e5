"""Built-in rewards, the tool-shaping recipe, RewardConfig validation, crash/budget handling, user hooks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tasks.rewards import (
    BUILTIN_REWARDS,
    EpisodeOutcome,
    RewardConfig,
    RewardConfigError,
    Rewarder,
    RewardResult,
    fractional,
    load_reward_fn,
    pass_fail,
    tool_shaping,
)


def outcome(**kw: object) -> EpisodeOutcome:
    fields: dict[str, object] = dict(
        task_id="hello-file", harness="claude-code", verifier_reward=1.0, verifier_passed=True, tool_call_count=3,
        exit_status=0,
    )  # fmt: skip
    fields.update(kw)
    return EpisodeOutcome(**fields)  # type: ignore[arg-type]


def test_pass_fail() -> None:
    assert pass_fail(outcome()) == RewardResult(1.0, {"correct": 1.0})
    assert pass_fail(outcome(verifier_reward=0.9, verifier_passed=False)).reward == 0.0


def test_fractional() -> None:
    assert fractional(outcome(verifier_reward=0.25, verifier_passed=False)) == RewardResult(0.25, {"verifier": 0.25})
    assert fractional(outcome(verifier_reward=None, verifier_passed=False)).reward == 0.0


@pytest.mark.parametrize(
    ("calls", "passed", "expected"),
    [(1, True, 1 + 0.1 * 15 / 16), (15, True, 1.05), (45, True, 1.025), (0, True, 1.0), (5, False, 0.0)],
)
def test_tool_shaping(calls: int, passed: bool, expected: float) -> None:
    result = tool_shaping(outcome(tool_call_count=calls, verifier_passed=passed))
    assert math.isclose(result.reward, expected)
    assert math.isclose(result.components["correct"] + result.components["tool_bonus"], expected)


def test_tool_shaping_prefers_fewer_calls() -> None:
    rewards = [tool_shaping(outcome(tool_call_count=n)).reward for n in (1, 2, 10, 100)]
    assert rewards == sorted(rewards, reverse=True) and rewards[-1] > 1.0


def test_outcome_and_result_validation() -> None:
    with pytest.raises(ValueError, match="tool_call_count"):
        outcome(tool_call_count=-1)
    with pytest.raises(ValueError, match="finite"):
        RewardResult(float("nan"))
    result = RewardResult(1.0, {"a": 1.0})
    with pytest.raises(TypeError):
        result.components["b"] = 2.0  # type: ignore[index]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), True, "lots", None])
def test_reward_config_rejects_bad_stop_values(bad: object) -> None:
    with pytest.raises(RewardConfigError, match="on_budget_stop must be a finite number or 'score'"):
        RewardConfig(on_budget_stop=bad)  # type: ignore[arg-type]
    with pytest.raises(RewardConfigError, match="on_crash"):
        RewardConfig(on_crash=bad)  # type: ignore[arg-type]


def test_reward_config_normalises_numbers() -> None:
    config = RewardConfig(on_budget_stop=-1, on_crash="score")
    assert config.on_budget_stop == -1.0 and isinstance(config.on_budget_stop, float)
    with pytest.raises(RewardConfigError, match="function"):
        RewardConfig(function="")


def test_rewarder_crash_and_budget_stop() -> None:
    rewarder = Rewarder.from_config(RewardConfig("tool_shaping", on_budget_stop=-0.5, on_crash=-1.0))
    assert rewarder(outcome(crashed=True)) == RewardResult(-1.0, {"crash": -1.0})
    assert rewarder(outcome(budget_stop=True)) == RewardResult(-0.5, {"budget_stop": -0.5})
    assert rewarder(outcome(crashed=True, budget_stop=True)).components == {"crash": -1.0}  # crash wins
    assert math.isclose(rewarder(outcome(tool_call_count=15)).reward, 1.05)


def test_rewarder_score_scores_as_usual() -> None:
    rewarder = Rewarder.from_config(RewardConfig("pass_fail", on_budget_stop="score", on_crash="score"))
    assert rewarder(outcome(budget_stop=True)).reward == 1.0
    assert rewarder(outcome(crashed=True, verifier_reward=None, verifier_passed=False)).reward == 0.0
    # a crash scored as usual is not overridden by the budget-stop value
    mixed = Rewarder.from_config(RewardConfig("pass_fail", on_budget_stop=-2.0, on_crash="score"))
    assert mixed(outcome(crashed=True, budget_stop=True)).reward == 1.0


def test_builtins_by_name() -> None:
    for name, fn in BUILTIN_REWARDS.items():
        assert load_reward_fn(name) is fn


USER_MODULE = """
from tasks.rewards import RewardResult

LIMIT = 3


def shaped(outcome):
    penalty = 0.5 if outcome.tool_call_count > LIMIT else 0.0
    base = 1.0 if outcome.verifier_passed else 0.0
    return RewardResult(base - penalty, {"base": base, "penalty": -penalty})


def plain(outcome):
    return 0.3 if outcome.harness == "codex" else 0


def wrong(outcome):
    return "great"


class Namespace:
    @staticmethod
    def nested(outcome):
        return 2
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_rewards_mod.py").write_text(USER_MODULE)
    (tmp_path / "broken_rewards_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_mod"


def test_user_hook(user_module: str) -> None:
    rewarder = Rewarder.from_config(RewardConfig(f"{user_module}:shaped"))
    assert rewarder(outcome(tool_call_count=2)) == RewardResult(1.0, {"base": 1.0, "penalty": -0.0})
    assert rewarder(outcome(tool_call_count=9)) == RewardResult(0.5, {"base": 1.0, "penalty": -0.5})
    plain = load_reward_fn(f"{user_module}:plain")
    assert plain(outcome(harness="codex")) == RewardResult(0.3, {"user": 0.3})
    assert plain(outcome()) == RewardResult(0.0, {"user": 0.0})
    assert load_reward_fn(f"{user_module}:Namespace.nested")(outcome()).reward == 2.0
    with pytest.raises(TypeError, match=f"'{user_module}:wrong' returned str"):
        load_reward_fn(f"{user_module}:wrong")(outcome())


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("no_such_module_xyz:fn", "cannot import 'no_such_module_xyz'"),
        ("broken_rewards_mod:fn", "boom at import"),
        ("my_rewards_mod:missing", "has no attribute 'missing'"),
        ("my_rewards_mod:LIMIT", "int object is not callable"),
        ("unknown_builtin", "not a built-in (pass_fail, fractional, tool_shaping) nor 'module:function'"),
        ("mod:", "nor 'module:function'"),
    ],
)
def test_user_hook_errors_quote_the_spec(user_module: str, spec: str, words: str) -> None:
    with pytest.raises(RewardConfigError) as e:
        Rewarder.from_config(RewardConfig(spec))
    assert repr(spec) in str(e.value) and words in str(e.value)

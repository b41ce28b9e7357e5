"""Rewards: turn one finished episode (:class:`EpisodeOutcome`) into a :class:`RewardResult`.

Contract
--------
A reward function is any callable ``fn(outcome: EpisodeOutcome) -> RewardResult`` (a plain number is also accepted
from user functions and wrapped as ``RewardResult(x, {"user": x})``). Built-ins, by name:

* ``pass_fail``: 1 when the verifier passed (reward reached the task's max), else 0;
* ``fractional``: the verifier's own score (0 when no verifier ran);
* ``tool_shaping``: ``correct * (1 + 0.1 * 15 / (15 + tool_calls))`` with ``correct`` the pass/fail bit: a solved
  episode earns up to 10 % more the fewer tool calls it needed. An episode with **zero** tool calls gets no bonus
  (reward = ``correct``): the formula would give it the largest bonus, which would teach the policy to avoid tools,
  and a task solved without any tool call is a verifier or harness problem worth seeing, not rewarding.

Any other name must be ``module:function`` (e.g. ``my_rewards:shaped``) and is imported on load; a name that is not
importable, or not callable, raises :class:`RewardConfigError` quoting the string.

:class:`Rewarder` applies a :class:`RewardConfig`: a harness crash gets ``on_crash`` and a budget stop gets
``on_budget_stop``, each either a number or ``"score"`` (score the episode with the reward function as usual).
A crash takes precedence over a budget stop. Stdlib only; runs in both environments.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from numbers import Real
from types import MappingProxyType
from typing import Literal, TypeAlias

TOOL_SHAPING_SCALE = 15.0
TOOL_SHAPING_BONUS = 0.1

StopReward: TypeAlias = float | Literal["score"]


class RewardConfigError(ValueError):
    """A reward configuration that cannot be used (unknown function, bad value)."""


@dataclass(frozen=True)
class EpisodeOutcome:
    """What the collection loop knows about one finished episode.

    ``verifier_reward`` is None when the verifier did not run (e.g. after a harness crash).
    """

    task_id: str
    harness: str
    verifier_reward: float | None
    verifier_passed: bool
    tool_call_count: int
    exit_status: int | None
    budget_stop: bool = False
    crashed: bool = False

    def __post_init__(self) -> None:
        if self.tool_call_count < 0:
            raise ValueError(f"tool_call_count must be >= 0, got {self.tool_call_count}")


@dataclass(frozen=True)
class RewardResult:
    """The scalar reward and the named parts it was built from (for logging and analysis)."""

    reward: float
    components: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward!r}")
        object.__setattr__(self, "components", MappingProxyType(dict(self.components)))


RewardFn: TypeAlias = Callable[[EpisodeOutcome], RewardResult]


def pass_fail(outcome: EpisodeOutcome) -> RewardResult:
    correct = 1.0 if outcome.verifier_passed else 0.0
    return RewardResult(correct, {"correct": correct})


def fractional(outcome: EpisodeOutcome) -> RewardResult:
    score = outcome.verifier_reward if outcome.verifier_reward is not None else 0.0
    return RewardResult(score, {"verifier": score})


def tool_shaping(outcome: EpisodeOutcome) -> RewardResult:
    correct = 1.0 if outcome.verifier_passed else 0.0
    calls = outcome.tool_call_count
    bonus = 0.0 if calls == 0 else TOOL_SHAPING_BONUS * TOOL_SHAPING_SCALE / (TOOL_SHAPING_SCALE + calls)
    return RewardResult(correct * (1.0 + bonus), {"correct": correct, "tool_bonus": correct * bonus})


BUILTIN_REWARDS: Mapping[str, RewardFn] = MappingProxyType(
    {"pass_fail": pass_fail, "fractional": fractional, "tool_shaping": tool_shaping}
)


def load_reward_fn(spec: str) -> RewardFn:
    """A built-in by name, or ``module:function`` imported now. Raises :class:`RewardConfigError` quoting ``spec``."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        known = ", ".join(BUILTIN_REWARDS)
        raise RewardConfigError(f"reward function {spec!r}: not a built-in ({known}) nor 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import failure of user code is a configuration error, reported with the spec
        raise RewardConfigError(f"reward function {spec!r}: cannot import {module_name!r}: {e}") from e
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise RewardConfigError(f"reward function {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise RewardConfigError(f"reward function {spec!r}: {type(target).__name__} object is not callable")
    return _user_fn(spec, target)


def _user_fn(spec: str, fn: Callable[[EpisodeOutcome], object]) -> RewardFn:
    """Wrap a user function so a plain number is accepted and anything else fails with the spec named."""

    def call(outcome: EpisodeOutcome) -> RewardResult:
        result = fn(outcome)
        if isinstance(result, RewardResult):
            return result
        if isinstance(result, Real) and not isinstance(result, bool):
            return RewardResult(float(result), {"user": float(result)})
        raise TypeError(f"reward function {spec!r} returned {type(result).__name__}, not a RewardResult or number")

    call.__name__ = spec
    return call


@dataclass(frozen=True)
class RewardConfig:
    """Which reward function to use and what budget stops and harness crashes get."""

    function: str = "pass_fail"
    """A built-in name (pass_fail, fractional, tool_shaping) or ``module:function``."""
    on_budget_stop: StopReward = 0.0
    """Reward for an episode stopped by its budget (turns, tokens, time), or "score" to score it as usual."""
    on_crash: StopReward = 0.0
    """Reward for an episode whose harness crashed, or "score" to score it as usual."""

    def __post_init__(self) -> None:
        if not isinstance(self.function, str) or not self.function:
            raise RewardConfigError(f"RewardConfig.function must be a non-empty string, got {self.function!r}")
        for name in ("on_budget_stop", "on_crash"):
            value = getattr(self, name)
            if value == "score":
                continue
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
                raise RewardConfigError(f"RewardConfig.{name} must be a finite number or 'score', got {value!r}")
            object.__setattr__(self, name, float(value))


@dataclass(frozen=True)
class Rewarder:
    """A :class:`RewardConfig` with its function resolved: call it on each finished episode."""

    config: RewardConfig
    fn: RewardFn

    @classmethod
    def from_config(cls, config: RewardConfig) -> Rewarder:
        return cls(config, load_reward_fn(config.function))

    def __call__(self, outcome: EpisodeOutcome) -> RewardResult:
        if outcome.crashed and self.config.on_crash != "score":
            return RewardResult(float(self.config.on_crash), {"crash": float(self.config.on_crash)})
        if outcome.budget_stop and not outcome.crashed and self.config.on_budget_stop != "score":
            return RewardResult(float(self.config.on_budget_stop), {"budget_stop": float(self.config.on_budget_stop)})
        return self.fn(outcome)

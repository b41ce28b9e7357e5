"""trainer/grpo.py: the PPO-clip loss against captured logprobs, on hand-computed tensors and a tiny real model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer.config import default_grpo_config
from trainer.grpo import (
    CapturedGRPOTrainer,
    LossSettings,
    MetricsFileCallback,
    collate,
    policy_logprobs,
    ppo_loss,
)
from trainer.samples import Sample


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def sample(ids: list[int], mask: list[int], advantage: float, behaviour: list[float] | None = None) -> Sample:
    n = len(ids)
    return Sample(
        session_id="s",
        group="g",
        harness="pi",
        reward=0.0,
        advantage=advantage,
        weight=1.0,
        input_ids=tuple(ids),
        loss_mask=tuple(mask),
        behaviour_logprobs=tuple(behaviour or [0.0] * n),
        temperatures=tuple([1.0] * n),
        policy_version=0,
    )


# -------------------------------------------------------------------------------------------- loss math by hand

LOGP = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
BEHAVIOUR = torch.tensor([[-1.2, -1.0], [-0.5, -1.0]])
MASK = torch.tensor([[1, 1], [1, 0]])
ADV = torch.tensor([1.0, -1.0])
WEIGHTS = torch.tensor([1.0, 2.0])
# token losses by hand: r = e^0.2 > 1.2 with A > 0 -> clipped to 1.2 -> -1.2; r = e^-1 -> -e^-1; r = 1, A = -1,
# weight 2 -> +2; the fourth token is off the mask (its ratio e^1 would otherwise dominate).
TOKEN_LOSSES = [-1.2, -math.exp(-1), 2.0]


@pytest.mark.parametrize(
    ("loss_type", "normaliser", "expected"),
    [
        ("dapo", 3.0, sum(TOKEN_LOSSES) / 3),
        ("bnpo", 1.0, sum(TOKEN_LOSSES) / 3),
        ("grpo", 1.0, ((TOKEN_LOSSES[0] + TOKEN_LOSSES[1]) / 2 + TOKEN_LOSSES[2]) / 2),
        ("grpo", 2.0, ((TOKEN_LOSSES[0] + TOKEN_LOSSES[1]) / 2 + TOKEN_LOSSES[2]) / 4),
    ],
)
def test_ppo_loss_matches_a_hand_computation(loss_type: str, normaliser: float, expected: float) -> None:
    settings = LossSettings(epsilon=0.2, epsilon_high=0.2, loss_type=loss_type)
    loss, stats = ppo_loss(LOGP, BEHAVIOUR, MASK, ADV, WEIGHTS, settings, normaliser)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    m = stats.metrics()
    assert stats.tokens == 3
    assert m["clip_ratio"] == pytest.approx(1 / 3)  # only the first token is clipped
    assert m["logprob_diff_mean"] == pytest.approx((0.2 + 1.0 + 0.0) / 3, rel=1e-5)
    assert m["logprob_diff_max"] == pytest.approx(1.0)
    assert m["is_ratio_max"] == pytest.approx(math.exp(0.2), rel=1e-5)
    k3 = (math.exp(-0.2) + 0.2 - 1) + (math.exp(1.0) - 1.0 - 1)  # KL(behaviour || theta), k3 estimate
    assert m["kl"] == pytest.approx(k3 / 3, rel=1e-5)


def test_is_cap_truncates_the_ratio_for_negative_advantages() -> None:
    logp, behaviour = torch.tensor([[0.0]]), torch.tensor([[-2.0]])  # ratio e^2 ~ 7.39
    mask, adv, w = torch.tensor([[1]]), torch.tensor([-1.0]), torch.tensor([1.0])
    free, _ = ppo_loss(logp, behaviour, mask, adv, w, LossSettings(), 1.0)
    capped, _ = ppo_loss(logp, behaviour, mask, adv, w, LossSettings(is_cap=3.0), 1.0)
    assert float(free) == pytest.approx(math.exp(2.0), rel=1e-5)
    assert float(capped) == pytest.approx(3.0)


def test_unknown_loss_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="cispo"):
        ppo_loss(LOGP, BEHAVIOUR, MASK, ADV, WEIGHTS, LossSettings(loss_type="cispo"), 1.0)


# -------------------------------------------------------------------------------------------- on a tiny model


def test_policy_logprobs_match_a_full_softmax_with_the_sampling_temperature() -> None:
    model = tiny_model()
    s = sample([3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 0, 1], 1.0)
    batch = collate([s, sample([9, 10, 11], [0, 1, 1], 1.0)])
    batch["temperatures"][0, 3] = 0.5
    with torch.no_grad():
        logp, targets = policy_logprobs(model, batch)
    assert targets.tolist() == [1, 2, 3, 5]  # positions whose token is on some row's mask
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    full = torch.log_softmax(logits[0, :-1] / batch["temperatures"][0, 1:].unsqueeze(-1), dim=-1)
    expected = full.gather(-1, batch["input_ids"][0, 1:].unsqueeze(-1)).squeeze(-1)
    for k, t in enumerate(targets.tolist()):
        assert float(logp[0, k]) == pytest.approx(float(expected[t - 1]), abs=1e-5)


def trainer_for(model: LlamaForCausalLM, tmp_path: Path, **overrides: object) -> CapturedGRPOTrainer:
    args = default_grpo_config(tmp_path / "out", **overrides)  # type: ignore[arg-type]
    return CapturedGRPOTrainer(model=model, args=args, loss_settings=LossSettings())


def test_the_loss_uses_the_captured_logprobs_on_masked_tokens_only(tmp_path: Path) -> None:
    model = tiny_model()
    trainer = trainer_for(model, tmp_path, gradient_accumulation_steps=1)
    ids, mask = [3, 4, 5, 6, 7, 8, 9], [0, 0, 1, 1, 0, 1, 1]
    with torch.no_grad():
        own, targets = policy_logprobs(model, collate([sample(ids, mask, 1.0)]))
    exact = [0.0] * len(ids)
    for k, t in enumerate(targets.tolist()):
        exact[t] = float(own[0, k])

    def loss_for(behaviour: list[float]) -> float:
        with torch.no_grad():
            loss = trainer.compute_loss(model, collate([sample(ids, mask, 1.0, behaviour)]), num_items_in_batch=4)
        trainer.log({"loss": float(loss)})
        return float(loss)

    # captured == recomputed: ratio 1 on every trained token, loss = -A
    assert loss_for(exact) == pytest.approx(-1.0, abs=1e-5)
    on_policy = trainer.state.log_history[-1]
    assert on_policy["logprob_diff_max"] == pytest.approx(0.0, abs=1e-5)
    # captured logprobs 0.1 higher than the model's: ratio e^-0.1 on every trained token
    shifted = [x + 0.1 if m else x for x, m in zip(exact, mask, strict=True)]
    assert loss_for(shifted) == pytest.approx(-math.exp(-0.1), abs=1e-5)
    logged = trainer.state.log_history[-1]
    assert logged["logprob_diff_mean"] == pytest.approx(0.1, abs=1e-5)
    assert logged["is_ratio_mean"] == pytest.approx(math.exp(-0.1), abs=1e-5)
    # 0.5 higher: below 1 - eps, clipped for A > 0 is min(r, 0.8) = r; for A < 0 it is -max(-r, -0.8)
    assert loss_for([x + 0.5 if m else x for x, m in zip(exact, mask, strict=True)]) == pytest.approx(
        -math.exp(-0.5), abs=1e-5
    )
    # values off the mask (prompt, tool results) change nothing
    assert loss_for([x if m else -9.0 for x, m in zip(exact, mask, strict=True)]) == pytest.approx(-1.0, abs=1e-5)


def test_repeated_train_calls_keep_the_optimizer_and_write_metrics_rows(tmp_path: Path) -> None:
    model = tiny_model()
    metrics = MetricsFileCallback(tmp_path / "metrics.jsonl")
    args = default_grpo_config(tmp_path / "out", learning_rate=1e-2, gradient_accumulation_steps=2)
    trainer = CapturedGRPOTrainer(model=model, args=args, callbacks=[metrics], loss_settings=LossSettings())
    data = [
        sample([3, 4, 5, 6, 7], [0, 0, 1, 1, 1], 1.0, [0, 0, -3.0, -3.0, -3.0]),
        sample([3, 4, 8, 9], [0, 0, 1, 1], -1.0, [0, 0, -4.0, -4.0]),
    ]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train_dataset = data
    metrics.begin_iteration(1, 0)
    trainer.train()
    first_optimizer = trainer.optimizer.optimizer  # the torch optimizer inside accelerate's wrapper
    assert [float(s["step"]) for s in first_optimizer.state.values()][:1] == [1.0]
    metrics.begin_iteration(2, trainer.state.global_step)
    trainer.train()
    assert trainer.optimizer.optimizer is first_optimizer
    assert {float(s["step"]) for s in first_optimizer.state.values()} == {2.0}  # Adam moments carried over
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["step"], r["phase"]) for r in rows] == [(1, 1, "train"), (2, 2, "train")]
    for key in (
        "loss",
        "kl",
        "clip_ratio",
        "is_ratio_mean",
        "is_ratio_max",
        "logprob_diff_mean",
        "logprob_diff_max",
        "tokens_per_s",
        "grad_norm",
        "learning_rate",
        "samples",
    ):
        assert isinstance(rows[0][key], float), key
    assert rows[0]["samples"] == 2 and rows[0]["tokens_per_s"] > 0 and rows[0]["wall_s"] >= 0

"""trainer/loop.py: run state, the collect command, and (integration) one full iteration on the real engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from addon.engine.client import EngineClient
from addon.records.schema import read_records, records_from_table
from tasks.rewards import EpisodeOutcome
from trainer import loop
from trainer.config import RunConfig


def noisy_reward(outcome: EpisodeOutcome) -> float:
    """Test reward with variance in every group (the 135M model solves no task): only the plumbing is tested."""
    return random.random()


def test_run_state_round_trips_and_is_replaced_atomically(tmp_path: Path) -> None:
    assert loop.RunState.read(tmp_path) is None
    loop.RunState(3, 3, "/x/iter-0003").write(tmp_path)
    assert loop.RunState.read(tmp_path) == loop.RunState(3, 3, "/x/iter-0003")
    assert json.loads((tmp_path / "state.json").read_text()) == {
        "iteration": 3,
        "policy_version": 3,
        "checkpoint": "/x/iter-0003",
    }
    assert not list(tmp_path.glob("*.tmp"))


def test_collect_command_seeds_the_collect_only_when_asked(tmp_path: Path) -> None:
    run = RunConfig(tasks="smoke", harnesses=("pi", "mini-swe-agent"), max_tasks=2, collect_timeout=90, seed=7)
    cmd = loop.collect_command(run, 4, "http://e:1", tmp_path / "c", 3)
    assert cmd[1:3] == ["-m", "tasks.collect"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--tasks"] == "smoke" and flags["--harnesses"] == "pi,mini-swe-agent"
    assert flags["--group-size"] == "4" and flags["--engine-url"] == "http://e:1"
    assert flags["--max-tasks"] == "2" and flags["--timeout"] == "90"
    assert flags["--run-dir"] == str(tmp_path / "c")
    assert "--seed" not in flags  # unseeded by default
    seeded = loop.collect_command(replace(run, collect_seed=11), 4, "http://e:1", tmp_path / "c", 3)
    assert seeded[-2:] == ["--seed", "11"]


def test_a_completed_run_does_nothing(tmp_path: Path) -> None:
    from trainer.config import default_grpo_config

    run = RunConfig(run_dir=tmp_path, iterations=2, engine_url="http://127.0.0.1:9")  # nothing listens there
    loop.RunState(2, 2, str(tmp_path / "checkpoints" / "iter-0002")).write(tmp_path)
    state = loop.train_run(run, default_grpo_config(tmp_path / "trainer", num_generations=2))
    assert state.iteration == 2 and (tmp_path / "config.json").exists()


def test_every_engine_url_must_be_up_before_the_run_starts(tmp_path: Path) -> None:
    from trainer.engine import EngineStartError, free_port

    down = f"http://127.0.0.1:{free_port()}"
    run = RunConfig(run_dir=tmp_path, engine_url=f"{down},http://127.0.0.1:{free_port()}")
    with pytest.raises(EngineStartError, match=down):
        loop.start_engine(run)


def test_sharded_training_is_refused_with_what_to_do_instead() -> None:
    from trainer.config import ConfigError

    for deepspeed, fsdp, name in ((True, False, "DeepSpeed"), (False, True, "FSDP")):
        fake = SimpleNamespace(is_deepspeed_enabled=deepspeed, is_fsdp_enabled=fsdp)  # FAKE: only the two flags
        with pytest.raises(ConfigError, match=f"{name} is not supported.*plain DDP"):
            loop.check_parallelism(fake)
    loop.check_parallelism(SimpleNamespace(is_deepspeed_enabled=False, is_fsdp_enabled=False))


# ------------------------------------------------------------------------------------------------ integration


async def _version(url: str) -> str:
    async with EngineClient(url) as client:
        return await client.weight_version()


async def _restore(url: str, folder: Path, version: str) -> None:
    async with EngineClient(url) as client:
        await client.reload_weights(folder, version=version)


@pytest.fixture
def engine_restored(engine_url: str, model_dir: Path) -> Iterator[str]:
    """The session engine, given back with the ORIGINAL weights and version whatever the test did."""
    original = asyncio.run(_version(engine_url))
    try:
        yield engine_url
    finally:
        asyncio.run(_restore(engine_url, model_dir, original))


@pytest.mark.integration
def test_one_full_iteration_on_the_real_engine(
    engine_restored: str, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.config import default_grpo_config
    from trainer.sync import served_version

    # one group of two episodes of at most two model calls each (collect's MAX_CALLS, which the loop's collect
    # inherits): the plumbing is the same as with more, and the collect and the GRPO step on long CPU sequences were
    # most of this tier's time (17 of 25 minutes on a slow 2-core machine with four episodes of five calls). The
    # budget stops that end them are scored as usual (ON_BUDGET_STOP), so the noisy reward gives the group variance.
    monkeypatch.setenv("MAX_CALLS", "2")
    monkeypatch.setenv("ON_BUDGET_STOP", "score")
    run = RunConfig(
        tasks="smoke",
        harnesses=("mini-swe-agent",),
        max_tasks=1,
        iterations=1,
        run_dir=tmp_path / "run",
        model=str(model_dir),
        engine_url=engine_restored,
        reward="tests.engine_env.test_loop:noisy_reward",
        collect_timeout=240,
    )
    args = default_grpo_config(tmp_path / "run" / "trainer", num_generations=2, learning_rate=1e-4)
    state = loop.train_run(run, args)

    assert state == loop.RunState(1, 1, str(tmp_path / "run" / "checkpoints" / "iter-0001"))
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    collect_row = next(r for r in rows if r["phase"] == "collect")
    assert collect_row["policy_version"] == 0 and collect_row["episodes"] == 2 and collect_row["samples"] > 0
    train_rows = [r for r in rows if r["phase"] == "train"]
    # mini-swe-agent's proxy constrains tool calls with a regex, so captured (constrained) and recomputed
    # (unconstrained) logprobs differ on forced tokens: the metric must be there and finite, not small
    assert train_rows and all(math.isfinite(r["logprob_diff_max"]) and r["samples"] > 0 for r in train_rows)
    assert next(r for r in rows if r["phase"] == "sync")["policy_version"] == 1
    # the records of the first collect were sampled by version 0
    first = records_from_table(read_records(run.run_dir / "iter-0001" / "collect" / "records"))
    # (a call refused by the call budget was sampled by no version)
    assert {r.policy_version for r in first if not r.auxiliary and r.budget_stop is None} == {0}
    # weights changed, and the checkpoint reloads with from_pretrained
    trained = AutoModelForCausalLM.from_pretrained(state.checkpoint, dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert any(not torch.equal(v, base[k]) for k, v in trained.items())
    assert served_version(engine_restored) == 1

    # interrupted after iteration 1, run again to 2 iterations: it resumes from the checkpoint (engine reloaded with
    # it as version 1), the next collect's records carry version 1, the optimizer state carries over
    steps_1 = _adam_steps(Path(state.checkpoint))
    asyncio.run(_restore(engine_restored, model_dir, "restarted"))  # as if the engine had been restarted
    resumed = loop.train_run(dataclasses.replace(run, iterations=2), args)
    assert resumed == loop.RunState(2, 2, str(tmp_path / "run" / "checkpoints" / "iter-0002"))
    second = records_from_table(read_records(run.run_dir / "iter-0002" / "collect" / "records"))
    assert second and {r.policy_version for r in second if not r.auxiliary and r.budget_stop is None} == {1}
    assert served_version(engine_restored) == 2
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained_2 = [r for r in rows if r["phase"] == "train" and r["iteration"] == 2]
    assert _adam_steps(Path(resumed.checkpoint)) == steps_1 + len(trained_2)


def _adam_steps(checkpoint: Path) -> float:
    import torch

    state = torch.load(checkpoint / "trainer" / "optimizer.pt", weights_only=True)["state"]
    return float(next(iter(state.values()))["step"]) if state else 0.0

"""Learning on CPU: N iterations of collect -> train -> sync with the default model, and the update's throughput.

Runs :func:`trainer.loop.train_run` (the same code as ``make train``) for ``--iterations`` (>= 5 by default) on a
built-in subset, then prints, per iteration, the mean reward with its spread (population std over the episodes),
pass@1, the samples trained and the groups without reward variance. The curve is printed as measured, rising or
not.

Then, side by side in the same process on the same batch (the agent-path sequences of the last collect, loss on the
sampled tokens), one optimizer step of our trainer (PPO-clip against the captured logprobs) and one step of a plain
TRL ``SFTTrainer`` (cross-entropy on the same tokens), both from the last checkpoint, both after a warm-up step:
tokens/s of each and their ratio. The batch is the same; only the loss differs (ours needs no reference pass: the
behaviour logprobs are the captured ones).

Usage (engine env): ``python benchmarks/learning_cpu.py [--tasks easy] [--iterations 5] [--engine-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from addon.records.schema import read_records, records_from_table  # noqa: E402
from addon.records.sequences import build_sequences  # noqa: E402
from tasks.taskset import builtin_taskset  # noqa: E402
from trainer.config import RunConfig, default_grpo_config  # noqa: E402
from trainer.samples import Sample  # noqa: E402


def default_tasks() -> str:
    """``warmup`` (a subset picked so the default model gets reward variance) when it exists, else ``easy``."""
    try:
        builtin_taskset("warmup")
    except Exception:
        return "easy"
    return "warmup"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=None, help="default: warmup if it exists, else easy")
    p.add_argument("--harnesses", default="mini-swe-agent")
    p.add_argument("--group-size", "-G", type=int, default=4)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--max-tasks", type=int, default=3)
    p.add_argument("--reward", default="pass_fail")
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--engine-url", default=None, help="default: start one (and stop it at the end)")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/harnessrl"))
    p.add_argument("--run-dir", type=Path, default=None)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--throughput-samples", type=int, default=4)
    return p.parse_args()


def curve(metrics: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    out = []
    for it in sorted({r["iteration"] for r in rows}):
        empty: dict[str, Any] = {}
        collect = next((r for r in rows if r["iteration"] == it and r["phase"] == "collect"), empty)
        train = [r for r in rows if r["iteration"] == it and r["phase"] == "train"]
        sync = next((r for r in rows if r["iteration"] == it and r["phase"] == "sync"), empty)
        out.append(
            {
                "iteration": it,
                "episodes": int(collect.get("episodes", 0)),
                "reward_mean": collect.get("reward_mean", float("nan")),
                "reward_std": collect.get("reward_std", float("nan")),
                "pass_at_1": collect.get("pass_at_1", float("nan")),
                "samples": int(collect.get("samples", 0)),
                "zero_var": f"{int(collect.get('zero_variance_groups', 0))}/{int(collect.get('groups', 0))}",
                "steps": len(train),
                "tokens_per_s": statistics.fmean(r["tokens_per_s"] for r in train) if train else float("nan"),
                "logprob_diff_max": max((r["logprob_diff_max"] for r in train), default=float("nan")),
                "collect_s": collect.get("wall_s", float("nan")),
                "sync_s": sync.get("seconds", float("nan")),
            }
        )
    return out


def print_curve(rows: list[dict[str, Any]]) -> None:
    print("\n| iter | episodes | reward mean ± std | pass@1 | samples | zero-var groups | steps | train tok/s "
          "| max abs logprob diff | collect s | sync s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['iteration']} | {r['episodes']} | {r['reward_mean']:.3f} ± {r['reward_std']:.3f} "
            f"| {r['pass_at_1']:.3f} | {r['samples']} | {r['zero_var']} | {r['steps']} | {r['tokens_per_s']:.1f} "
            f"| {r['logprob_diff_max']:.4f} | {r['collect_s']:.0f} | {r['sync_s']:.2f} |"
        )


def throughput_batch(collect_dir: Path, n: int) -> list[Sample]:
    """Up to ``n`` agent-path sequences of a collect, as samples with advantage 1 (throughput only)."""
    records = records_from_table(read_records(collect_dir / "records"))
    by_session: dict[str, list[Any]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    out: list[Sample] = []
    for sid, recs in sorted(by_session.items()):
        for s in build_sequences(recs):
            if not s.auxiliary and any(s.loss_mask) and len(out) < n:
                temps = (1.0,) * len(s.input_ids)
                out.append(
                    Sample(sid, "g", "h", 0.0, 1.0, 1.0, s.input_ids, s.loss_mask, s.behaviour_logprobs, temps, None)
                )
    return out


class StepTimer:
    """A TrainerCallback (duck-typed hooks) recording each optimizer step's wall time."""

    def __new__(cls) -> Any:
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self) -> None:
                self.t0 = 0.0
                self.steps: list[float] = []

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                self.t0 = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                self.steps.append(time.perf_counter() - self.t0)

        return _Timer()


def side_by_side(checkpoint: str, batch: list[Sample], out: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from trainer.grpo import CapturedGRPOTrainer, LossSettings

    tokens = sum(len(s.input_ids) for s in batch)
    common = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": len(batch), "num_train_epochs": 2,
              "learning_rate": 1e-6, "report_to": [], "save_strategy": "no", "logging_steps": 1,
              "gradient_checkpointing": False, "optim": "adamw_torch", "disable_tqdm": True, "use_cpu": True,
              "bf16": False, "lr_scheduler_type": "constant"}  # fmt: skip
    tok = AutoTokenizer.from_pretrained(checkpoint)
    ours_timer = StepTimer()
    ours = CapturedGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32),
        args=default_grpo_config(out / "ours", **common),
        processing_class=tok,
        callbacks=[ours_timer],
        loss_settings=LossSettings(),
    )
    ours.train_dataset = batch
    ours.train()
    sft_timer = StepTimer()
    rows = [{"input_ids": list(s.input_ids), "completion_mask": list(s.loss_mask)} for s in batch]
    sft = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32),
        args=SFTConfig(output_dir=str(out / "sft"), max_length=None, completion_only_loss=True, **common),
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[sft_timer],
    )
    sft.train()
    ours_tps, sft_tps = tokens / ours_timer.steps[-1], tokens / sft_timer.steps[-1]
    print(f"\nthroughput on the same batch ({len(batch)} sequences, {tokens} tokens; 2nd optimizer step of each):")
    print(f"  harnessrl CapturedGRPOTrainer step: {ours_timer.steps[-1]:.2f} s = {ours_tps:.0f} tokens/s")
    print(f"  TRL SFTTrainer step:                {sft_timer.steps[-1]:.2f} s = {sft_tps:.0f} tokens/s")
    print(f"  ratio (ours / SFT): {ours_tps / sft_tps:.2f}")


def main() -> int:
    ns = parse()
    from trainer.loop import train_run

    tasks = ns.tasks or default_tasks()
    run_dir = ns.run_dir or REPO / "runs" / "bench" / time.strftime("learning-cpu-%Y%m%d-%H%M%S")
    run = RunConfig(
        tasks=tasks,
        harnesses=tuple(ns.harnesses.split(",")),
        iterations=ns.iterations,
        run_dir=run_dir,
        cache_dir=ns.cache_dir,
        engine_url=ns.engine_url,
        reward=ns.reward,
        max_tasks=ns.max_tasks,
        collect_concurrency=ns.concurrency,
    )
    args = default_grpo_config(
        run_dir / "trainer", num_generations=ns.group_size, learning_rate=ns.learning_rate, save_total_limit=1
    )
    print(
        f"learning_cpu: tasks={tasks} (max {ns.max_tasks}) harnesses={ns.harnesses} G={ns.group_size} "
        f"iterations={ns.iterations} reward={ns.reward} lr={ns.learning_rate} run_dir={run_dir}",
        flush=True,
    )
    started = time.monotonic()
    state = train_run(run, args)
    print(f"\n{state.iteration} iterations in {time.monotonic() - started:.0f} s; final policy version "
          f"{state.policy_version}")  # fmt: skip
    print_curve(curve(run_dir / "metrics.jsonl"))
    batch = throughput_batch(run_dir / f"iter-{state.iteration:04d}" / "collect", ns.throughput_samples)
    if batch:
        side_by_side(state.checkpoint, batch, run_dir / "throughput")
    else:
        print("\nthroughput: the last collect has no trainable sequences")
    return 0


if __name__ == "__main__":
    sys.exit(main())

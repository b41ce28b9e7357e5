"""Does training in the harness learn? A controlled benchmark: treatment against control, several seeds, held-out
tasks, on the CPU default model.

For each seed, two runs of :func:`trainer.loop.train_run` (the code of ``make train``) on the **training** side of the
task set's held-out split (:func:`trainer.evaluate.split_tasks`), with the same collect seed and the same run-folder
name, so their first collect samples alike:

* **treatment**: collect -> update -> sync, ``--iterations`` times, learning rate ``--learning-rate``;
* **control**: the same schedule with learning rate 0 (every phase runs, the weights never change).

Before them the base model, and after each its final checkpoint (reloaded into the same engine), are evaluated on
the **held-out** tasks, which no run ever trains on. The figures (:mod:`benchmarks.learning_analysis`: per-seed
means, 95% t-intervals over seeds, the treatment - control difference paired by seed, tool calls on tasks solved
before and after) go to ``--out``/learning_cpu.md and learning_cpu.png; the page says whether the difference is
significant, whatever it is.

``--throughput-samples N`` (default 0: off) then compares, side by side on the same batch, one optimizer step of our
trainer (PPO-clip against the captured logprobs) and one of a plain TRL ``SFTTrainer``: tokens/s and their ratio.

Usage (engine env): ``python benchmarks/learning_cpu.py [--tasks learn] [--seeds 3] [--iterations 2]
[--engine-url URL] [--out benchmarks/results]`` or ``make bench-learning``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from addon.records.schema import read_records, records_from_table  # noqa: E402
from addon.records.sequences import build_sequences  # noqa: E402
from benchmarks import tree  # noqa: E402
from benchmarks.learning_analysis import ARMS, Arm, ArmRun, page, reward_figure  # noqa: E402
from tasks.episodes import EpisodeRecord, read_episodes  # noqa: E402
from tasks.figures import png  # noqa: E402
from trainer.config import RunConfig, default_grpo_config  # noqa: E402
from trainer.samples import Sample  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="learn", help="a built-in subset or a task folder; split into train/held-out")
    p.add_argument("--harnesses", default="mini-swe-agent")
    p.add_argument("--group-size", "-G", type=int, default=4)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--seeds", type=int, default=3, help="seeds 1..N, each a treatment and a control run")
    p.add_argument("--max-tasks", type=int, default=0, help="training tasks per collect (0: all)")
    p.add_argument("--eval-group-size", type=int, default=3, help="held-out episodes per task and harness")
    p.add_argument("--reward", default="fractional")
    p.add_argument("--learning-rate", type=float, default=2e-5)
    p.add_argument("--engine-url", default="", help="default: start one (and stop it at the end)")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/harnessrl"))
    p.add_argument("--work-dir", type=Path, default=None, help="default: runs/bench/learning-cpu-<time>")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts at once (4 keeps a 2-core CPU engine busy)")
    p.add_argument("--throughput-samples", type=int, default=0)
    ns = p.parse_args(argv)
    if ns.seeds < 1 or ns.iterations < 1 or ns.group_size < 2:
        p.error("--seeds and --iterations must be >= 1 and --group-size >= 2 (a group needs two rollouts)")
    if ns.learning_rate <= 0:
        p.error("--learning-rate must be > 0 (the control runs at 0)")
    return ns


def episodes_of(run_dir: Path, iterations: int) -> tuple[tuple[EpisodeRecord, ...], ...]:
    """The training episodes of each iteration of a finished run."""
    return tuple(
        tuple(read_episodes(run_dir / f"iter-{i:04d}" / "collect" / "episodes.parquet"))
        for i in range(1, iterations + 1)
    )


def run_arm(ns: argparse.Namespace, seed: int, arm: Arm, train_dir: Path, url: str, work: Path) -> Path:
    """One seed's run of one arm; returns its final checkpoint. Same run-folder name in both arms: same session
    ids, so with the same collect seed their first collect samples alike."""
    from trainer.loop import train_run

    run = RunConfig(
        tasks=str(train_dir),
        harnesses=tuple(ns.harnesses.split(",")),
        iterations=ns.iterations,
        run_dir=work / f"seed-{seed}" / arm / "run",
        cache_dir=ns.cache_dir,
        engine_url=url,
        reward=ns.reward,
        max_tasks=ns.max_tasks,
        collect_concurrency=ns.concurrency,
        collect_seed=seed,
        seed=seed,
    )
    lr = ns.learning_rate if arm == "treatment" else 0.0
    args = default_grpo_config(
        run.run_dir / "trainer", num_generations=ns.group_size, learning_rate=lr, save_total_limit=1, seed=seed
    )
    return Path(train_run(run, args).checkpoint)


def heldout_collect(ns: argparse.Namespace, seed: int, checkpoint: Path, held_dir: Path, url: str, out: Path):
    """The held-out episodes of ``checkpoint`` served by ``url``'s engine (seeded with ``seed``)."""
    from trainer.evaluate import EvalConfig, run_collect

    config = EvalConfig(
        checkpoint=checkpoint,
        out=out,
        tasks=str(held_dir),
        harnesses=tuple(ns.harnesses.split(",")),
        group_size=ns.eval_group_size,
        engine_url=url,
        serve="reload",
        seed=seed,
        cache_dir=ns.cache_dir,
    )
    return tuple(run_collect(config, held_dir, url, out))


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


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    from trainer.evaluate import load_tasks, own_engine, reloaded, split_tasks, task_folder
    from trainer.model import resolve_model

    work = ns.work_dir or REPO / "runs" / "bench" / time.strftime("learning-cpu-%Y%m%d-%H%M%S")
    tasks = load_tasks(ns.tasks)
    train, held = split_tasks(tasks, "train"), split_tasks(tasks, "heldout")
    train_dir, held_dir = task_folder(train, work / "tasks-train"), task_folder(held, work / "tasks-heldout")
    base = resolve_model("default", ns.cache_dir)
    say(f"learning_cpu: {len(train)} training tasks ({', '.join(t.id for t in train)}), {len(held)} held-out "
        f"({', '.join(t.id for t in held)}); harnesses={ns.harnesses} G={ns.group_size} iterations={ns.iterations} "
        f"seeds={ns.seeds} lr={ns.learning_rate} reward={ns.reward}; work in {work}")  # fmt: skip
    started = time.monotonic()
    runs: list[ArmRun] = []
    before: dict[int, tuple[EpisodeRecord, ...]] = {}
    serving = nullcontext(ns.engine_url) if ns.engine_url else own_engine(base, work / "engine", ns.cache_dir)
    with serving as url:
        for seed in range(1, ns.seeds + 1):
            before[seed] = heldout_collect(ns, seed, Path(base), held_dir, url, work / f"seed-{seed}" / "heldout-base")
            for arm in ARMS:
                say(f"seed {seed}/{ns.seeds}, {arm}: {ns.iterations} iterations ({time.monotonic() - started:.0f} s)")
                checkpoint = run_arm(ns, seed, arm, train_dir, url, work)
                with reloaded(url, checkpoint, base) as served:
                    after = heldout_collect(
                        ns, seed, checkpoint, held_dir, served, work / f"seed-{seed}" / arm / "heldout"
                    )
                iterations = episodes_of(work / f"seed-{seed}" / arm / "run", ns.iterations)
                runs.append(ArmRun(seed, arm, iterations, after))
    minutes = (time.monotonic() - started) / 60
    cmd = "python benchmarks/learning_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (
        f"# Learning on CPU: treatment against control\n\nMachine: {tree.machine_facts().markdown()}. "
        f"{minutes:.0f} minutes.\n\nCommand: `{cmd}`\n\nTraining tasks: {', '.join(t.id for t in train)}; "
        f"held-out: {', '.join(t.id for t in held)}; harnesses {ns.harnesses}; G={ns.group_size}; "
        f"{ns.iterations} iterations; seeds 1..{ns.seeds}; learning rate {ns.learning_rate} (control: 0); reward "
        f"{ns.reward}; {ns.eval_group_size} held-out episodes per task and harness per checkpoint."
    )
    ns.out.mkdir(parents=True, exist_ok=True)
    text = page(runs, before, header)
    (ns.out / "learning_cpu.md").write_text(text)
    (ns.out / "learning_cpu.png").write_bytes(png(reward_figure(runs, "Mean training reward per iteration")))
    print(text)
    if ns.throughput_samples:
        last = work / f"seed-{ns.seeds}" / "treatment" / "run"
        batch = throughput_batch(last / f"iter-{ns.iterations:04d}" / "collect", ns.throughput_samples)
        state = json.loads((last / "state.json").read_text())
        if batch:
            side_by_side(state["checkpoint"], batch, work / "throughput")
        else:
            print("\nthroughput: the last collect has no trainable sequences")
    return 0


def say(message: str) -> None:
    print(f"[learning_cpu] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

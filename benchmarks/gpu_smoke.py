"""GPU smoke test: engine up, logprob match, one collect -> train -> sync iteration, the new weights served; one
CUDA GPU, under 10 minutes. Run it whenever a GPU machine is lent (docs/gpu.md).

Contract
--------
* ``--dry-run`` prints the plan (the steps, the model, the budgets and the thresholds) and exits 0 without
  importing torch or touching a GPU.
* Without a CUDA device (or without torch: the proxy env) it exits **2** with a message saying so, before it
  starts anything. A failed check exits **1** with the step and the numbers; all checks passed exits 0.
* Steps, each timed, against one deadline (``--budget-s``, default 600 s):

  1. ``engine``: ``trainer.engine serve`` on ``--model`` (default: the embedded default model, the one that needs
     no download; ``--model`` takes the recipe's, e.g. a local Qwen2.5-Coder-3B-Instruct folder) with
     ``--kv-cache-gib`` of KV cache, so the trainer fits on the same GPU.
  2. ``logprob_match``: the engine samples ``--tokens`` tokens of a fixed chat prompt (temperature 1, seeded); the
     trainer's own :func:`trainer.grpo.policy_logprobs` recomputes them with the base weights, under the bf16
     autocast the trainer uses on CUDA. Check: mean |captured - recomputed| <= ``--max-diff-mean``.
  3. ``iteration``: :func:`trainer.loop.train_run` (what ``make train`` runs) for one iteration of ``--harness``
     on one smoke task, G=2, with a random reward (:func:`noisy_reward`: the default model solves nothing, and a
     group whose rewards are all equal gives no sample) so the update always has samples. Checks: a collect row
     with episodes and samples, a train row whose ``logprob_diff_mean`` is finite (and <= ``--max-diff-mean`` for
     a harness without constrained tool calls: mini-swe-agent's forced tool-call frames make it large by design,
     docs/training.md), a sync row with policy version 1.
  4. ``synced``: the engine reports weight version 1 and serves the checkpoint: step 2's check again, recomputed
     with the checkpoint's weights.

  Results go to ``runs/gpu-smoke/<id>/smoke.json`` (each step's seconds and numbers) beside the train run dir.

Usage (engine env, CUDA build): ``python benchmarks/gpu_smoke.py [--model M] [--harness pi] [--dry-run]``.

Layout: options and plan, reward, checks (CUDA, engine, logprobs, iteration), main.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.rewards import EpisodeOutcome  # noqa: E402  # stdlib only: safe in both environments

PROMPT = "Write a Python function that returns the n-th Fibonacci number, then explain it in two sentences."
CONSTRAINED = frozenset({"mini-swe-agent"})  # harnesses whose proxy forces tool-call frames (docs/training.md)


class SmokeFailure(RuntimeError):
    """A check that did not hold; the message names the step and the numbers."""


# ------------------------------------------------------------------------------------------------ options and plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_smoke.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="'default', a local model folder or a hub id")
    p.add_argument("--harness", default="pi", help="the harness of the one iteration (pi: unconstrained)")
    p.add_argument("--tasks", default="smoke")
    p.add_argument("--kv-cache-gib", type=float, default=8.0, help="the engine's KV cache; the rest is the trainer's")
    p.add_argument("--tokens", type=int, default=64, help="tokens sampled for the logprob match")
    p.add_argument("--max-diff-mean", type=float, default=0.05, help="bf16 engine vs bf16-autocast trainer")
    p.add_argument("--collect-timeout", type=float, default=180.0, help="per rollout, seconds")
    p.add_argument("--budget-s", type=float, default=600.0, help="the whole run's deadline")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/harnessrl"))
    p.add_argument("--out", type=Path, default=None, help="default: runs/gpu-smoke/<timestamp>")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit 0 (no torch, no GPU)")
    return p


def plan(args: argparse.Namespace) -> list[str]:
    unconstrained = args.harness not in CONSTRAINED
    return [
        f"model: {args.model}; harness: {args.harness}; tasks: {args.tasks} (1 task, G=2); "
        f"budget {args.budget_s:.0f} s",
        f"1 engine: trainer.engine serve --model {args.model} --port 0 --kv-cache-gib {args.kv_cache_gib:g}",
        f"2 logprob_match: engine samples {args.tokens} tokens (temperature 1); trainer.grpo.policy_logprobs "
        f"recomputes them (base weights, bf16 autocast); mean |diff| <= {args.max_diff_mean:g}",
        "3 iteration: trainer.loop.train_run, 1 iteration, reward benchmarks.gpu_smoke:noisy_reward; rows collect "
        "(episodes, samples > 0), train (logprob_diff_mean finite"
        + (f", <= {args.max_diff_mean:g})" if unconstrained else "; constrained harness: not bounded)")
        + ", sync (policy_version 1)",
        "4 synced: engine weight version 1; step 2 again with the checkpoint's weights",
        f"results: {args.out or 'runs/gpu-smoke/<timestamp>'}/smoke.json; exit 0 pass, 1 failed check, 2 no CUDA",
    ]


# ------------------------------------------------------------------------------------------------ reward


def noisy_reward(outcome: EpisodeOutcome) -> float:
    """A random reward: every group has variance, so the update has samples whatever the model solves."""
    return random.random()


# ------------------------------------------------------------------------------------------------ checks


def cuda_problem() -> str | None:
    """Why this machine cannot run the smoke (no torch, no CUDA device), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed here: run it with the engine env's python (CUDA build: make envs DEVICE=cuda)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch (torch.cuda.is_available() is False)"
    return None


def start_engine(model: str, out: Path, args: argparse.Namespace) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_URL"}  # serve would reuse it
    cmd = [sys.executable, "-m", "trainer.engine", "serve", "--model", model, "--port", "0", "--cache-dir",
           str(args.cache_dir), "--run-dir", str(out / "engine"), "--kv-cache-gib", str(args.kv_cache_gib)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.budget_s)
    if done.returncode != 0:
        raise SmokeFailure(f"engine: `{' '.join(cmd)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


async def _sample(url: str, prompt_ids: Sequence[int], tokens: int) -> tuple[list[int], list[float], str]:
    from addon.engine.client import EngineClient, GenerationRequest

    async with EngineClient(url) as engine:
        result = await engine.generate(GenerationRequest(prompt_ids=tuple(prompt_ids), max_tokens=tokens, seed=0))
        return list(result.completion_ids), list(result.logprobs), await engine.weight_version()


def recompute(weights: str, prompt: Sequence[int], ids: Sequence[int], captured: Sequence[float],
              device: str = "cuda") -> dict[str, Any]:  # fmt: skip
    """|captured - recomputed| over ``ids`` sampled after ``prompt``: the trainer's :func:`~trainer.grpo.collate` and
    :func:`~trainer.grpo.policy_logprobs` on ``weights`` (fp32, bf16 autocast on CUDA as the Trainer's bf16=True)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.grpo import collate, policy_logprobs
    from trainer.samples import Sample

    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).to(device).eval()  # type: ignore[arg-type]
    n, k = len(prompt), len(ids)
    sample = Sample("smoke", "smoke", "none", 0.0, 0.0, 1.0, (*prompt, *ids), (0,) * n + (1,) * k,
                    (0.0,) * n + tuple(captured), (1.0,) * (n + k), 0)  # fmt: skip
    batch = {key: value.to(device) for key, value in collate([sample]).items()}
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        logp, targets = policy_logprobs(model, batch)
    on = batch["loss_mask"][:, targets].bool()
    diff = (logp - batch["behaviour_logprobs"][:, targets]).abs()[on]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens": k, "diff_mean": float(diff.mean()), "diff_max": float(diff.max())}


def logprob_match(url: str, weights: str, tokens: int) -> dict[str, Any]:
    """The engine's sampled logprobs against the trainer's recomputation with ``weights`` (see the docstring)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(weights)
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                         tokenize=False)  # fmt: skip
    prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids, captured, version = asyncio.run(_sample(url, prompt, tokens))
    if not ids:
        raise SmokeFailure(f"logprob match: the engine sampled no token (weights {weights})")
    return recompute(weights, prompt, ids, captured) | {"version": version}


def check_match(step: str, found: dict[str, Any], limit: float) -> None:
    if not found["tokens"] or not found["diff_mean"] <= limit:
        raise SmokeFailure(f"{step}: mean |captured - recomputed| {found['diff_mean']:.4g} over {found['tokens']} "
                           f"tokens, limit {limit:g} (max {found['diff_max']:.4g})")  # fmt: skip


def iteration(url: str, model: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from trainer import loop
    from trainer.config import RunConfig, default_grpo_config

    run = RunConfig(tasks=args.tasks, harnesses=(args.harness,), max_tasks=1, iterations=1, run_dir=out / "run",
                    model=model, cache_dir=args.cache_dir, engine_url=url, max_length=32768,
                    reward="benchmarks.gpu_smoke:noisy_reward", collect_timeout=args.collect_timeout)  # fmt: skip
    grpo = default_grpo_config(out / "run" / "trainer", num_generations=2, gradient_checkpointing=True)
    state = loop.train_run(run, grpo)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    collect: dict[str, Any] = next((r for r in rows if r["phase"] == "collect"), {})
    train = [r for r in rows if r["phase"] == "train"]
    sync: dict[str, Any] = next((r for r in rows if r["phase"] == "sync"), {})
    found: dict[str, Any] = {
        "checkpoint": state.checkpoint,
        "episodes": collect.get("episodes"),
        "samples": collect.get("samples"),
        "train_steps": len(train),
        "logprob_diff_mean": train[0].get("logprob_diff_mean") if train else None,
        "sync_version": sync.get("policy_version"),
    }
    if not (found["episodes"] and found["samples"]):
        raise SmokeFailure(f"iteration: the collect gave no samples: {collect}")
    diff = found["logprob_diff_mean"]
    if diff is None or not math.isfinite(diff):
        raise SmokeFailure(f"iteration: no train row with a finite logprob_diff_mean: {train}")
    if args.harness not in CONSTRAINED and diff > args.max_diff_mean:
        raise SmokeFailure(f"iteration: trainer logprob_diff_mean {diff:.4g} > {args.max_diff_mean:g} ({args.harness})")
    if found["sync_version"] != 1:
        raise SmokeFailure(f"iteration: sync row {sync}, expected policy_version 1")
    return found


# ------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dry_run:
        print("\n".join(plan(args)))
        return 0
    problem = cuda_problem()
    if problem is not None:
        print(f"gpu_smoke: needs a CUDA GPU: {problem}", file=sys.stderr)
        return 2
    from trainer.engine import stop
    from trainer.model import resolve_model

    out = args.out or REPO / "runs" / "gpu-smoke" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {"plan": plan(args), "steps": {}}

    def step(name: str, fn: Any, *fn_args: Any) -> Any:
        left = args.budget_s - (time.monotonic() - started)
        if left <= 0:
            raise SmokeFailure(f"{name}: the {args.budget_s:.0f} s budget is spent before it starts")
        t0 = time.monotonic()
        found = fn(*fn_args)
        results["steps"][name] = {"seconds": round(time.monotonic() - t0, 1), "found": found}
        print(f"gpu_smoke: {name}: {time.monotonic() - t0:.1f} s: {found}", file=sys.stderr)
        return found

    code = 0
    try:
        model = resolve_model(args.model, args.cache_dir)
        url = step("engine", start_engine, model, out, args)
        check_match("logprob_match", step("logprob_match", logprob_match, url, model, args.tokens), args.max_diff_mean)
        done = step("iteration", iteration, url, model, out, args)
        synced = step("synced", logprob_match, url, done["checkpoint"], args.tokens)
        if synced["version"] != "1":
            raise SmokeFailure(f"synced: the engine serves weight version {synced['version']!r}, expected '1'")
        check_match("synced", synced, args.max_diff_mean)
    except SmokeFailure as e:
        print(f"gpu_smoke: FAILED: {e}", file=sys.stderr)
        results["failed"], code = str(e), 1
    except Exception as e:  # a crash (CUDA OOM, a harness that cannot install) is a failed smoke too, with its trace
        traceback.print_exc()
        results["failed"], code = f"{type(e).__name__}: {e}", 1
    finally:
        stop(out / "engine")
        results["seconds"] = round(time.monotonic() - started, 1)
        (out / "smoke.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"gpu_smoke: {'passed' if code == 0 else 'failed'} in {results['seconds']} s; {out / 'smoke.json'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

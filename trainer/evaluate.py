"""Evaluation: the cross-harness table (pass@1, mean reward, tool calls per harness) on a held-out task split,
before and after training, and the transfer from the trained harnesses to the others.

Contract
--------
* The held-out split (:func:`split_of`): a task is held out when ``sha256("harnessrl-heldout-v1:<task id>")``,
  read as a fraction in [0, 1), is below ``fraction`` (default 0.25). It depends on the task id alone, so it is
  the same on every machine, for every subset, and adding tasks never moves an existing one. :func:`split_tasks`
  applies it to a :class:`~tasks.taskset.TaskSet` (``heldout``, ``train`` or ``all``); the training loop uses
  ``split_tasks(tasks, "train")`` to keep the held-out tasks out of training. An empty selection is an error.
  The ``split`` command writes one side of the split as a task folder (what ``--tasks`` of collect/train reads).
* The comparison lives in :mod:`trainer.comparison` (re-exported here, where callers import it from):
  :func:`compare` (pure; per harness, then ``all``: pass@1, mean reward and mean tool calls before and after with
  95% intervals, their changes, the shaping effect), :func:`transfer` (trained vs other harnesses) and
  :func:`write_comparison` (tables, JSON and PNG bar charts, :data:`COMPARISON_FILES`).
* The trained harnesses (marked in the table, and the transfer table): ``--trained-harnesses``, else with
  ``--run`` :func:`trained_harnesses` reads the run's ``config.json`` (a training run's ``run.harnesses``; an SFT
  run's kept episodes' harnesses).
* :func:`evaluate` (the ``run`` command): serves the base model (``engine_url``, or an engine it starts) and the
  checkpoint (an engine of its own started with ``trainer.engine serve --port 0``, or ``serve="reload"``: the
  weights reloaded into ``engine_url`` and the base weights reloaded at the end), runs ``tasks.collect`` as a
  subprocess in the proxy env on the split for each (``out/before``, ``out/after``), then writes the comparison.
  With ``--run`` (a training run dir) the checkpoint comes from its ``state.json``, the output goes to
  ``RUN/eval`` and one ``phase: eval`` row is appended to ``RUN/metrics.jsonl``. It prints ``comparison.md``.
* The ``compare`` command only reads two collect run dirs and writes (and prints) the comparison (seconds).

CLI: ``python -m trainer.evaluate run|compare|split --help``.

Layout: split, trained harnesses, serving, collect, run, CLI.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from tasks.episodes import EpisodeRecord, read_episodes
from tasks.taskset import TaskSet, builtin_taskset, load_taskset

# ``name as name``: re-exported, so code and tests that import the comparison from trainer.evaluate keep working.
from trainer.comparison import COLUMNS as COLUMNS
from trainer.comparison import COMPARISON_FILES as COMPARISON_FILES
from trainer.comparison import METRICS as METRICS
from trainer.comparison import SHAPING_COLUMNS as SHAPING_COLUMNS
from trainer.comparison import TRANSFER_COLUMNS as TRANSFER_COLUMNS
from trainer.comparison import Change as Change
from trainer.comparison import HarnessComparison as HarnessComparison
from trainer.comparison import Side as Side
from trainer.comparison import Transfer as Transfer
from trainer.comparison import compare as compare
from trainer.comparison import compare_dirs as compare_dirs
from trainer.comparison import comparison_figures as comparison_figures
from trainer.comparison import comparison_json as comparison_json
from trainer.comparison import comparison_markdown as comparison_markdown
from trainer.comparison import difference as difference
from trainer.comparison import eval_metrics_row as eval_metrics_row
from trainer.comparison import transfer as transfer
from trainer.comparison import write_comparison as write_comparison

Split = Literal["heldout", "train", "all"]
SPLITS: Final = ("heldout", "train", "all")
SPLIT_SALT: Final = "harnessrl-heldout-v1"
HELDOUT_FRACTION: Final = 0.25
ROOT: Final = Path(__file__).resolve().parent.parent
PROXY_PYTHON: Final = ROOT / ".venvs" / "proxy" / "bin" / "python"

# ------------------------------------------------------------------------------------------------ split


def split_of(task_id: str, fraction: float = HELDOUT_FRACTION) -> Literal["heldout", "train"]:
    """Which side of the split a task id falls on (see the module docstring)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1], got {fraction}")
    digest = hashlib.sha256(f"{SPLIT_SALT}:{task_id}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < fraction else "train"


def split_tasks(tasks: TaskSet, split: Split, fraction: float = HELDOUT_FRACTION) -> TaskSet:
    """The tasks of ``tasks`` on one side of the split (``all``: unchanged); an empty selection raises."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "all":
        return tasks
    chosen = tuple(t for t in tasks if split_of(t.id, fraction) == split)
    if not chosen:
        raise ValueError(
            f"task set {tasks.name!r} ({len(tasks)} tasks) has no {split} task at fraction {fraction}; "
            "use a larger subset, another --fraction, or --split all"
        )
    return TaskSet(f"{tasks.name}:{split}", chosen)


def load_tasks(spec: str) -> TaskSet:
    """A task folder (or folder of tasks) when the path exists, else a built-in subset name."""
    return load_taskset(spec) if Path(spec).exists() else builtin_taskset(spec)


def task_folder(tasks: TaskSet, dest: Path) -> Path:
    """A folder of symlinks to the tasks' directories: what ``tasks.collect --tasks`` reads as a task set."""
    dest.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        link = dest / task.path.name
        if not link.exists():
            link.symlink_to(task.path, target_is_directory=True)
    return dest


# ------------------------------------------------------------------------------------------------ trained harnesses


def trained_harnesses(run: Path) -> tuple[str, ...]:
    """The harnesses a run trained on, from its ``config.json``: a training run's ``run.harnesses``; an SFT run's
    (``runs`` + ``filter``) harnesses of the episodes its filter keeps (passed, or ``reward >= min_reward``; never a
    collector error). A run dir without config.json, or of neither kind, is an error."""
    config = json.loads((run / "config.json").read_text())
    if "run" in config and config["run"].get("harnesses"):
        return tuple(config["run"]["harnesses"])
    if "runs" in config:
        min_reward = (config.get("filter") or {}).get("min_reward")
        kept = [
            e.harness
            for d in config["runs"]
            for e in read_episodes(Path(d) / "episodes.parquet")
            if e.error is None and (e.verifier_passed if min_reward is None else e.reward >= min_reward)
        ]
        return tuple(dict.fromkeys(kept))
    raise ValueError(
        f"{run}/config.json names no harnesses (neither a training nor an SFT run); use --trained-harnesses"
    )


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(h.strip() for h in (text or "").split(",") if h.strip())


# ------------------------------------------------------------------------------------------------ serving


def _engine_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainer.engine", *args]


@contextmanager
def own_engine(model: str, run_dir: Path, cache_dir: Path) -> Iterator[str]:
    """A vLLM server of our own on a free port serving ``model``; stopped on exit."""
    # `serve` reuses $ENGINE_URL when set; here a new server on `model` is the point
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_URL"}
    serve = subprocess.run(
        _engine_cli("serve", "--model", model, "--port", "0", "--cache-dir", str(cache_dir), "--run-dir", str(run_dir)),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if serve.returncode != 0:
        raise RuntimeError(f"engine for {model} failed to start:\n{serve.stderr[-3000:]}")
    try:
        yield serve.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(_engine_cli("stop", "--run-dir", str(run_dir)), cwd=ROOT, timeout=120, check=False)


async def _reload(url: str, folder: str, version: str | None) -> str:
    """Reload ``folder`` into the engine at ``url`` under ``version`` (None: keep the served version's label);
    returns the version label served before."""
    from addon.engine.client import EngineClient

    async with EngineClient(url) as engine:
        previous = await engine.weight_version()
        await engine.reload_weights(folder, version=previous if version is None else version)
        return previous


@contextmanager
def reloaded(url: str, checkpoint: Path, base_folder: str) -> Iterator[str]:
    """``url``'s engine serving ``checkpoint``'s weights (version ``eval:<checkpoint>``); on exit, even on error,
    the base weights are reloaded under the version label the engine served before, so others see no change."""
    previous = asyncio.run(_reload(url, str(checkpoint), f"eval:{checkpoint}"))
    try:
        yield url
    finally:
        asyncio.run(_reload(url, base_folder, previous))


# ------------------------------------------------------------------------------------------------ collect + run


@dataclass(frozen=True)
class EvalConfig:
    checkpoint: Path
    out: Path
    base: str = "default"
    tasks: str = "easy"
    split: Split = "heldout"
    fraction: float = HELDOUT_FRACTION
    harnesses: tuple[str, ...] = ("pi", "mini-swe-agent")
    group_size: int = 1
    engine_url: str = ""  # serves the base model; empty: an engine is started on `base`
    serve: Literal["own-engine", "reload"] = "own-engine"
    seed: int = 0
    max_calls: int = 8
    timeout_s: float | None = None
    cache_dir: Path = Path(".cache")
    proxy_python: Path = PROXY_PYTHON
    collect_args: tuple[str, ...] = field(default=())
    trained_harnesses: tuple[str, ...] = ()  # marked in the table; the transfer table compares them to the rest

    def __post_init__(self) -> None:
        if self.serve == "reload" and not self.engine_url:
            raise ValueError("serve='reload' needs engine_url (the engine whose weights are swapped and restored)")
        if not (self.checkpoint / "config.json").is_file():
            raise ValueError(f"{self.checkpoint} is not a model folder (no config.json)")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")


def collect_command(config: EvalConfig, tasks_dir: Path, url: str, run_dir: Path) -> list[str]:
    cmd = [
        str(config.proxy_python), "-m", "tasks.collect", "--tasks", str(tasks_dir),
        "--harnesses", ",".join(config.harnesses), "--group-size", str(config.group_size), "--engine-url", url,
        "--run-dir", str(run_dir), "--run-id", f"eval-{run_dir.name}-{int(time.time())}",
        "--seed", str(config.seed), "--max-calls", str(config.max_calls),
    ]  # fmt: skip
    if config.timeout_s is not None:
        cmd += ["--timeout", str(config.timeout_s)]
    return cmd + list(config.collect_args)


def run_collect(config: EvalConfig, tasks_dir: Path, url: str, run_dir: Path) -> list[EpisodeRecord]:
    """One collect in the proxy env (its progress bar passes through); the episodes it wrote."""
    done = subprocess.run(collect_command(config, tasks_dir, url, run_dir), cwd=ROOT, check=False)
    if done.returncode != 0 or not (run_dir / "episodes.parquet").is_file():
        raise RuntimeError(f"collect into {run_dir} failed (exit {done.returncode})")
    return read_episodes(run_dir / "episodes.parquet")


def evaluate(config: EvalConfig, log: Any = sys.stderr) -> list[HarnessComparison]:
    """Collect on the split with the base model, then with the checkpoint, and compare (module docstring)."""
    from trainer.model import resolve_model

    tasks = split_tasks(load_tasks(config.tasks), config.split, config.fraction)
    print(f"eval: {len(tasks)} {config.split} tasks: {', '.join(t.id for t in tasks)}", file=log)
    tasks_dir = task_folder(tasks, config.out / "tasks")
    base = resolve_model(config.base, config.cache_dir)
    base_serving = (
        nullcontext(config.engine_url)
        if config.engine_url
        else own_engine(base, config.out / "engine-base", config.cache_dir)
    )
    with base_serving as url:
        before = run_collect(config, tasks_dir, url, config.out / "before")
    serving: AbstractContextManager[str]
    if config.serve == "reload":
        serving = reloaded(config.engine_url, config.checkpoint, base)
    else:
        serving = own_engine(str(config.checkpoint), config.out / "engine-after", config.cache_dir)
    with serving as url:
        after = run_collect(config, tasks_dir, url, config.out / "after")
    labels = (f"base {config.base}", f"checkpoint {config.checkpoint}")
    described = f"{config.split} split of {config.tasks} ({', '.join(t.id for t in tasks)})"
    rows = write_comparison(config.out, before, after, labels, described, config.trained_harnesses)
    print((config.out / "comparison.md").read_text(), file=log)
    return rows


# ------------------------------------------------------------------------------------------------ CLI


def _run_paths(args: argparse.Namespace) -> tuple[Path, Path, int]:
    """(checkpoint, out, iteration) from --run's state.json, or from --checkpoint/--out."""
    if args.run is not None:
        state = json.loads((args.run / "state.json").read_text())
        if not state.get("checkpoint"):
            raise ValueError(f"{args.run}/state.json names no checkpoint yet")
        return Path(state["checkpoint"]), args.out or args.run / "eval", int(state.get("iteration", 0))
    if args.checkpoint is None:
        raise ValueError("give --run RUN_DIR or --checkpoint DIR")
    return args.checkpoint, args.out or args.checkpoint.parent / "eval", 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="compare two collect run dirs (no model is run)")
    c.add_argument("--before", type=Path, required=True)
    c.add_argument("--after", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument(
        "--trained-harnesses", default="", help="comma-separated: the harnesses the 'after' model trained on"
    )
    r = sub.add_parser("run", help="collect with the base model and a checkpoint on the held-out split, compare")
    r.add_argument("--run", type=Path, default=None, help="a training run dir (checkpoint from its state.json)")
    r.add_argument("--checkpoint", type=Path, default=None)
    r.add_argument("--out", type=Path, default=None, help="default: RUN/eval, or beside the checkpoint")
    r.add_argument("--base", default="default")
    r.add_argument("--tasks", default="easy")
    r.add_argument("--split", choices=SPLITS, default="heldout")
    r.add_argument("--fraction", type=float, default=HELDOUT_FRACTION)
    r.add_argument("--harnesses", default="pi,mini-swe-agent")
    r.add_argument("--group-size", "-G", type=int, default=1)
    r.add_argument("--engine-url", default="", help="an engine serving the base model (empty: start one)")
    r.add_argument("--serve", choices=("own-engine", "reload"), default="own-engine")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-calls", type=int, default=8)
    r.add_argument("--timeout", type=float, default=None)
    r.add_argument("--cache-dir", type=Path, default=Path(".cache"))
    r.add_argument(
        "--trained-harnesses", default=None, help="comma-separated (default: from --run's config.json; else none)"
    )
    s = sub.add_parser("split", help="write one side of the held-out split as a task folder; print its path")
    s.add_argument("--tasks", default="easy")
    s.add_argument("--split", choices=SPLITS, default="train")
    s.add_argument("--fraction", type=float, default=HELDOUT_FRACTION)
    s.add_argument("--out", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compare":
            compare_dirs(args.before, args.after, args.out, _names(args.trained_harnesses))
            print((args.out / "comparison.md").read_text())
            return 0
        if args.command == "split":
            print(task_folder(split_tasks(load_tasks(args.tasks), args.split, args.fraction), args.out).resolve())
            return 0
        checkpoint, out, iteration = _run_paths(args)
        trained = _names(args.trained_harnesses)
        if args.trained_harnesses is None and args.run is not None:
            trained = trained_harnesses(args.run)
        started = time.monotonic()
        rows = evaluate(
            EvalConfig(
                checkpoint=checkpoint, out=out, base=args.base, tasks=args.tasks, split=args.split,
                fraction=args.fraction, harnesses=tuple(h for h in args.harnesses.split(",") if h),
                group_size=args.group_size, engine_url=args.engine_url, serve=args.serve, seed=args.seed,
                max_calls=args.max_calls, timeout_s=args.timeout, cache_dir=args.cache_dir, trained_harnesses=trained,
            )
        )  # fmt: skip
        if args.run is not None:
            with (args.run / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(eval_metrics_row(iteration, time.monotonic() - started, rows)) + "\n")
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

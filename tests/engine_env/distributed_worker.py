"""One rank of the multi-process training test (tests/engine_env/test_distributed.py); not a test module itself.

Run as ``accelerate launch --cpu --num_processes N tests/engine_env/distributed_worker.py SPEC.json`` (or with plain
``python`` for the one-process reference). It runs the real :func:`trainer.loop.train_run` with the default model,
replacing only the three phases that reach outside the process (:class:`trainer.loop.Phases`): the engines (none),
the collect (a copy of a crafted collect folder: episodes.parquet + record shards) and the weight push (recorded,
not sent). Everything else is the loop's own code: samples, ``Trainer.train()`` under DDP, checkpoints, state,
metrics, resume.

Each rank writes ``<report_dir>/rank-<r>.json`` (outside the run dir): the world size, a digest of the samples
it builds from the collect folder; per ``train()`` (a ``TrainerCallback``) the micro-batches its data loader held
and digests of its own in-memory weights and optimizer state at the end; the collects and pushes it ran; and every
file-system write it made under the run dir, seen through a Python audit hook (``open`` for writing, mkdir,
rename/replace, remove, rmtree). Native writers that bypass Python's ``open`` (safetensors) are not seen; they run
inside ``Trainer.save_model``, which writes on the main process only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def watch_writes(root: Path, seen: list[str]) -> None:
    """Record every write-like file-system event under ``root`` into ``seen`` (a Python audit hook)."""
    prefix = str(root.resolve())

    def under(path: Any) -> str | None:
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str | os.PathLike):
            return None
        full = os.path.abspath(os.fspath(path))
        return full if full.startswith(prefix) else None

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args:
            mode, flags = args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            path = under(args[0]) if writing else None
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "shutil.copytree"):
            path = under(args[0]) if args else None
        else:
            return
        if path is not None:
            seen.append(f"{event} {path}")

    sys.addaudithook(hook)


def digest_samples(samples: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(repr((s.session_id, s.input_ids, s.loss_mask, s.behaviour_logprobs, s.advantage)).encode())
    return h.hexdigest()


def digest_weights(state_dict: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def digest_optimizer(optimizer: Any) -> str:
    h = hashlib.sha256()
    for slot, values in sorted(optimizer.state_dict()["state"].items()):
        for key in sorted(values):
            h.update(f"{slot}/{key}".encode())
            h.update(values[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    run_dir, crafted, report_dir = Path(spec["run_dir"]), Path(spec["collect"]), Path(spec["report_dir"])
    writes: list[str] = []
    watch_writes(run_dir, writes)

    from accelerate import PartialState

    from trainer import loop
    from trainer.config import RunConfig, default_grpo_config
    from trainer.sync import SyncResult

    args = default_grpo_config(run_dir / "trainer", **spec["grpo"])  # sets up the process group
    ranks = PartialState()
    run = RunConfig(run_dir=run_dir, model=spec["model"], iterations=spec["iterations"], max_length=512)
    pushes: list[dict[str, Any]] = []
    collects: list[str] = []

    def engines(_: RunConfig) -> tuple[tuple[str, ...], bool]:
        return tuple(spec["engine_urls"]), False

    def collect(_: RunConfig, group_size: int, url: str, out: Path, iteration: int) -> None:
        collects.append(url)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(crafted, out)

    def push(urls: Sequence[str], folder: Path, version: int) -> SyncResult:
        pushes.append({"urls": list(urls), "folder": str(folder), "version": version})
        return SyncResult(0.0, {u: 0.0 for u in urls})

    from transformers import TrainerCallback

    trains: list[dict[str, Any]] = []

    class Observe(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kw: Any) -> None:
            trains.append({"micro_batches": len(train_dataloader)})

        def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            trains[-1]["weights"] = digest_weights(model.state_dict())
            trains[-1]["optimizer"] = digest_optimizer(kw["optimizer"])
            trains[-1]["steps"] = state.global_step

    phases = loop.Phases(start_engines=engines, run_collect=collect, push_weights=push)
    state = loop.train_run(run, args, phases, callbacks=[Observe()])
    sampled, _ = loop.load_samples(run, args, run_dir / f"iter-{state.iteration:04d}" / "collect", 0)
    report = {
        "rank": ranks.process_index,
        "world": ranks.num_processes,
        "state": [state.iteration, state.policy_version, state.checkpoint],
        "samples": sampled.stats.samples,
        "samples_digest": digest_samples(sampled.samples),
        "trains": trains,
        "collects": collects,
        "pushes": pushes,
        "writes": writes,
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / f"rank-{ranks.process_index}.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Checkpoints and weight sync: what the trainer saves, and how the running vLLM engine comes to serve it.

Contract
--------
* :func:`save_checkpoint` writes ``save_pretrained`` output plus the tokenizer (``Trainer.save_model``) into a
  folder the engine can reload and ``from_pretrained`` can load, and the optimizer state under
  ``<folder>/trainer/optimizer.pt`` (a subfolder: vLLM's loader only globs the top level for weights). Under
  ``accelerate launch`` every rank calls it (``save_model`` is collective where weights are sharded) and only the
  main process writes (``args.should_save``); with DDP the optimizer state is the same on every rank, so rank 0's
  copy is the state. :func:`load_optimizer_state` restores it (every rank reads the same file) into a trainer whose
  optimizer exists (``create_optimizer``) before the first ``train()``; ``Trainer`` keeps an existing optimizer
  across ``train()`` calls.
* :func:`prune_checkpoints` keeps the newest ``limit`` ``iter-*`` folders (GRPOConfig.save_total_limit).
* :func:`sync_weights` makes every engine of a list serve a folder under a policy version, concurrently (one
  engine's reload does not wait for another's). Per engine: pause (in-flight requests finish on the old weights),
  ``reload_weights`` in place, ``reset_prefix_cache`` (cached KV was computed by the old weights), set the weight
  version to ``str(version)`` (the proxy polls it and stamps every record with it), resume, then read the version
  back — all through :class:`addon.engine.client.EngineClient`. Returns :class:`SyncResult` (wall seconds of the
  fan-out and seconds per engine). When any engine fails, :class:`SyncError` names each failed engine with its
  error and lists the engines that did switch (the replicas then serve different versions until the next sync).
* :func:`served_version` reads the engine's current weight version as an int (None when it is not a number).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from addon.engine.client import EngineClient

OPTIMIZER_FILE = Path("trainer") / "optimizer.pt"


def save_checkpoint(trainer: Any, folder: Path) -> Path:
    """Model + tokenizer (loadable with ``from_pretrained``; reloadable by vLLM) and the optimizer state."""
    import torch

    main = bool(trainer.args.should_save)
    if main:  # the other ranks take part in save_model (collective when sharded) but write nothing
        folder.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(folder))
    if main and trainer.optimizer is not None:
        (folder / OPTIMIZER_FILE).parent.mkdir(exist_ok=True)
        torch.save(trainer.optimizer.state_dict(), folder / OPTIMIZER_FILE)
    return folder


def load_optimizer_state(trainer: Any, folder: Path) -> bool:
    """Restore the optimizer state saved with a checkpoint; False when the checkpoint has none."""
    import torch

    path = folder / OPTIMIZER_FILE
    if not path.exists():
        return False
    trainer.create_optimizer()
    trainer.optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return True


def prune_checkpoints(checkpoints: Path, limit: int | None, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest ``limit`` ``iter-*`` folders (never ``keep``); returns what was deleted."""
    if limit is None or limit < 1:
        return []
    folders = sorted(p for p in checkpoints.glob("iter-*") if p.is_dir())
    doomed = [p for p in folders[:-limit] if keep is None or p.resolve() != keep.resolve()]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


@dataclass(frozen=True)
class SyncResult:
    seconds: float  # wall time of the whole fan-out
    per_engine: Mapping[str, float]  # url -> seconds of that engine's reload


class SyncError(RuntimeError):
    """One or more engines did not switch to the new weights; ``failures`` maps each such URL to its error."""

    def __init__(self, version: int, failures: Mapping[str, BaseException], switched: Sequence[str]) -> None:
        lines = [f"engine {url}: {type(e).__name__}: {e}" for url, e in failures.items()]
        tail = f"; these engines switched: {', '.join(switched)}" if switched else ""
        head = f"weight sync to policy version {version} failed on {len(failures)} engine(s){tail}"
        super().__init__(head + "\n  " + "\n  ".join(lines))
        self.failures = dict(failures)
        self.switched = tuple(switched)


async def _sync_one(url: str, folder: Path, version: int) -> float:
    async with EngineClient(url) as client:
        result = await client.reload_weights(folder, version=str(version))
        served = await client.weight_version()
    if served != str(version):
        raise RuntimeError(f"the engine reports weight version {served!r} after setting {version}")
    return result.seconds


async def _sync(urls: Sequence[str], folder: Path, version: int) -> SyncResult:
    started = time.monotonic()
    outcomes = await asyncio.gather(*(_sync_one(u, folder, version) for u in urls), return_exceptions=True)
    failures: dict[str, BaseException] = {}
    per_engine: dict[str, float] = {}
    for url, outcome in zip(urls, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            failures[url] = outcome
        else:
            per_engine[url] = outcome
    if failures:
        raise SyncError(version, failures, list(per_engine))
    return SyncResult(time.monotonic() - started, per_engine)


def sync_weights(urls: str | Sequence[str], folder: Path, version: int) -> SyncResult:
    """Make every engine of ``urls`` (one URL or several) serve ``folder`` as policy ``version``; see the contract."""
    targets = [urls] if isinstance(urls, str) else list(urls)
    if not targets:
        raise ValueError("sync_weights: no engine URL given")
    return asyncio.run(_sync(targets, folder, version))


async def _version(url: str) -> str:
    async with EngineClient(url) as client:
        return await client.weight_version()


def served_version(url: str) -> int | None:
    v = asyncio.run(_version(url))
    return int(v) if v.isdigit() else None

"""Checkpoints and weight sync: what the trainer saves, and how the running vLLM engine comes to serve it.

Contract
--------
* :func:`save_checkpoint` writes ``save_pretrained`` output plus the tokenizer (``Trainer.save_model``) into a
  folder the engine can reload and ``from_pretrained`` can load, and the optimizer state under
  ``<folder>/trainer/optimizer.pt`` (a subfolder: vLLM's loader only globs the top level for weights).
  :func:`load_optimizer_state` restores it into a trainer whose optimizer exists (``create_optimizer``) before the
  first ``train()``; ``Trainer`` keeps an existing optimizer across ``train()`` calls.
* :func:`prune_checkpoints` keeps the newest ``limit`` ``iter-*`` folders (GRPOConfig.save_total_limit).
* :func:`sync_weights` makes the engine serve a folder under a policy version: pause (in-flight requests finish on
  the old weights), ``reload_weights`` in place, ``reset_prefix_cache`` (cached KV was computed by the old
  weights), set the weight version to ``str(version)`` (the proxy polls it and stamps every record with it),
  resume — all through :class:`addon.engine_client.EngineClient`. Returns the measured seconds.
* :func:`served_version` reads the engine's current weight version as an int (None when it is not a number).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from addon.engine_client import EngineClient

OPTIMIZER_FILE = Path("trainer") / "optimizer.pt"


def save_checkpoint(trainer: Any, folder: Path) -> Path:
    """Model + tokenizer (loadable with ``from_pretrained``; reloadable by vLLM) and the optimizer state."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(folder))
    if trainer.optimizer is not None:
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


async def _sync(url: str, folder: Path, version: int) -> float:
    async with EngineClient(url) as client:
        result = await client.reload_weights(folder, version=str(version))
        served = await client.weight_version()
    if served != str(version):
        raise RuntimeError(f"the engine reports weight version {served!r} after setting {version}")
    return result.seconds


def sync_weights(url: str, folder: Path, version: int) -> float:
    """Make the engine at ``url`` serve ``folder`` as policy ``version``; returns the seconds it took."""
    return asyncio.run(_sync(url, folder, version))


async def _version(url: str) -> str:
    async with EngineClient(url) as client:
        return await client.weight_version()


def served_version(url: str) -> int | None:
    v = asyncio.run(_version(url))
    return int(v) if v.isdigit() else None

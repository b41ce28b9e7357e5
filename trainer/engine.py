"""Start, find and stop the vLLM server that samples for the proxy and the trainer (engine env).

Contract
--------
* What the server is started with lives in :mod:`trainer.engine_config` (re-exported here, where callers import it
  from): :class:`EngineConfig` (build it with :meth:`EngineConfig.for_model`, which detects the device and fills in
  the device-dependent defaults), :func:`server_command` / :func:`server_env` (the exact command line and
  environment, flag by flag with the reason for each), the context rule (:data:`HARNESS_CONTEXT`) and the port
  helpers.
* :func:`start` launches the server in its own process group, logs to a file, records a JSON state file
  (:class:`EngineState`) in the run dir and waits for ``/health``, printing progress on stderr; if the process dies
  or the timeout passes it is stopped and :class:`EngineStartError` carries the log tail. :func:`stop` sends SIGTERM
  to the group, then SIGKILL after a grace period. :func:`ensure_engine` reuses an ``ENGINE_URL`` or a healthy
  recorded server instead of starting another.

CLI: ``python -m trainer.engine serve [--model M] [--port P] [--cache-dir D] [--run-dir R] [--foreground]``
(background by default: prints the URL once healthy and exits, leaving the server running), ``stop``, ``status``.

Layout: state file, health wait, start/stop/ensure, CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

# ``name as name``: re-exported, so code and tests that import the config's names from trainer.engine keep working.
from trainer.engine_config import CPU_KV_CACHE_BYTES as CPU_KV_CACHE_BYTES
from trainer.engine_config import DTYPES as DTYPES
from trainer.engine_config import HARNESS_CONTEXT, EngineConfig, port_in_use, server_command, server_env
from trainer.engine_config import MAX_DEFAULT_CONTEXT as MAX_DEFAULT_CONTEXT
from trainer.engine_config import Device as Device
from trainer.engine_config import detect_device as detect_device
from trainer.engine_config import free_port as free_port
from trainer.engine_config import model_context_length as model_context_length
from trainer.engine_config import model_positions as model_positions
from trainer.model import DEFAULT_CACHE_DIR, ModelError, resolve_model

DEFAULT_RUN_DIR = Path("runs/engine")
STATE_FILE = "engine.json"


class EngineStartError(RuntimeError):
    """The server exited or never became healthy. The message ends with the tail of its log."""


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

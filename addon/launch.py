"""Start and stop ``mitmdump -s addon/capture.py`` from Python (tests, benchmarks, collection) or the command line.

Contract
--------
``ProxyConfig`` says how to run it; ``start(config)`` launches mitmdump in its own process group, waits until its CA
exists and the addon's internal server answers (model calls arriving before the rest of the start-up ends wait for it,
at most ``harnessrl_startup_wait_s``, and never pass through) and returns a :class:`ProxyHandle`; ``handle.stop()``
ends it. A mitmdump that exits first (a start-up failure exits with status 1 and logs ``harnessrl: cannot start:
<reason>``) makes ``start`` raise ``RuntimeError`` with the log's tail at once, not after ``startup_timeout``.
In regular mode the session comes from the proxy credentials (``proxyauth=any``); in reverse mode (a base URL) from
the ``/s/<session>`` path prefix — proxyauth would demand HTTP auth there, so it is off.

``start_shared(config, procs)`` starts ``procs`` such proxies behind the one port ``config.port`` (each also listens
there with ``SO_REUSEPORT``; sessions are answered by one process each: :mod:`addon.serving.shared_port`): one
``HTTPS_PROXY``, one CA (a shared confdir, made by the first process before the others start), the internal port of
process ``k`` is ``handles[k].admin_port`` (``config.admin_port`` for the first; any of them answers the admin
routes for all), its records go to ``<records>/worker-<k>`` for k > 0 and its log to ``mitmdump-<k>.log``.

CLI (proxy env): ``python -m addon.launch --engine-url URL [--port P] [--procs N] [--records-dir D]
[--set name=value ...]`` runs in the foreground until Ctrl-C, printing the ``HTTPS_PROXY`` and CA path to use.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from addon.serving.workers import worker_records_dir

ROOT = Path(__file__).resolve().parent.parent
MITMDUMP = Path(sys.executable).parent / "mitmdump"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, taken: Iterable[int] = ()) -> list[int]:
    """``n`` distinct free loopback ports, none of them in ``taken``. The sockets are held open together while the
    ports are picked: one at a time, the kernel may hand out the same port twice (CI saw a proxy whose admin port
    was its own listening port)."""
    held: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in taken:
                ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


@dataclass(frozen=True)
class ProxyConfig:
    engine_url: str
    workdir: Path  # confdir (CA), records and the log go here unless given
    port: int = 0  # 0: a free port
    admin_port: int = 0
    mode: str = "regular"
    records_dir: Path | None = None
    options: tuple[str, ...] = ()  # extra "name=value" for --set
    startup_timeout: float = 120.0
    env: tuple[tuple[str, str], ...] = ()  # extra environment for mitmdump (e.g. PYTHONTRACEMALLOC)

    def __post_init__(self) -> None:
        for opt in self.options:
            if "=" not in opt:
                raise ValueError(f"proxy option {opt!r} must look like name=value")


@dataclass
class ProxyHandle:
    process: subprocess.Popen
    port: int
    admin_port: int
    confdir: Path
    records: Path
    log: Path
    mode: str = field(default="regular")

    @property
    def ca(self) -> Path:
        return self.confdir / "mitmproxy-ca-cert.pem"

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting this proxy's CA (for httpx clients in tests and benchmarks)."""
        return ssl.create_default_context(cafile=str(self.ca))

    def url(self, session: str) -> str:
        """``HTTPS_PROXY`` for a harness whose calls belong to ``session``."""
        return f"http://{session}:token@127.0.0.1:{self.port}"

    def base_url(self, session: str) -> str:
        """Reverse mode: a base URL whose path prefix names the session."""
        return f"http://127.0.0.1:{self.port}/s/{session}"

    def internal_base_url(self, session: str) -> str:
        """The session's base URL on the internal server (``harnessrl_base_url``): no mitmproxy hop, plain HTTP."""
        return f"http://127.0.0.1:{self.admin_port}/s/{session}"

    def admin(self, method: str, path: str) -> dict:
        r = httpx.request(method, f"http://127.0.0.1:{self.admin_port}/_harnessrl/admin/{path}", timeout=60)
        r.raise_for_status()
        return r.json()

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def command(config: ProxyConfig, port: int, admin_port: int, records: Path) -> list[str]:
    cmd = [str(MITMDUMP), "--mode", config.mode, "--listen-host", "127.0.0.1", "--listen-port", str(port)]
    cmd += ["--set", f"confdir={config.workdir / 'mitm'}", "--set", "connection_strategy=lazy"]
    cmd += ["--set", "upstream_cert=false", "-s", str(ROOT / "addon" / "capture.py")]
    # no per-flow lines from mitmdump's dumper (each model call is a retargeted flow; options below can set it back)
    cmd += ["--set", "flow_detail=0"]
    if config.mode == "regular":
        cmd += ["--set", "proxyauth=any"]
    cmd += ["--set", f"harnessrl_engine_url={config.engine_url}", "--set", f"harnessrl_records_dir={records}"]
    cmd += ["--set", f"harnessrl_server_port={admin_port}"]
    for opt in config.options:
        cmd += ["--set", opt]
    return cmd


def start(config: ProxyConfig) -> ProxyHandle:
    handle = _spawn(config)
    _wait_ready(handle, config.startup_timeout)
    return handle


def start_shared(config: ProxyConfig, procs: int) -> list[ProxyHandle]:
    """``procs`` proxies behind one port (see the module docstring); all or none: a failure stops those started."""
    if procs < 1:
        raise ValueError(f"procs must be >= 1, got {procs}")
    given = [p for p in (config.port, config.admin_port) if p]
    picked = iter(free_ports(2 * procs + 1, taken=given))  # public, internal and private ports, all distinct
    port = config.port or next(picked)
    internal = [config.admin_port or next(picked)] + [next(picked) for _ in range(procs - 1)]
    records = config.records_dir or config.workdir / "records"
    sharing = (f"harnessrl_shared_port={port}", f"harnessrl_peer_ports={','.join(map(str, internal))}")
    configs = [
        replace(
            config,
            port=next(picked),  # mitmproxy's own listener: private; clients use the shared port
            admin_port=internal[k],
            records_dir=worker_records_dir(records, k),
            options=(*config.options, *sharing),
        )
        for k in range(procs)
    ]
    handles: list[ProxyHandle] = []
    try:
        handles.append(_spawn(configs[0], "mitmdump-0.log", port))
        _wait_ready(handles[0], config.startup_timeout)  # its CA first: every process must present the same one
        handles += [_spawn(c, f"mitmdump-{k}.log", port) for k, c in enumerate(configs[1:], 1)]
        for h in handles[1:]:
            _wait_ready(h, config.startup_timeout)
        for h in handles:  # and each sees every other one listening, so no session starts with a 503
            _wait_peers(h, config.startup_timeout)
    except BaseException:
        for h in handles:
            h.stop()
        raise
    return handles


def _spawn(config: ProxyConfig, log_name: str = "mitmdump.log", public_port: int | None = None) -> ProxyHandle:
    config.workdir.mkdir(parents=True, exist_ok=True)
    given = [p for p in (config.port, config.admin_port) if p]
    picked = iter(free_ports(2 - len(given), taken=given))
    port, admin = config.port or next(picked), config.admin_port or next(picked)
    records = config.records_dir or config.workdir / "records"
    log = config.workdir / log_name
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command(config, port, admin, records),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=os.environ | dict(config.env) if config.env else None,
            start_new_session=True,
        )
    return ProxyHandle(proc, public_port or port, admin, config.workdir / "mitm", records, log, config.mode)


def _wait_ready(handle: ProxyHandle, timeout: float) -> None:
    proc, log = handle.process, handle.log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mitmdump exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if handle.ca.exists() and _answers(handle.admin_port):
            return
        time.sleep(0.2)
    handle.stop()
    raise TimeoutError(f"mitmdump not ready after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def _wait_peers(handle: ProxyHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        peers = handle.admin("GET", "stats").get("worker_processes", [])
        if peers and all(p["up"] for p in peers):
            return
        time.sleep(0.1)
    raise TimeoutError(f"the processes sharing port {handle.port} did not all see each other in {timeout:.0f}s")


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/_harnessrl/admin/stats", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m addon.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-url", required=True)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--workdir", type=Path, default=Path("runs/proxy"))
    ap.add_argument("--records-dir", type=Path, default=None)
    ap.add_argument("--mode", default="regular")
    ap.add_argument("--procs", type=int, default=1, help="mitmdump processes sharing the port (about one per core)")
    ap.add_argument("--set", dest="options", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args(argv)
    cfg = ProxyConfig(args.engine_url, args.workdir, args.port, 0, args.mode, args.records_dir, tuple(args.options))
    handles = start_shared(cfg, args.procs) if args.procs > 1 else [start(cfg)]
    handle = handles[0]
    print(f"proxy ready on 127.0.0.1:{handle.port} (records: {handle.records}, log: {handle.log})", file=sys.stderr)
    if len(handles) > 1:
        print(f"  {len(handles)} processes share the port (logs beside {handle.log})", file=sys.stderr)
    if handle.mode == "regular":
        print(f"  HTTPS_PROXY=http://SESSION:token@127.0.0.1:{handle.port}", file=sys.stderr)
        print(f"  CA: {handle.ca} (NODE_EXTRA_CA_CERTS / SSL_CERT_FILE / CODEX_CA_CERTIFICATE)", file=sys.stderr)
    else:
        print(f"  base URL: http://127.0.0.1:{handle.port}/s/SESSION", file=sys.stderr)
    print(f"  admin: http://127.0.0.1:{handle.admin_port}/_harnessrl/admin/stats", file=sys.stderr)
    try:
        while all(h.process.poll() is None for h in handles):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    for h in handles:
        h.stop()
    return max(h.process.returncode or 0 for h in handles)


if __name__ == "__main__":
    sys.exit(main())

"""Run one harness on one instruction through the capture proxy.

Contract
--------
:func:`run_harness` installs the harness if needed (cached), then runs one instruction in ``workdir`` with a private
``HOME`` and ``TMPDIR`` (a scratch folder, removed afterwards unless the caller passes ``scratch``), a clean
environment (only ``PATH``/``LANG``/``TERM`` inherited, so no stray keys or proxies leak in), ``HTTPS_PROXY`` set
to ``proxy_url`` (which carries the session id as the proxy user) and every CA variable the harness honours
pointing at a bundle of the system roots plus the mitmproxy CA (Python's ``SSL_CERT_FILE`` *replaces* the trust
store, so the bare mitmproxy CA would not do). The harness runs in its own process group; the whole group is
killed on timeout and after it exits, so nothing it started outlives the run.

By default it runs in the namespaces sandbox (``tasks.sandbox``): its network reaches only the proxy (through a
relay on the proxy's port number inside, so ``HTTPS_PROXY`` is unchanged), the workspace is mounted at ``/app``
and the harness starts there, and a :class:`~tasks.sandbox.Watchdog` kills the run when its process tree passes
the memory or CPU limit. ``HarnessRun.limit`` then says which limit (``time``, ``memory`` or ``cpu``) ended it,
``timed_out`` is true (a limit is a budget stop) and the reason is appended to the stderr tail.

With ``base_url`` (a harness that overrides :meth:`~tasks.harnesses.base.HarnessSpec.base_url_env`) the harness gets
its base-URL variables instead of ``HTTPS_PROXY`` and calls the proxy's internal server straight, skipping
mitmproxy's hop; the sandbox's relay then carries that port.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tasks.harnesses.base import HarnessRun, HarnessSpec, LimitKind, write_ca_bundle
from tasks.harnesses.install import DEFAULT_TOOLS_DIR, install
from tasks.sandbox import POLL_S, SandboxConfig, Watchdog, sandboxed

TAIL_CHARS = 4000
# Passed through from the caller's environment; everything else a harness sees is set here.
_INHERITED = ("PATH", "LANG", "TERM")
_KILL_GRACE_S = 5.0


def harness_env(
    spec: HarnessSpec,
    home: Path,
    proxy_url: str,
    bundle: Path,
    path_dirs: list[Path],
    base_url: str | None = None,
) -> dict[str, str]:
    """The whole environment of a run (see the module docstring); ``base_url``: no ``HTTPS_PROXY``, the harness's
    base-URL variables instead (:meth:`HarnessSpec.base_url_env`; ``ValueError`` for a harness without them)."""
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    env["PATH"] = os.pathsep.join([*(str(d) for d in path_dirs), env.get("PATH", "/usr/bin:/bin")])
    tmp = home.parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env |= {"HOME": str(home), "TMPDIR": str(tmp)}
    if base_url is None:
        env |= {"HTTPS_PROXY": proxy_url, "https_proxy": proxy_url, "NO_PROXY": "", "no_proxy": ""}
    env |= {var: str(bundle) for var in spec.ca_vars}
    env |= dict(spec.env())
    if base_url is not None:
        route = spec.base_url_env(base_url)
        if route is None:
            raise ValueError(f"{spec.name} takes no base URL from its environment: run it through HTTPS_PROXY")
        env |= dict(route)
    return env


def run_harness(
    spec: HarnessSpec,
    instruction: str,
    workdir: Path,
    proxy_url: str,
    ca_path: Path,
    timeout: float | None = None,
    *,
    scratch: Path | None = None,
    tools_dir: Path = DEFAULT_TOOLS_DIR,
    sandbox: SandboxConfig = SandboxConfig(),
    base_url: str | None = None,
) -> HarnessRun:
    """Install ``spec`` if needed (cached), then run it once on ``instruction`` through the proxy."""
    executable = install(spec, tools_dir).executable
    return run_executable(
        spec,
        executable,
        instruction,
        workdir,
        proxy_url,
        ca_path,
        timeout,
        scratch=scratch,
        sandbox=sandbox,
        base_url=base_url,
    )


def run_executable(
    spec: HarnessSpec,
    executable: Path,
    instruction: str,
    workdir: Path,
    proxy_url: str,
    ca_path: Path,
    timeout: float | None = None,
    *,
    scratch: Path | None = None,
    sandbox: SandboxConfig = SandboxConfig(),
    base_url: str | None = None,
) -> HarnessRun:
    """Run ``spec``'s command with ``executable`` (already installed); ``scratch`` holds HOME, TMPDIR and logs.

    ``base_url`` (a session's base URL on the proxy's internal server): the harness calls it straight instead of
    going through ``HTTPS_PROXY``, and the sandbox relays that port."""
    if scratch is None:
        with tempfile.TemporaryDirectory(prefix=f"harnessrl-{spec.name}-", ignore_cleanup_errors=True) as tmp:
            return run_executable(
                spec,
                executable,
                instruction,
                workdir,
                proxy_url,
                ca_path,
                timeout,
                scratch=Path(tmp),
                sandbox=sandbox,
                base_url=base_url,
            )
    home = scratch / "home"
    home.mkdir(parents=True, exist_ok=True)
    seen_workdir = workdir if sandbox.mode == "none" else Path(sandbox.workdir)
    for rel, content in spec.config_files(seen_workdir).items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(content)
    bundle = write_ca_bundle(ca_path, scratch / "ca-bundle.pem")
    # node for npm harnesses' shebangs; the venv's bin for Python ones
    path_dirs = [executable.parent, *_node_dir()]
    env = harness_env(spec, home, proxy_url, bundle, path_dirs, base_url)
    out, err = scratch / "stdout.log", scratch / "stderr.log"
    limit = timeout if timeout is not None else spec.timeout_s
    command = spec.command(executable, instruction)
    t0 = time.monotonic()
    with (
        out.open("wb") as fo,
        err.open("wb") as fe,
        sandboxed(sandbox, command, workdir, scratch / "sandbox", proxy_url=base_url or proxy_url) as prepared,
    ):
        proc = subprocess.Popen(
            prepared.argv,
            cwd=prepared.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            start_new_session=True,
        )
        cpu = sandbox.cpu_seconds if sandbox.cpu_seconds is not None else limit
        killed_by = _wait(proc, limit, Watchdog(proc.pid, sandbox.memory_mb, cpu))
    if killed_by is not None:
        with err.open("a") as fe_text:
            fe_text.write(f"\n[harnessrl] killed at the {killed_by[0]} limit: {killed_by[1]}\n")
    return HarnessRun(
        harness=spec.name,
        version=spec.version,
        exit_code=None if killed_by else proc.returncode,
        stdout_tail=_tail(out),
        stderr_tail=_tail(err),
        duration=time.monotonic() - t0,
        timed_out=killed_by is not None,
        limit=killed_by[0] if killed_by else None,
    )


def _wait(proc: subprocess.Popen[bytes], limit: float, watchdog: Watchdog) -> tuple[LimitKind, str] | None:
    """Wait up to ``limit`` seconds while ``watchdog`` holds; kill the process group either way.

    Returns the limit that stopped the run and why, None when it ended by itself.
    """
    deadline = time.monotonic() + limit
    killed_by: tuple[LimitKind, str] | None = None
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            killed_by = ("time", f"ran past {limit:g} s")
        else:
            killed_by = watchdog.exceeded()
        if killed_by is not None:
            break
        time.sleep(POLL_S)
    if killed_by is not None:
        # a memory hog gets no grace: it would go on growing while it shuts down
        _signal_group(proc.pid, signal.SIGTERM if killed_by[0] == "time" else signal.SIGKILL)
        try:
            proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)  # stray children (MCP servers, shells) die with the run
    proc.wait()
    return killed_by


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _node_dir() -> list[Path]:
    node = shutil.which("node")
    return [Path(os.path.realpath(node)).parent] if node else []


def _tail(path: Path) -> str:
    return path.read_bytes()[-TAIL_CHARS:].decode("utf-8", errors="replace")

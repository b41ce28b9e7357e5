"""tasks.sandbox and tasks.relay: the namespaces sandbox the runner puts every harness in.

Commands run through the real runner (``run_executable`` with ``bash`` as the harness) inside real namespaces. A
small TCP server stands in for the proxy: the sandbox only relays bytes to the proxy's port, so what matters is that
this one port is reachable and nothing else is (another local port, DNS). The harness e2e tests
(tests/test_harnesses.py) run every real harness through the real proxy in this sandbox.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks import sandbox
from tasks.harnesses import run_executable
from tasks.relay import UnixToTcp
from tasks.sandbox import Mount, SandboxConfig, SandboxError, Watchdog, check_available, sandboxed, tree_usage
from tests.test_harnesses import BashProbe, alive

BASH = Path("/bin/bash")


@pytest.fixture
def fake_ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n")
    return ca


@pytest.fixture
def greeter() -> Iterator[int]:
    """A TCP server on loopback that greets each connection with the bytes it was sent back, echo style."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"proxy:" + conn.recv(100))

    threading.Thread(target=loop, daemon=True).start()
    yield srv.getsockname()[1]
    stop.set()
    srv.shutdown(socket.SHUT_RDWR)
    srv.close()


def run_in_sandbox(
    script: str, tmp_path: Path, ca: Path, port: int = 1, timeout: float = 30, scratch: str = "s", **limits: float
):
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    config = SandboxConfig(**limits)  # type: ignore[arg-type]  # memory_mb / cpu_seconds from the test
    url, where = f"http://sess:tok@127.0.0.1:{port}", tmp_path / scratch
    return run_executable(BashProbe(), BASH, script, workdir, url, ca, timeout, scratch=where, sandbox=config)


CONNECT = "import socket,sys; s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),timeout=3); s.sendall(b'hi')"


def test_only_the_proxy_port_is_reachable(tmp_path: Path, fake_ca: Path, greeter: int) -> None:
    other = socket.create_server(("127.0.0.1", 0))  # listening outside: must stay out of reach
    script = f"""
python3 -c "{CONNECT}; print(s.recv(100).decode())" {greeter}
python3 -c "{CONNECT}" {other.getsockname()[1]} 2>&1 | tail -n 1
python3 -c "import socket; socket.getaddrinfo('pypi.org', 443)" 2>&1 | tail -n 1
echo "$HTTPS_PROXY"
"""
    with other:
        run = run_in_sandbox(script, tmp_path, fake_ca, greeter)
    assert run.exit_code == 0, run.stderr_tail
    proxied, refused, dns, proxy_var = run.stdout_tail.splitlines()
    assert proxied == "proxy:hi"
    assert "ConnectionRefusedError" in refused
    assert "gaierror" in dns
    assert proxy_var == f"http://sess:tok@127.0.0.1:{greeter}"  # unchanged: the relay listens on the same port


def test_a_scratch_path_too_long_for_a_unix_socket_still_works(tmp_path: Path, fake_ca: Path, greeter: int) -> None:
    deep = "/".join(["a-rather-long-folder-name"] * 5)  # a run folder's scratch can pass the 108-byte socket limit
    run = run_in_sandbox(f'python3 -c "{CONNECT}; print(s.recv(100).decode())" {greeter}', tmp_path, fake_ca,
                         greeter, scratch=deep)  # fmt: skip
    assert (run.exit_code, run.stdout_tail) == (0, "proxy:hi\n"), run.stderr_tail


def test_workspace_is_mounted_at_app_and_the_host_app_is_untouched(tmp_path: Path, fake_ca: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "given.txt").write_text("from the task\n")
    script = 'pwd; cat given.txt; echo made > /app/made.txt; cat "$HOME/.probe/config.json"; echo; '
    script += 'ls /proc | grep -c "^[0-9]"'
    run = run_in_sandbox(script, tmp_path, fake_ca)
    assert run.exit_code == 0, run.stderr_tail
    cwd, given, config, procs = run.stdout_tail.splitlines()
    assert (cwd, given) == ("/app", "from the task")
    assert (tmp_path / "work" / "made.txt").read_text() == "made\n"
    assert '"/app"' in config  # harness configs see the workspace where the harness does
    assert int(procs) < 10  # a fresh /proc: the sandbox's own processes, not the host's
    assert not Path("/app/made.txt").exists()


def test_extra_mounts_and_reserved_paths(tmp_path: Path) -> None:
    tests_dir = tmp_path / "tests"
    tests_dir.mkdir()
    (tests_dir / "check.sh").write_text("echo checked\n")
    work = tmp_path / "work"
    work.mkdir()
    mounts = [Mount("/tests", tests_dir)]
    with sandboxed(SandboxConfig(), ["bash", "/tests/check.sh"], work, tmp_path / "s", mounts=mounts) as prepared:
        done = subprocess.run(prepared.argv, cwd=prepared.cwd, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, "checked\n"), done.stderr
    for bad in ("/tmp", "/usr", "/app/sub", "relative"):
        with pytest.raises(ValueError, match="top-level path"):
            Mount(bad, tests_dir)


def test_memory_limit_stops_a_hog(tmp_path: Path, fake_ca: Path) -> None:
    hog = "python3 -c 'import time\nx=[]\nwhile True: x.append(bytearray(20_000_000)); time.sleep(0.01)'"
    run = run_in_sandbox(hog, tmp_path, fake_ca, memory_mb=300)
    assert (run.limit, run.timed_out, run.exit_code) == ("memory", True, None)
    assert run.duration < 30  # generous: the machine may be shared
    assert "killed at the memory limit" in run.stderr_tail


def test_cpu_limit_stops_a_busy_loop(tmp_path: Path, fake_ca: Path) -> None:
    run = run_in_sandbox("while :; do :; done", tmp_path, fake_ca, cpu_seconds=1.0)
    assert (run.limit, run.timed_out, run.exit_code) == ("cpu", True, None)
    assert 1.0 <= run.duration < 40  # wall time to burn 1 CPU s grows with the load
    assert "killed at the cpu limit" in run.stderr_tail


def test_timeout_kills_everything_in_the_sandbox_even_a_new_session(tmp_path: Path, fake_ca: Path) -> None:
    token = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"
    # setsid leaves the process group: only the pid namespace catches it
    run = run_in_sandbox(f"setsid sleep {token} & sleep {token}", tmp_path, fake_ca, timeout=1.0)
    assert (run.limit, run.timed_out, run.exit_code) == ("time", True, None)
    deadline = time.monotonic() + 10
    while (left := sleepers(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the sandbox: {left}"


def sleepers(token: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"sleep\0{token}".encode() in (proc / "cmdline").read_bytes() and alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_an_unavailable_sandbox_says_to_pass_sandbox_none(monkeypatch: pytest.MonkeyPatch) -> None:
    check_available()  # works on this machine
    monkeypatch.setattr(sandbox, "UNSHARE", ("unshare", "--no-such-namespace-flag"))
    with pytest.raises(SandboxError, match="pass --sandbox none"):
        check_available()


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="'namespaces' or 'none'"):
        SandboxConfig(mode="docker")  # type: ignore[arg-type]  # the point of the test
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="top-level path"):
        SandboxConfig(workdir="/tmp")


def test_watchdog_counts_the_whole_tree(tmp_path: Path) -> None:
    script = "python3 -c 'x=bytearray(150_000_000); import time; time.sleep(30)' & wait"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while tree_usage(proc.pid).rss_mb < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_usage(proc.pid).rss_mb >= 150  # the child's memory counts against the bash at the top
        exceeded = Watchdog(proc.pid, 100, 1000).exceeded()
        assert exceeded is not None and exceeded[0] == "memory" and "limit 100 MB" in exceeded[1]
        assert Watchdog(proc.pid, 1000, 1000).exceeded() is None
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_unix_to_tcp_relays_both_ways_and_passes_the_half_close(tmp_path: Path, greeter: int) -> None:
    path = tmp_path / "relay.sock"
    with UnixToTcp(path, "127.0.0.1", greeter):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(b"ping")
            assert s.recv(100) == b"proxy:ping"
            assert s.recv(100) == b""  # the server closed: the relay passed the EOF on
    assert not path.exists()

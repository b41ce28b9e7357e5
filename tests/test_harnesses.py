"""tasks/harnesses end to end: every registered harness, installed pinned from its registry and run unmodified
through mitmdump with the capture addon and the real engine, on a one-line task.

Each run must end by itself within its time limit, and its model calls must land in its own session (the proxy
user) with the wire format the harness speaks. Most harnesses' first prompt overflows the default model's 8192-token
context; the proxy then answers the vendor's context-length error, the harness gives up, and the refused call is
still recorded (error ``context_length``, prompt ids kept). Harnesses whose prompt fits must have at least one
sampled answer recorded. Install and run times, exit codes and call counts are printed (``-s``) and kept as the
test's user properties.

Every harness runs in the default namespaces sandbox (network: only the proxy; workspace at /app). The runner
itself (clean environment, private HOME/TMPDIR, CA bundle, process-group kill on timeout) is checked with ``bash``
standing in for the executable and no sandbox, so those checks need no harness install; tests/test_sandbox.py
checks the sandbox.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from addon.records import read_records
from tasks.harnesses import HARNESSES, HarnessSpec, install, run_executable, run_harness
from tasks.harnesses.aider import Aider
from tasks.harnesses.base import SYSTEM_CA_BUNDLE
from tasks.sandbox import SandboxConfig
from tests.conftest import Proxy, start_proxy, stop_process, wait_until

pytestmark = pytest.mark.integration

INSTRUCTION = "Create a file hello.txt containing hello"
MAX_CALLS = 3
# Harnesses whose first prompt fits the default model's context, so at least one call is sampled.
FITS_CONTEXT = frozenset({"pi", "mini-swe-agent", "opencode", "aider"})


@pytest.fixture(scope="module")
def proxy_for(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Callable[[HarnessSpec], Proxy]]:
    """One proxy per distinct set of harness proxy options, started on first use; sessions keep harnesses apart."""
    started: dict[tuple[str, ...], tuple[subprocess.Popen, Proxy]] = {}

    def get(spec: HarnessSpec) -> Proxy:
        if spec.proxy_options not in started:
            extra = [arg for opt in spec.proxy_options for arg in ("--set", opt)]
            tmp = tmp_path_factory.mktemp("harness-proxy")
            started[spec.proxy_options] = start_proxy(
                tmp, engine_url, "--set", f"harnessrl_max_calls={MAX_CALLS}", *extra
            )
        return started[spec.proxy_options][1]

    try:
        yield get
    finally:
        for proc, _ in started.values():
            stop_process(proc)


def session_rows(proxy: Proxy, session: str) -> list[dict]:
    proxy.admin("POST", f"sessions/{session}/close")
    rows = [r for r in read_records(proxy.records).to_pylist() if r["session_id"] == session]
    return sorted(rows, key=lambda r: r["call_index"])


@pytest.mark.parametrize("name", list(HARNESSES))
def test_harness_runs_through_the_proxy_into_its_own_session(
    name: str, proxy_for: Callable[[HarnessSpec], Proxy], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    spec = HARNESSES[name]
    installed = install(spec)
    again = install(spec)
    assert again.cached and again.executable == installed.executable and installed.executable.exists()
    proxy = proxy_for(spec)
    session = f"{name}-{uuid.uuid4().hex[:8]}"
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = run_harness(spec, INSTRUCTION, workdir, proxy.url(session), proxy.ca, scratch=tmp_path / "scratch")
    rows = session_rows(proxy, session)
    figures: dict[str, object] = {"install_s": round(installed.seconds, 1), "cached": installed.cached}
    figures["run_s"] = round(run.duration, 1)
    figures |= {"exit_code": run.exit_code, "calls": len(rows), "version": run.version}
    request.node.user_properties.extend(figures.items())
    print(f"{name}: {figures}")
    output = f"stdout:\n{run.stdout_tail}\nstderr:\n{run.stderr_tail}\nproxy log: {proxy.log}"
    assert not run.timed_out and run.exit_code is not None, f"{name} ran past {spec.timeout_s}s\n{output}"
    assert rows, f"no call of {name} was recorded in session {session}\n{output}"
    assert {r["wire_format"] for r in rows} == {spec.wire_format}
    for row in rows:
        check_row(row)
    sampled = [r for r in rows if r["error"] is None and r["budget_stop"] is None]
    if name in FITS_CONTEXT:
        assert sampled, f"{name}'s prompt fits the context but no call was sampled\n{output}"
    if name == "aider":  # its model settings file took effect: answers capped, sampled rather than greedy
        requested = json.loads(rows[0]["sampling_requested"])
        assert (requested["max_tokens"], requested["temperature"]) == (Aider.max_tokens, None)
    else:
        refused = [r for r in rows if (r["error"] or "").startswith("context_length")]
        assert sampled or refused, f"{name}: neither a sampled nor a context-length call recorded\n{output}"


def check_row(row: Mapping) -> None:
    """A recorded call is sampled (ids and logprobs aligned), cut short because the harness hung up mid-stream (a
    side call still streaming when the CLI exits: what was sampled is kept), refused for length (prompt kept) or a
    budget stop."""
    if row["budget_stop"] is not None:
        assert row["budget_stop"] == f"max_calls={MAX_CALLS}" and row["call_index"] >= MAX_CALLS
    elif row["error"] is None:
        assert row["prompt_ids"] and row["completion_ids"]
        assert len(row["completion_ids"]) == len(row["completion_logprobs"])
    elif row["error"] == "client_disconnected":
        assert row["incomplete"] and row["prompt_ids"]
        assert len(row["completion_ids"]) == len(row["completion_logprobs"])
    else:
        assert row["error"].startswith("context_length:"), row["error"]
        assert len(row["prompt_ids"]) >= 8192 - 1


def test_registry_pins_every_harness_once() -> None:
    assert {"claude-code", "codex", "gemini-cli", "pi", "mini-swe-agent"} <= set(HARNESSES)
    pins = [spec.pin for spec in HARNESSES.values()]
    assert len(set(pins)) == len(pins)
    for spec in HARNESSES.values():
        sep = "@" if spec.installer == "npm" else "=="
        assert spec.pin == f"{spec.package}{sep}{spec.version}"
        assert spec.version[0].isdigit() and spec.timeout_s > 0


# --------------------------------------------------------------------------------------------- the runner itself


@dataclass(frozen=True)
class BashProbe(HarnessSpec):
    """``bash -c INSTRUCTION`` with the runner's environment: lets the runner be checked without a harness."""

    name = "bash-probe"
    package = "bash"
    version = "0"
    installer = "npm"
    executable = "bash"
    wire_format = "chat"
    ca_vars = ("SSL_CERT_FILE", "NODE_EXTRA_CA_CERTS")
    timeout_s = 30.0

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".probe/config.json": json.dumps({"workdir": str(workdir)})}

    def env(self) -> Mapping[str, str]:
        return {"PROBE_KEY": "dummy"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-c", instruction]


NONE = SandboxConfig(mode="none")


@pytest.fixture
def fake_ca(tmp_path: Path) -> Path:
    ca = tmp_path / "mitmproxy-ca-cert.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nTESTCA\n-----END CERTIFICATE-----\n")
    return ca


def test_runner_gives_a_private_home_clean_env_and_a_full_ca_bundle(
    tmp_path: Path, fake_ca: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "must-not-leak")
    script = 'pwd; echo "$HOME|$TMPDIR|$HTTPS_PROXY|$PROBE_KEY|${ANTHROPIC_API_KEY:-unset}"'
    script += '; grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE"; tail -n 2 "$SSL_CERT_FILE" | head -n 1'
    script += '; cat "$HOME/.probe/config.json"; echo; test "$SSL_CERT_FILE" = "$NODE_EXTRA_CA_CERTS"'
    workdir, scratch = tmp_path / "work", tmp_path / "scratch"
    workdir.mkdir()
    url = "http://sess-1:token@127.0.0.1:1"
    run = run_executable(BashProbe(), Path("/bin/bash"), script, workdir, url, fake_ca, scratch=scratch, sandbox=NONE)
    assert (run.exit_code, run.timed_out, run.harness) == (0, False, "bash-probe")
    cwd, env, certs, last, config = run.stdout_tail.splitlines()
    assert cwd == str(workdir)
    assert env == f"{scratch / 'home'}|{scratch / 'tmp'}|{url}|dummy|unset"
    assert last == "TESTCA"  # the mitmproxy CA is appended after the system roots
    assert int(certs) > (10 if SYSTEM_CA_BUNDLE.exists() else 0)
    assert json.loads(config) == {"workdir": str(workdir)}


def test_runner_kills_the_whole_process_group_on_timeout(tmp_path: Path, fake_ca: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    url = "http://s:t@127.0.0.1:1"
    run = run_executable(BashProbe(), Path("/bin/bash"), script, tmp_path, url, fake_ca, 1.0, sandbox=NONE)
    assert run.timed_out and run.exit_code is None and run.duration < 15 and run.limit == "time"
    child = int(pidfile.read_text())
    wait_until(lambda: not alive(child), 10, "the harness's child to die with its process group")


def alive(pid: int) -> bool:
    """True when ``pid`` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

"""tasks/harnesses end to end: every registered harness, installed pinned from its registry and run unmodified
through mitmdump with the capture addon and the real engine, on a one-line task.

The engine serves a context every harness's first prompt fits in (32k tokens on the CPU default, see
docs/engine.md), so every harness must really be answered: each run ends by itself within its time limit (exit 0,
or the end a harness makes after the proxy's call budget), at least one of its calls is sampled and complete, every
model call it made is recorded complete in its own session (the proxy user) with the wire format the harness
speaks, and the proxy answered none of its requests with a 4xx/5xx except those it provokes on purpose (Codex's
WebSocket upgrade: 426, so it falls back to HTTPS; a vendor 404 for a read of a non-model path).

Each harness gets its own proxy (so its mitmdump log is its own) and the runs go in two lanes (``LANES``): every
harness with a large first prompt in one lane, one after another, so no two cold prefills ever share an engine step,
and the small ones in the other, which finishes early.
``MAX_CALLS`` caps every episode. Install and run times, exit codes and call counts are printed (``-s``) and kept
as the test's user properties.

Every harness runs in the default namespaces sandbox (network: only the proxy; workspace at /app). The runner
itself (clean environment, private HOME/TMPDIR, CA bundle, process-group kill on timeout) is checked with ``bash``
standing in for the executable and no sandbox, so those checks need no harness install; tests/test_sandbox.py
checks the sandbox.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from addon import launch
from addon.records.schema import from_row, read_records
from tasks.harnesses import HARNESSES, HarnessRun, HarnessSpec, install, run_executable, run_harness
from tasks.harnesses.aider import Aider
from tasks.harnesses.base import SYSTEM_CA_BUNDLE
from tasks.sandbox import SandboxConfig
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

INSTRUCTION = "Create a file hello.txt containing hello"
MAX_CALLS = 3
# Every answer is cut at this many tokens by the proxy: decoding at a 12-19k-token context runs at ~5 tokens/s on 2
# CPU cores, and what is tested is the plumbing, not what a 135M model writes.
MAX_TOKENS = 64
# Two lanes run at once, each one harness after another. The CPU engine has no chunked prefill: prompts that arrive
# together are prefilled in one step, so two cold 8-19k-token prompts take as long as both and neither sees a first
# token until both are done (Codex got none in 590 s beside OpenCode's on a loaded 2-core CI machine; Gemini CLI's
# HTTP client gives up on a request with no answer headers after 300 s). So every harness with a large first prompt
# (tokens of the largest, measured) is in the first lane, and only the small ones (1-2k tokens, seconds of
# prefill) share the engine with them.
LANES = (
    # qwen-code 18.9k, codex 17.5k, claude-code 12.9k, kilo 12.6k, hermes 12.4k, gemini-cli 11.2k, opencode 7.6k
    ("codex", "qwen-code", "claude-code", "kilo", "hermes", "gemini-cli", "opencode"),
    # pi 1.5k, mini-swe-agent 1.5k, aider 0.7k
    ("pi", "mini-swe-agent", "aider"),
)
VENDOR_HOSTS = ("api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com")
# "127.0.0.1:52636: POST https://api.openai.com/v1/responses" then "   << 426 Upgrade Required 0b"; an HTTP/2
# request line ends in " HTTP/2.0", and its answer's version is written when it differs ("<< HTTP/1.1 200 OK")
FLOW_LINE = re.compile(r"^\S+: (?P<method>[A-Z]+) (?P<url>\S+).*\n\s+<< (?:HTTP/\S+ )?(?P<status>\d{3})", re.M)


@dataclass(frozen=True)
class Episode:
    """One harness's run, its session's records and the proxy's answers to it (method, URL, status)."""

    run: HarnessRun
    rows: list[dict]
    answers: list[tuple[str, str, int]]
    proxy_log: Path
    install_s: float
    cached: bool


def provoked(method: str, url: str, status: int) -> bool:
    """An error status the proxy answers on purpose (see the module docstring)."""
    path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    if status == 426:
        return method == "GET" and path == "v1/responses"  # Codex's WebSocket upgrade -> its HTTPS fallback
    return status == 404 and method in ("GET", "HEAD") and "generateContent" not in path


def run_episode(spec: HarnessSpec, engine_url: str, tmp: Path) -> Episode:
    installed = install(spec)
    options = (f"harnessrl_max_calls={MAX_CALLS}", f"harnessrl_max_tokens_cap={MAX_TOKENS}", *spec.proxy_options)
    proxy = launch.start(launch.ProxyConfig(engine_url, tmp / "proxy", options=options))
    try:
        session = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        workdir = tmp / "work"
        workdir.mkdir()
        run = run_harness(spec, INSTRUCTION, workdir, proxy.url(session), proxy.ca, scratch=tmp / "scratch")
        proxy.admin("POST", f"sessions/{session}/close")
        rows = [r for r in read_records(proxy.records).to_pylist() if r["session_id"] == session]
    finally:
        proxy.stop()
    answers = [
        (m["method"], m["url"], int(m["status"]))
        for m in FLOW_LINE.finditer(proxy.log.read_text(errors="replace"))
        # model calls show as retargeted to the addon's internal server; the rest on the vendor host
        if "/_harnessrl/call" in m["url"] or any(f"://{host}" in m["url"] for host in VENDOR_HOSTS)
    ]
    rows.sort(key=lambda r: r["call_index"])
    return Episode(run, rows, answers, proxy.log, installed.seconds, installed.cached)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory: pytest.TempPathFactory, engine_url: str) -> Iterator[Mapping[str, Future[Episode]]]:
    """Every harness's episode, run in ``LANES`` (see there); a harness in no lane joins the shorter one."""
    lanes = [list(lane) for lane in LANES]
    for name in HARNESSES:
        if not any(name in lane for lane in lanes):
            min(lanes, key=len).append(name)
    futures: dict[str, Future[Episode]] = {name: Future() for lane in lanes for name in lane if name in HARNESSES}
    # made here, not in the lanes: pytest's temp factory is not thread-safe (two threads creating its base folder
    # at once delete each other's)
    tmp = {name: tmp_path_factory.mktemp(f"h-{name}") for name in futures}

    def run_lane(lane: list[str]) -> None:
        for name in (n for n in lane if n in HARNESSES):
            try:
                futures[name].set_result(run_episode(HARNESSES[name], engine_url, tmp[name]))
            except BaseException as e:  # the test of this harness reports it; the lane goes on
                futures[name].set_exception(e)

    with ThreadPoolExecutor(len(lanes), thread_name_prefix="harness-lane") as pool:
        for lane in lanes:
            pool.submit(run_lane, lane)
        yield futures


@pytest.mark.parametrize("name", list(HARNESSES))
def test_harness_runs_through_the_proxy_into_its_own_session(
    name: str, episodes: Mapping[str, Future[Episode]], request: pytest.FixtureRequest
) -> None:
    spec = HARNESSES[name]
    ep = episodes[name].result()
    again = install(spec)
    assert again.cached and again.executable.exists()
    run, rows = ep.run, ep.rows
    figures: dict[str, object] = {"install_s": round(ep.install_s, 1), "cached": ep.cached}
    figures["run_s"] = round(run.duration, 1)
    figures |= {"exit_code": run.exit_code, "calls": len(rows), "version": run.version}
    figures["prompt_tokens"] = [len(r["prompt_ids"]) for r in rows]
    figures["completion_tokens"] = [len(r["completion_ids"]) for r in rows]
    figures["answers"] = dict(Counter(status for _, _, status in ep.answers))  # the proxy's, by HTTP status
    request.node.user_properties.extend(figures.items())
    print(f"{name}: {figures}")
    output = f"stdout:\n{run.stdout_tail}\nstderr:\n{run.stderr_tail}\nproxy log: {ep.proxy_log}"
    assert not run.timed_out and run.exit_code is not None, f"{name} ran past {spec.timeout_s}s\n{output}"
    budget_stops = [r for r in rows if r["budget_stop"] is not None]
    # the harness's normal end: exit 0, or its own error exit after the proxy's budget-stop answer, or after an empty
    # answer (the 135M model sampled end-of-text first: Kilo exits 1, "the model returned no output")
    empty = [r for r in rows if r["error"] is None and r["budget_stop"] is None and len(r["completion_ids"]) <= 1]
    assert run.exit_code == 0 or budget_stops or empty, (
        f"{name} exited {run.exit_code} without a budget stop or an empty answer\n{output}"
    )
    assert rows, f"no call of {name} was recorded in its session\n{output}"
    assert {r["wire_format"] for r in rows} == {spec.wire_format}
    for row in rows:
        check_row(row, output)
    check_turns(rows, output)
    refused = [a for a in ep.answers if a[2] >= 400 and not provoked(*a)]
    assert not refused, f"{name}: the proxy answered errors it should not have: {refused}\n{output}"
    if name == "aider":  # its model settings file took effect: answers capped, sampled rather than greedy
        requested = json.loads(rows[0]["sampling_requested"])
        assert (requested["max_tokens"], requested["temperature"]) == (Aider.max_tokens, None)


def check_row(row: Mapping, output: str) -> None:
    """A recorded call is sampled (ids and logprobs aligned), a budget stop, or cut short by the client."""
    assert len(row["completion_ids"]) == len(row["completion_logprobs"]), f"call {row['call_index']}\n{output}"
    if row["budget_stop"] is not None:
        assert row["budget_stop"] == f"max_calls={MAX_CALLS}" and row["call_index"] >= MAX_CALLS
    elif sampled(row):  # a malformed tool call is the small model's output, sent on as text: a sampled call
        assert row["prompt_ids"] and row["completion_ids"] and not row["incomplete"] and row["finish_reason"]
    else:
        assert row["error"] == "client_disconnected" and row["incomplete"], f"call {row['call_index']}: " + (
            f"{row['error']}\n{output}"
        )


def sampled(row: Mapping) -> bool:
    """``CallRecord.sampled`` of a row read back as a dict."""
    return from_row(row).sampled


def check_turns(rows: list[dict], output: str) -> None:
    """Every model turn (the calls with one prompt: a harness retries a turn with the same prompt) has a complete
    call, except a call the harness hung up on as it ended (e.g. a title request still streaming when the answer
    was done), which ended no earlier than the session's last complete call. A retry after the client gave up on
    a slow call (its own timeout) fails here: that is a turn with no complete call that ended earlier."""
    calls = [r for r in rows if r["budget_stop"] is None]
    complete = [r for r in calls if sampled(r)]
    assert complete, f"no call was sampled to its end\n{output}"
    last_done = max(r["done_at"] for r in complete)
    turns: dict[tuple[int, ...], list[dict]] = {}
    for r in calls:
        turns.setdefault(tuple(r["prompt_ids"]), []).append(r)
    for turn in turns.values():
        if not any(sampled(r) for r in turn):
            cut = [(r["call_index"], r["done_at"].isoformat()) for r in turn if r["done_at"] < last_done]
            assert not cut, f"calls {cut} were abandoned before the last complete call ended ({last_done})\n{output}"


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


@dataclass(frozen=True)
class BaseUrlProbe(BashProbe):
    """The probe, with a base-URL variable of its own."""

    def base_url_env(self, base_url: str) -> Mapping[str, str]:
        return {"PROBE_BASE": f"{base_url}/v1"}


def test_runner_on_the_base_url_route_sets_the_harness_variables_and_no_proxy(tmp_path: Path, fake_ca: Path) -> None:
    script = 'echo "${HTTPS_PROXY:-unset}|${https_proxy:-unset}|$PROBE_BASE|$PROBE_KEY"'
    proxy, base = "http://s:t@127.0.0.1:1", "http://127.0.0.1:2/s/sess-1"
    run = run_executable(BaseUrlProbe(), Path("/bin/bash"), script, tmp_path, proxy, fake_ca, sandbox=NONE,
                         base_url=base)  # fmt: skip
    assert run.exit_code == 0 and run.stdout_tail.strip() == f"unset|unset|{base}/v1|dummy"
    with pytest.raises(ValueError, match="bash-probe takes no base URL.*HTTPS_PROXY"):
        run_executable(BashProbe(), Path("/bin/bash"), "true", tmp_path, proxy, fake_ca, sandbox=NONE, base_url=base)


def test_only_harnesses_run_end_to_end_on_the_base_url_route_declare_one() -> None:
    takes = {name for name, spec in HARNESSES.items() if spec.base_url_env("http://h:1/s/x") is not None}
    assert takes == {"mini-swe-agent", "aider"}


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

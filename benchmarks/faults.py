"""Faults under load: crash a proxy, crash the engine, fill the disk, make the engine fail, slow down or hang —
while seeded sessions run — then check what the clients saw against the shards.

Contract
--------
Each scenario runs ``sessions`` session slots for ``seconds`` against a fake engine through ``proxies`` mitmdump
processes (default two; session ``i`` on proxy ``i % n``), injects its fault once at ``at_s``, repairs it
(restart, free the disk) and returns a :class:`FaultResult`:

* ``verdict`` — every call a client saw complete is in exactly one shard row of its session; no shard unreadable;
* ``vendor_shaped`` / ``not_vendor_shaped`` — failed calls that got an answer: the answer is the format's own error
  (an HTTP error body in the vendor's shape, or the format's in-stream error event), or not; ``no_answer`` counts
  calls whose connection died with a killed process (nothing can answer those);
* ``outside_window`` — failed calls that started well before or after the fault (other sessions unaffected: 0).

Scenarios: ``proxy_kill9`` (kill -9 one mitmdump, restart it on the same port and folder: its WAL is recovered),
``engine_kill9`` (kill -9 the engine while calls stream, start a new one), ``engine_errors`` (HTTP 500s),
``engine_drop`` (the engine stream cut after 3 tokens), ``latency_spike`` (2 s before the first token),
``engine_hang`` (no answer; clients time out), ``disk_full`` (a tmpfs on one proxy's records folder, filled to ENOSPC
for 3 s, then freed; it runs in an unprivileged ``unshare --user --map-root-user --mount`` namespace, so it needs no
root).

CLI (long form): ``python benchmarks/faults.py --model-dir D [--sessions 32] [--seconds 20]`` writes
``benchmarks/results/faults.md``. The short form is ``tests/test_faults.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.launch import ProxyHandle  # noqa: E402
from benchmarks import fake_engine, tree  # noqa: E402
from benchmarks.fake_engine import FakeEngineProcess, Faults  # noqa: E402
from benchmarks.replayer import CallLog, Proxied, ReplayLog, Verdict, replay, verify  # noqa: E402
from benchmarks.sessions import FORMATS, SessionScript, make_script  # noqa: E402

SCENARIOS = (
    "proxy_kill9",
    "engine_kill9",
    "engine_errors",
    "engine_drop",
    "latency_spike",
    "engine_hang",
    "disk_full",
)


@dataclass(frozen=True)
class FaultResult:
    scenario: str
    calls: int
    complete: int
    failed: int
    vendor_shaped: int
    not_vendor_shaped: int
    no_answer: int
    outside_window: int
    verdict: Verdict
    examples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        # only a killed proxy (its clients' connections die with it) and a hung engine (the clients time out) leave
        # calls with no answer at all; everywhere else the proxy is alive and must answer in the vendor's shape
        answered = self.no_answer == 0 or self.scenario in ("proxy_kill9", "engine_hang")
        return self.verdict.ok and self.not_vendor_shaped == 0 and self.outside_window == 0 and answered

    @classmethod
    def from_json(cls, d: dict) -> FaultResult:
        v = d["verdict"] | {"examples": tuple(d["verdict"]["examples"])}
        fields = {k: w for k, w in d.items() if k != "ok"}
        return cls(**(fields | {"verdict": Verdict(**v), "examples": tuple(d["examples"])}))


def vendor_shaped(format: str, error: str) -> bool:
    """Is ``error`` (an HTTP error body, or an in-stream error event's JSON) the format's own error shape?"""
    try:
        obj = json.loads(error)
    except ValueError:
        return False
    if not isinstance(obj, dict):
        return False
    if format == "anthropic":
        err = obj.get("error")
        return obj.get("type") == "error" and isinstance(err, dict) and "message" in err and "type" in err
    if format == "responses" and obj.get("type") in ("response.failed", "error"):
        return True  # the in-stream failure event
    err = obj.get("error", obj)
    return isinstance(err, dict) and isinstance(err.get("message"), str)


@dataclass
class _World:
    model_dir: str
    work: Path
    engine: FakeEngineProcess
    proxies: list[ProxyHandle]
    port: int
    token_rate: float
    fault_at: float = 0.0
    repaired_at: float = 0.0
    notes: list[str] = field(default_factory=list)


def _inject(world: _World, scenario: str) -> None:
    """Apply ``scenario``'s fault and repair it (blocking; runs in a thread while the load goes on)."""
    if scenario == "engine_kill9":
        _until_streaming(world.engine)
    world.fault_at = time.time()
    if scenario == "proxy_kill9":
        victim = world.proxies[0]
        tree.kill9(victim)
        time.sleep(1.0)
        world.proxies[0] = tree.restart(victim, world.engine.url, world.model_dir)
    elif scenario == "engine_kill9":
        world.engine.kill()
        time.sleep(2.0)
        world.engine = fake_engine.spawn(world.model_dir, world.port, token_rate=world.token_rate)
    elif scenario == "engine_errors":
        world.engine.faults(Faults(status=500, calls=6))
    elif scenario == "engine_drop":
        world.engine.faults(Faults(drop_after=3, calls=4))
    elif scenario == "latency_spike":
        world.engine.faults(Faults(delay_s=2.0, calls=8))
    elif scenario == "engine_hang":
        world.engine.faults(Faults(hang=True, calls=2))
        time.sleep(8.0)
    elif scenario == "disk_full":
        filler = world.proxies[0].records / "filler"
        _fill(filler)
        time.sleep(3.0)
        filler.unlink()
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    world.repaired_at = time.time()


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until the file system is full (ENOSPC)."""
    block = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def run_scenario(
    scenario: str,
    model_dir: str | Path,
    work: Path,
    *,
    sessions: int = 8,
    seconds: float = 10.0,
    at_s: float = 3.0,
    token_rate: float = 100.0,
    seed: int = 11,
    proxies: int = 2,
    in_namespace: bool = False,
) -> FaultResult:
    if scenario == "disk_full" and not in_namespace:
        return _in_namespace(model_dir, work, sessions, seconds)
    if scenario == "disk_full":
        # a small tmpfs on the first proxy's records folder only (the log and the CA stay on the real disk)
        records = work / "proxy-0" / "records"
        records.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "harnessrl-full", str(records)], check=True)
    port = launch.free_port()
    engine = fake_engine.spawn(model_dir, port, token_rate=token_rate)
    world = _World(str(model_dir), work, engine, [], port, token_rate)
    try:
        world.proxies = tree.start_proxies(engine.url, proxies, work, model_dir)

        def make(i: int) -> SessionScript:
            return make_script(seed, i, FORMATS[i % 4], scale=0.2)

        log = asyncio.run(_under_load(world, scenario, sessions, seconds, at_s, make))
    finally:
        for h in world.proxies:
            h.stop()
        world.engine.stop()
    return _judge(scenario, log, world)


async def _under_load(
    world: _World, scenario: str, sessions: int, seconds: float, at_s: float, make: Callable[[int], SessionScript]
) -> ReplayLog:
    # The target holds the handles of the first start; a restarted proxy keeps the port, CA and records folder,
    # so clients reconnect to it through the same HTTPS_PROXY, exactly as a harness would.
    target = Proxied(tuple(world.proxies))
    timeout = 6.0 if scenario == "engine_hang" else 120.0

    async def injector() -> None:
        await asyncio.sleep(at_s)
        await asyncio.to_thread(_inject, world, scenario)

    log, _ = await asyncio.gather(
        replay(target, concurrency=sessions, make=make, duration_s=seconds, retries=20, timeout=timeout), injector()
    )
    return log


def _until_streaming(engine: FakeEngineProcess, timeout_s: float = 30.0) -> None:
    """Wait until the engine has a call in flight: the kill must cut streams, not just refuse new calls.

    A call that reaches a dead engine waits for it to come back (one engine: busy, not gone) and completes, so a
    kill that lands before the first call reaches the engine (a slow machine's first calls) would show nothing."""
    deadline = time.monotonic() + timeout_s
    while engine.stats()["active"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)


def _judge(scenario: str, log: ReplayLog, world: _World) -> FaultResult:
    failed = [c for c in log.calls if not c.complete]
    # no answer: the connection failed or the stream was cut (an httpx transport error, not an error body or event)
    no_answer = [c for c in failed if c.status in (0, 200) and not (c.error or "").startswith("{")]
    shaped = [c for c in failed if c not in no_answer and c.error and vendor_shaped(c.format, c.error)]
    unshaped = [c for c in failed if c not in no_answer and c not in shaped]
    lo, hi = world.fault_at - 15.0, world.repaired_at + 10.0
    outside = [c for c in failed if not lo <= c.started <= hi]
    return FaultResult(
        scenario=scenario,
        calls=len(log.calls),
        complete=len(log.completed()),
        failed=len(failed),
        vendor_shaped=len(shaped),
        not_vendor_shaped=len(unshaped),
        no_answer=len(no_answer),
        outside_window=len(outside),
        verdict=verify(log, [h.records for h in world.proxies]),
        examples=tuple(_example(c) for c in (unshaped + outside + shaped + no_answer)[:4]),
    )


def _in_namespace(model_dir: str | Path, work: Path, sessions: int, seconds: float) -> FaultResult:
    """Run the disk_full scenario in an unprivileged user + mount namespace, where it can mount a small tmpfs."""
    cmd = ["unshare", "--user", "--map-root-user", "--mount", sys.executable, str(Path(__file__))]
    cmd += ["--model-dir", str(model_dir), "--sessions", str(sessions), "--seconds", str(seconds)]
    cmd += ["--scenarios", "disk_full", "--in-namespace", "--work", str(work), "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 300)
    if out.returncode not in (0, 1) or not out.stdout.strip():
        raise RuntimeError(f"disk_full in a namespace failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return FaultResult.from_json(json.loads(out.stdout.strip().splitlines()[-1]))


def _example(c: CallLog) -> str:
    return f"{c.format} status={c.status} error={(c.error or '')[:160]!r}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)  # disk_full's re-exec
    ap.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON line per scenario, nothing else")
    args = ap.parse_args(argv)
    results = []
    for name in args.scenarios:
        with tempfile.TemporaryDirectory(prefix=f"harnessrl-fault-{name}-") as tmp:
            work = args.work or Path(tmp)
            r = run_scenario(
                name, args.model_dir, work, sessions=args.sessions, seconds=args.seconds, in_namespace=args.in_namespace
            )
        results.append(r)
        print(json.dumps(asdict(r) | {"ok": r.ok}, default=str), flush=True)
    if args.json:
        return 0 if all(r.ok for r in results) else 1
    lines = [
        "# Faults under load",
        "",
        f"Machine: {tree.machine_facts().markdown()}. Commit {tree.git_rev()}. Load {tree.loadavg()}.",
        "",
        "Command: `python benchmarks/faults.py " + " ".join(sys.argv[1:] if argv is None else argv) + "`",
        "",
        "| scenario | calls | complete | failed | vendor-shaped | not vendor-shaped | no answer (process killed) "
        "| failed outside the fault window | lost | duplicated | misattributed | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r.verdict
        lines.append(
            f"| {r.scenario} | {r.calls} | {r.complete} | {r.failed} | {r.vendor_shaped} | {r.not_vendor_shaped} | "
            f"{r.no_answer} | {r.outside_window} | {v.lost} | {v.duplicated} | {v.misattributed} | "
            f"{'yes' if r.ok else 'NO'} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

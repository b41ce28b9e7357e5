"""The collection loop: run tasks x harnesses x G rollouts through the capture proxy, verify, reward, summarise.

Contract
--------
:class:`CollectConfig` is everything a run needs; ``__post_init__`` validates it with actionable errors
(:class:`CollectConfigError`). It, :func:`load_tasks` and :func:`plan` live in :mod:`tasks.collect_plan` and are
importable from here too. :func:`collect` then

1. resolves the tasks (a task folder, a folder of tasks, or a built-in subset name) and installs each harness;
2. reuses the engine at ``engine_url`` (it must be healthy), or one recorded healthy in ``engine_run_dir``, or
   starts one through the engine env's Python (``trainer.engine serve``) and stops it at the end. ``engine_url`` may
   name several engines, comma-separated (replicas of one model): each must answer ``/health`` and all must serve
   one model (:func:`~addon.engine.pool.check_engines`); the proxies get the whole list and keep each session on
   one engine (:mod:`addon.engine.pool`);
3. starts one capture proxy per distinct set of harness proxy options (``HarnessSpec.proxy_options``), each with
   ``harnessrl_max_calls=<max_calls>`` and ``harnessrl_run_id=<run_id>``, and stops them at the end;
4. runs every rollout in a thread pool of ``concurrency`` workers. A rollout has the session id
   ``<run>-<task>-<harness>-<g>``, a fresh copy of the task's workspace, and the harness run with that session in
   its proxy credentials (the harness runner gives it a private HOME/TMPDIR). Then the session is closed (its
   records flushed), the verifier runs, the session's call records give :class:`~tasks.episodes.CallStats`, and
   the :class:`~tasks.rewards.Rewarder` gives the reward. Group id: ``<task>/<harness>``; task group: ``<task>``.
   Harness and verifier run in ``sandbox`` (:mod:`tasks.sandbox`; default namespaces: network only to the proxy,
   workspace at ``/app``, memory and CPU limits); checked before anything starts;
5. shows a progress line on stderr, rewrites ``episodes.parquet`` after each episode (tmp + rename), and at the
   end writes ``summary.csv``, ``summary.md``, ``pass_at_1.png``, ``tool_calls.png`` and prints the summary.

Everything started is stopped in ``finally`` (errors, Ctrl-C). Ctrl-C or SIGTERM also stops the rollouts: queued
ones never start, running ones start no next process, and their harness and verifier groups are signalled until
they return (:func:`stop_rollouts`); only episodes that ended before the stop are written. A rollout that raises
becomes an episode with ``error`` set and ``crashed`` true, never the end of the run. ``crashed`` also marks a
harness that exited non-zero without a budget stop; ``timed_out`` counts as a budget stop (time), as in
:class:`~tasks.rewards.RewardConfig`.

Run from the proxy env: ``python -m tasks.collect --help``.

Layout: services (engine, proxies), one rollout, the loop, CLI (config and plan: :mod:`tasks.collect_plan`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import httpx
import pyarrow.compute as pc

from addon import launch
from addon.engine.pool import check_engines, parse_engine_urls
from addon.records.schema import read_records, records_from_table
from tasks.collect_plan import (
    ALL_HARNESSES,
    DEFAULT_HARNESSES,
    ENGINE_PYTHON,
    ROOT,
    ROUTES,
    CollectConfig,
    CollectConfigError,
    Rollout,
    load_tasks,
    plan,
    uses_base_url,
)
from tasks.episodes import (
    CallStats,
    EpisodeRecord,
    Progress,
    call_stats,
    judge,
    rejoin,
    summarize,
    summary_markdown,
    write_episodes,
    write_outputs,
)
from tasks.harnesses import HARNESSES, HarnessRun, install, run_harness
from tasks.rewards import Rewarder, StopReward
from tasks.sandbox import SandboxConfig
from tasks.workspace import VerifierResult, prepare_workspace, run_verifier

TAIL_CHARS = 2000
# After Ctrl-C/SIGTERM: how long the harnesses get to end on SIGTERM before SIGKILL, and how often they are signalled
STOP_GRACE_S = 10.0
STOP_POLL_S = 0.25


# ------------------------------------------------------------------------------------------------ services


@contextmanager
def engine(config: CollectConfig, log: TextIO) -> Iterator[str]:
    """The engine URL (or comma-separated URLs); an engine started here is stopped on exit. ``log`` must be a real
    file (serve's stderr)."""
    if config.engine_url:
        urls = parse_engine_urls(config.engine_url)
        try:
            served = asyncio.run(check_engines(urls))  # every engine healthy, all serving one model
        except ValueError as e:
            raise CollectConfigError(f"engine_url: {e}") from e
        print(f"collect: using {len(urls)} engine(s) serving {served.id}: {', '.join(urls)}", file=log)
        yield ",".join(urls)
        return
    cli = [str(config.engine_python), "-m", "trainer.engine"]
    run_dir = ["--run-dir", str(config.engine_run_dir.resolve())]  # resolved: the CLI runs in the repository root
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_URL"}  # serve would reuse it instead of starting
    status = subprocess.run([*cli, "status", *run_dir], cwd=ROOT, env=env, capture_output=True, text=True)
    reused = status.returncode == 0
    print(f"collect: {'reusing' if reused else 'starting'} the engine ({config.engine_run_dir})", file=log)
    model = ["--model", config.model, "--cache-dir", str(config.cache_dir.resolve())]
    serve = [*cli, "serve", "--port", "0", *run_dir, *model]
    done = subprocess.run(serve, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"`{' '.join(serve)}` exited with {done.returncode}; see the output above")
    try:
        yield done.stdout.strip().splitlines()[-1]
    finally:
        if not reused:
            subprocess.run([*cli, "stop", *run_dir], cwd=ROOT, env=env, stderr=log)


def start_proxies(
    config: CollectConfig, engine_url: str, stack: ExitStack
) -> dict[tuple[str, ...], launch.ProxyHandle]:
    """One proxy per distinct harness proxy-option set; each is stopped when ``stack`` closes."""
    base = [f"harnessrl_max_calls={config.max_calls}", f"harnessrl_run_id={config.run_id}"]
    if config.seed is not None:
        base.append(f"harnessrl_seed={config.seed}")
    if config.temperature is not None:
        base.append(f"harnessrl_temperature={config.temperature:g}")
    proxies: dict[tuple[str, ...], launch.ProxyHandle] = {}
    for options in dict.fromkeys(HARNESSES[h].proxy_options for h in config.harnesses):
        name = f"proxy-{len(proxies)}"
        cfg = launch.ProxyConfig(
            engine_url,
            config.out / name,
            records_dir=config.out / "records" / name,
            options=(*base, *options),
        )
        handle = launch.start(cfg)
        stack.callback(handle.stop)
        proxies[options] = handle
    return proxies


# ------------------------------------------------------------------------------------------------ one rollout


def session_stats(proxy: launch.ProxyHandle, session: str) -> CallStats:
    """Flush ``session``'s records to shards and aggregate them."""
    proxy.admin("POST", f"sessions/{session}/close")
    if not any(proxy.records.rglob("shard-*.parquet")):
        return CallStats()
    table = read_records(proxy.records, filter=pc.field("session_id") == session)
    return call_stats(records_from_table(table))


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def rollout_timeout(r: Rollout, config: CollectConfig) -> float:
    """``--timeout`` if given, else the larger of the task's agent timeout and the harness's own limit.

    The harness's limit is a floor because it covers the cold prefill of that harness's first prompt on the CPU
    engine (minutes for the 13-19k-token ones), a cost of where the model runs, not of the task; a task's timeout
    (120 s for the smoke tasks) assumes a vendor-speed model.
    """
    return config.timeout_s or max(r.spec.timeout_s, r.task.agent_timeout_s)


class RolloutStopped(Exception):
    """The collection is stopping (Ctrl-C, SIGTERM): a rollout starts no further process."""


def run_rollout(
    r: Rollout,
    config: CollectConfig,
    proxy: launch.ProxyHandle,
    rewarder: Rewarder,
    scratch: Path,
    stop: threading.Event,
) -> EpisodeRecord:
    """Workspace, harness, verifier, call stats, reward (see the module docstring); ``stop`` set: no next step."""
    started, t0 = datetime.now(UTC), time.monotonic()
    timeout = rollout_timeout(r, config)
    workspace = prepare_workspace(r.task, scratch / "workspace").path
    url, harness_scratch = proxy.url(r.session_id), scratch / "harness"
    base_url = proxy.internal_base_url(r.session_id) if uses_base_url(config, r.spec) else None
    _check(stop)
    run = run_harness(
        r.spec,
        r.task.instruction,
        workspace,
        url,
        proxy.ca,
        timeout,
        scratch=harness_scratch,
        sandbox=config.sandbox,
        base_url=base_url,
    )
    _check(stop)
    verdict = run_verifier(r.task, workspace, sandbox=config.sandbox)
    try:
        stats = session_stats(proxy, r.session_id)
    except (httpx.HTTPError, OSError):  # keep the harness's outcome: the final join (rejoin) recounts its calls
        stats = CallStats()
    return episode(r, config, rewarder, started, time.monotonic() - t0, run, verdict, stats)


def _check(stop: threading.Event) -> None:
    if stop.is_set():
        raise RolloutStopped("the collection was stopped before this rollout ended")


def episode(
    r: Rollout,
    config: CollectConfig,
    rewarder: Rewarder,
    started: datetime,
    wall_s: float,
    run: HarnessRun | None,
    verdict: VerifierResult | None,
    stats: CallStats,
    error: str | None = None,
) -> EpisodeRecord:
    """Score one rollout; ``run`` is None when the harness never ran to an end (``error`` says why)."""
    ended = None if run is None else (run.exit_code, run.timed_out)
    verified = (verdict.reward, verdict.passed) if verdict else (None, False)
    outcome = judge(r.task.id, r.spec.name, verified, ended, stats)
    result = rewarder(outcome)
    return EpisodeRecord(
        run_id=config.run_id,
        session_id=r.session_id,
        task_id=r.task.id,
        task_version=r.task.version,
        harness=r.spec.name,
        harness_version=r.spec.version,
        group_id=r.group_id,
        task_group_id=r.task.id,
        sample_index=r.sample_index,
        started_at=started,
        reward=result.reward,
        reward_components=result.components,
        verifier_passed=outcome.verifier_passed,
        verifier_reward=outcome.verifier_reward,
        verifier_status=verdict.status if verdict else None,
        verifier_output_tail=_tail(verdict.output_tail) if verdict else "",
        exit_status=outcome.exit_status,
        timed_out=run.timed_out if run else False,
        crashed=outcome.crashed,
        wall_s=wall_s,
        harness_s=run.duration if run else 0.0,
        stderr_tail=_tail(run.stderr_tail) if run else "",
        stats=stats,
        error=error,
    )


def safe_rollout(
    r: Rollout, config: CollectConfig, proxy: launch.ProxyHandle, rewarder: Rewarder, stop: threading.Event
) -> EpisodeRecord:
    """:func:`run_rollout` in its own scratch folder; an exception becomes an error episode, not a lost run."""
    started, t0 = datetime.now(UTC), time.monotonic()
    keep = config.out / "workspaces" / r.session_id if config.keep_workspaces else None
    with tempfile.TemporaryDirectory(prefix=f"harnessrl-{r.session_id}-", ignore_cleanup_errors=True) as tmp:
        scratch = keep or Path(tmp)
        try:
            return run_rollout(r, config, proxy, rewarder, scratch, stop)
        except Exception as e:  # one broken rollout must not end the run; the episode records why
            why = f"{type(e).__name__}: {e}"
            return episode(r, config, rewarder, started, time.monotonic() - t0, None, None, CallStats(), why)


# ------------------------------------------------------------------------------------------------ the loop


@dataclass(frozen=True)
class CollectResult:
    run_dir: Path
    episodes: tuple[EpisodeRecord, ...]
    files: Mapping[str, Path]
    interrupted: bool = False


def collect(config: CollectConfig, log: TextIO = sys.stderr) -> CollectResult:
    """Run the whole collection (see the module docstring); writes and returns what was collected."""
    tasks = load_tasks(config.tasks, config.max_tasks)
    rollouts = plan(config, tasks)
    for name in config.harnesses:
        installed = install(HARNESSES[name])
        print(f"collect: {name} {'cached' if installed.cached else 'installed'} at {installed.executable}", file=log)
    if config.route == "base-url":
        direct = [h for h in config.harnesses if uses_base_url(config, HARNESSES[h])]
        rest = [h for h in config.harnesses if h not in direct]
        others = f"; HTTPS_PROXY for {', '.join(rest)} (no base-URL setting known)" if rest else ""
        print(f"collect: base URL (no mitmproxy hop) for {', '.join(direct) or 'none'}{others}", file=log)
    config.out.mkdir(parents=True, exist_ok=True)
    print(f"collect: {len(rollouts)} rollouts ({len(tasks)} tasks x {len(config.harnesses)} harnesses x "
          f"G={config.group_size}) into {config.out}", file=log)  # fmt: skip
    episodes: list[EpisodeRecord] = []
    interrupted = False
    with ExitStack() as stack:
        url = stack.enter_context(engine(config, log))
        proxies = start_proxies(config, url, stack)
        rewarder, progress = config.rewarder(), Progress(len(rollouts), log)
        pool, stop = ThreadPoolExecutor(config.concurrency, thread_name_prefix="rollout"), threading.Event()
        futures: list[Future[EpisodeRecord]] = [
            pool.submit(safe_rollout, r, config, proxies[r.spec.proxy_options], rewarder, stop) for r in rollouts
        ]
        try:
            for fut in as_completed(futures):
                episodes.append(fut.result())
                progress.update(episodes[-1])
                write_episodes(config.out / "episodes.parquet", episodes)
        except KeyboardInterrupt:
            interrupted = True
            print("\ncollect: interrupted; stopping the harnesses, the proxies and the engine", file=log)
            stop.set()  # a running rollout starts no next process (harness, verifier)
            pool.shutdown(wait=False, cancel_futures=True)  # queued rollouts never start
            stop_rollouts(futures, log)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    episodes = rejoin(episodes, config.out / "records", config.rewarder())
    files = write_outputs(config.out, episodes)
    return CollectResult(config.out, tuple(episodes), files, interrupted)


def stop_rollouts(futures: Sequence[Future[EpisodeRecord]], log: TextIO, grace_s: float = STOP_GRACE_S) -> None:
    """Signal the harness and verifier groups until every running rollout has returned: SIGTERM, SIGKILL after
    ``grace_s``, and after twice that the rollouts still running are named and left to the interpreter's exit.

    Repeated, not sent once: a rollout thread may be between fork and ``setsid`` (its child not yet a group leader,
    so not found) or just past its last stop check when the first signal goes out, and a harness started then would
    run to its own time limit while the interpreter waits for the thread at exit.
    """
    start = time.monotonic()
    while True:
        running = wait(futures, timeout=STOP_POLL_S).not_done
        if not running:
            return
        waited = time.monotonic() - start
        if waited > 2 * grace_s:
            print(f"collect: {len(running)} rollout(s) did not stop within {2 * grace_s:g} s", file=log)
            return
        kill_child_groups(signal.SIGTERM if waited < grace_s else signal.SIGKILL)


def kill_child_groups(sig: signal.Signals) -> None:
    """Signal the process group of each child of this process (harnesses and verifiers run as group leaders).

    Ctrl-C reaches only the foreground group, and the harness runner starts each harness in a session of its own, so
    without this a running harness would go on until its time limit while the pool's threads wait for it.
    """
    me = os.getpid()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        pid, ppid, pgid = int(stat_file.parent.name), int(fields[1]), int(fields[2])
        if ppid == me and pgid == pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)


# ------------------------------------------------------------------------------------------------ CLI


def _stop_reward(text: str) -> StopReward:
    return "score" if text == "score" else float(text)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    d = CollectConfig.__dataclass_fields__
    ap = argparse.ArgumentParser(prog="python -m tasks.collect", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=env.get("TASKS") or "smoke", help="task folder or built-in subset ($TASKS)")
    ap.add_argument("--harnesses", default=env.get("HARNESSES") or ",".join(DEFAULT_HARNESSES),
                    help=f"comma-separated, from: {', '.join(HARNESSES)}; or {ALL_HARNESSES} ($HARNESSES)")  # fmt: skip
    ap.add_argument("--group-size", "-G", type=int, default=int(env.get("GROUP_SIZE") or 2), help="($GROUP_SIZE)")
    ap.add_argument("--concurrency", type=int, default=int(env.get("CONCURRENCY") or 2), help="($CONCURRENCY)")
    ap.add_argument("--max-tasks", type=int, default=int(env.get("MAX_TASKS") or 0), help="0: all ($MAX_TASKS)")
    ap.add_argument("--timeout", type=float, default=None, help="per-rollout seconds (default: the harness's)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/collect/<run-id>")
    ap.add_argument(
        "--engine-url",
        default=env.get("ENGINE_URL", ""),
        help="a running engine, or several comma-separated (replicas of one model); empty: start or reuse "
        "($ENGINE_URL)",
    )
    ap.add_argument("--engine-python", type=Path, default=ENGINE_PYTHON)
    ap.add_argument("--engine-run-dir", type=Path, default=d["engine_run_dir"].default)
    ap.add_argument("--model", default=env.get("MODEL") or "default", help="for a started engine ($MODEL)")
    ap.add_argument("--cache-dir", type=Path, default=d["cache_dir"].default)
    ap.add_argument("--reward", default=env.get("REWARD") or "pass_fail",
                    help="pass_fail, fractional, tool_shaping or module:function ($REWARD)")  # fmt: skip
    ap.add_argument("--on-budget-stop", type=_stop_reward, default=env.get("ON_BUDGET_STOP") or "0",
                    help="a number or 'score' ($ON_BUDGET_STOP)")  # fmt: skip
    ap.add_argument("--on-crash", type=_stop_reward, default=env.get("ON_CRASH") or "0",
                    help="a number or 'score' ($ON_CRASH)")  # fmt: skip
    ap.add_argument("--max-calls", type=int, default=int(env.get("MAX_CALLS") or 8), help="per episode ($MAX_CALLS)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=None,
                    help="sample every call at this temperature (default: the request's, else 1.0)")  # fmt: skip
    ap.add_argument("--keep-workspaces", action="store_true", help="keep each workspace under the run dir")
    ap.add_argument("--route", choices=ROUTES, default=env.get("ROUTE") or "proxy",
                    help="proxy: HTTPS_PROXY; base-url: those taking a base URL skip mitmproxy ($ROUTE)")  # fmt: skip
    ap.add_argument("--sandbox", choices=("namespaces", "none"), default=env.get("SANDBOX") or "namespaces",
                    help="namespaces: network to the proxy only, workspace at /app; none: opt out")  # fmt: skip
    ap.add_argument("--memory-mb", type=int, default=SandboxConfig.memory_mb, help="per rollout (resident, summed)")
    ap.add_argument("--cpu-seconds", type=float, default=None, help="per rollout (default: its time limit)")
    return ap


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    optional = {"run_id": args.run_id} if args.run_id else {}
    return CollectConfig(
        tasks=args.tasks,
        harnesses=tuple(h.strip() for h in args.harnesses.split(",") if h.strip()),
        group_size=args.group_size,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        max_tasks=args.max_tasks,
        run_dir=args.run_dir,
        engine_url=args.engine_url,
        engine_python=args.engine_python,
        engine_run_dir=args.engine_run_dir,
        model=args.model,
        cache_dir=args.cache_dir,
        reward=args.reward,
        on_budget_stop=args.on_budget_stop,
        on_crash=args.on_crash,
        max_calls=args.max_calls,
        seed=args.seed,
        temperature=args.temperature,
        keep_workspaces=args.keep_workspaces,
        route=args.route,
        sandbox=_sandbox(args),
        **optional,
    )


def _sandbox(args: argparse.Namespace) -> SandboxConfig:
    try:
        return SandboxConfig(mode=args.sandbox, memory_mb=args.memory_mb, cpu_seconds=args.cpu_seconds)
    except ValueError as e:
        raise CollectConfigError(str(e)) from e


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (kill, a supervisor, `make` being stopped) takes the same orderly stop as Ctrl-C


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    args = build_parser(env).parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # else the proxies, relays and harness groups outlive a `kill`
    try:
        config = config_from_args(args)
        load_tasks(config.tasks, config.max_tasks)  # fail before anything starts
        result = collect(config)
    except CollectConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as e:  # the engine, a proxy or an install failed to start
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before the rollouts began (installs, engine start): everything started is stopped
        print("collect: interrupted", file=sys.stderr)
        return 130
    print(summary_markdown(summarize(result.episodes)), end="")
    for name, path in result.files.items():
        print(f"{name}: {path}")
    return 130 if result.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

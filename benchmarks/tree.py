"""The process tree of a side-by-side run: a fake engine, N mitmdump processes, their CPU time and memory, and the
facts about the machine a result was measured on.

Contract: :func:`start_proxies` starts ``n`` capture proxies (each its own records folder: one writer per folder)
against one engine URL and returns once each has bound to the engine and loaded its tokenizer (``ready`` in its
admin stats), so the CPU a level measures is that of its calls, not the ~1 s of CPU a proxy's start-up takes;
:func:`cpu_seconds` and :func:`rss_bytes` read ``/proc`` for a process and its children
(mitmdump forks nothing, but the sum keeps the figure honest if it ever does); :func:`machine_facts` is the header
every results page carries; :func:`source_trees` reads the ``--compare LABEL=TREE`` arguments of the tree-against-tree
benchmarks. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from addon import launch  # noqa: E402
from addon.launch import ProxyHandle  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    kids = [int(p) for p in text.split()]
    return kids + [g for k in kids for g in _children(k)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live children (0 for a process that is gone)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of stat)
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its live children."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * _PAGE
        except OSError:
            continue
    return total


def loadavg() -> tuple[float, float, float]:
    a, b, c = os.getloadavg()
    return round(a, 2), round(b, 2), round(c, 2)


@dataclass(frozen=True)
class MachineFacts:
    host: str
    cpus: int
    cpu_model: str
    mem_gib: float
    python: str
    kernel: str

    def markdown(self) -> str:
        return (
            f"{self.host}: {self.cpus} CPUs ({self.cpu_model}), {self.mem_gib:.1f} GiB RAM, "
            f"Linux {self.kernel}, Python {self.python}"
        )


def machine_facts() -> MachineFacts:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return MachineFacts(platform.node(), os.cpu_count() or 0, model, mem, platform.python_version(), platform.release())


def source_trees(items: Sequence[str], error: Callable[[str], object]) -> list[tuple[str, Path]]:
    """``--compare LABEL=TREE ...`` as (label, resolved tree); ``error`` (``ArgumentParser.error``) for a bad item."""
    if not items:
        error("--compare LABEL=TREE [LABEL=TREE ...] is required")
    trees = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not Path(path, "addon", "capture.py").is_file():
            error(f"--compare takes LABEL=TREE with TREE a source tree holding addon/capture.py; got {item!r}")
        trees.append((label, Path(path).resolve()))
    return trees


def start_proxies(
    engine_url: str,
    n: int,
    workdir: Path,
    model_dir: str | Path,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    shared: bool = False,
) -> list[ProxyHandle]:
    """``n`` mitmdump + capture processes against ``engine_url``, each with its own workdir and records folder
    (``env``: extra environment for them); ``shared``: the ``n`` processes behind one port
    (``launch.start_shared``: one workdir, records in ``worker-<k>`` subfolders)."""
    opts = (f"harnessrl_model_dir={model_dir}", *options)
    extra = tuple((env or {}).items())
    handles: list[ProxyHandle] = []
    try:
        if shared:
            handles += launch.start_shared(
                launch.ProxyConfig(engine_url, workdir / "shared", options=opts, env=extra), n
            )
        else:
            for i in range(n):
                handles.append(
                    launch.start(launch.ProxyConfig(engine_url, workdir / f"proxy-{i}", options=opts, env=extra))
                )
        wait_bound(handles)
    except BaseException:
        for h in handles:
            h.stop()
        raise
    return handles


def wait_bound(handles: Sequence[ProxyHandle], timeout: float = 180.0) -> None:
    """Until every proxy's admin stats say ``ready`` (engine bound, tokenizer loaded; its generation workers too)."""
    deadline = time.monotonic() + timeout
    for h in handles:
        while not h.admin("GET", "stats").get("ready"):
            if h.process.poll() is not None or time.monotonic() > deadline:
                raise TimeoutError(f"proxy on port {h.port} not bound to its engine:\n{h.log.read_text()[-3000:]}")
            time.sleep(0.1)


def restart(handle: ProxyHandle, engine_url: str, model_dir: str | Path, options: Sequence[str] = ()) -> ProxyHandle:
    """Start a proxy again on the same port, workdir and records folder (after a kill -9): the WAL is recovered."""
    opts = (f"harnessrl_model_dir={model_dir}", *options)
    workdir = handle.confdir.parent
    cfg = launch.ProxyConfig(engine_url, workdir, port=handle.port, admin_port=handle.admin_port, options=opts)
    return launch.start(cfg)


def kill9(handle: ProxyHandle) -> None:
    """SIGKILL the whole mitmdump process group, as a crash would."""
    if handle.process.poll() is None:
        os.killpg(handle.process.pid, 9)
        handle.process.wait()


def git_rev() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"

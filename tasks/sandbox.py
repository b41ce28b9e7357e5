"""Sandboxed runs: a private network that reaches only the proxy, fixed paths mapped, memory and CPU limits.

Contract
--------
:class:`SandboxConfig` chooses the mode and the limits. Mode ``"namespaces"`` (the default) runs a command with
``unshare --user --map-root-user --net --mount --pid --fork`` (unprivileged; no bubblewrap needed). Inside:

* **Network**: a fresh network namespace with only loopback. When a proxy URL is given, a relay (``tasks/relay.py``)
  listens on ``127.0.0.1:<proxy port>`` inside and forwards to a Unix socket in a short-named temp folder
  (filesystem paths cross network namespaces), where a relay thread of the caller connects to the proxy's TCP port. So
  ``HTTPS_PROXY`` keeps its value, the proxy is reachable, and every other host or port (DNS included) is not.
* **Filesystem**: a tmpfs root holding a recursive bind of each top-level entry of the host's ``/`` (same paths,
  so tools, HOME and scratch are where the caller put them) plus the :class:`Mount` s, e.g. the workspace at
  ``/app``: nothing is written to the host's ``/app``. A fresh ``/proc`` shows only the sandbox's processes.
* **Processes**: the init (pid 1 inside) forwards SIGTERM to the command and exits with its status; when it ends,
  the kernel kills every process left in the namespace, even ones that left the process group.

If the kernel refuses these namespaces, :func:`check_available` raises :class:`SandboxError` telling the user to
pass ``--sandbox none`` (there is no silent fallback). Mode ``"none"`` runs the command as it is.

**Limits** apply in both modes. :class:`Watchdog` sums the resident memory and the CPU time (user + system,
including reaped children) of the command's whole process tree and says when either passes its limit; the runner
then kills the tree. rlimits cannot do this job: RLIMIT_AS/RLIMIT_DATA count address space, and the Bun-based
harnesses (Claude Code, OpenCode) reserve about 129 GB of it (70 GB "data") just to print their version, while
RLIMIT_CPU counts per process. A watchdog samples, so a fast hog can overshoot by what it allocates in one
interval (``POLL_S``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from tasks.relay import UnixToTcp

SandboxMode = Literal["namespaces", "none"]
POLL_S = 0.25  # one scan of /proc costs ~4 ms of CPU with ~130 processes: ~1.6 % of a core per run
UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child")
RELAY_SCRIPT = Path(__file__).resolve().with_name("relay.py")
# Top-level paths a Mount may not cover: the sandbox needs the host's versions of them.
RESERVED = frozenset(
    "/ /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /opt /proc /root /run /sbin /srv /sys /tmp /usr /var"
    " /work".split()
)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")

# The init, run by bash as pid 1 of the new namespaces. Positional arguments: ROOT CWD NMOUNTS [INSIDE OUTSIDE]...
# (relay PYTHON SCRIPT PORT SOCKET READY | norelay) ARGV...
_INIT = r"""
set -eu
root=$1 cwd=$2 n=$3; shift 3
mount -t tmpfs -o mode=0755 harnessrl-root "$root"
for e in /*; do
  name=${e#/}
  if [ "$name" = proc ]; then continue; fi
  if [ -L "$e" ]; then ln -s "$(readlink "$e")" "$root/$name"
  elif [ -d "$e" ]; then mkdir "$root/$name"; mount --rbind "$e" "$root/$name"
  elif [ -e "$e" ]; then : > "$root/$name"; mount --bind "$e" "$root/$name"
  fi
done
mkdir -p "$root/proc"; mount -t proc proc "$root/proc"
while [ "$n" -gt 0 ]; do mkdir -p "$root$1"; mount --bind "$2" "$root$1"; shift 2; n=$((n - 1)); done
if [ "$1" = relay ]; then
  "$2" -I "$3" "$4" "$5" "$6" &
  ready=$6; shift 6; tries=0
  until [ -e "$ready" ]; do
    tries=$((tries + 1)); [ "$tries" -lt 1000 ] || { echo "harnessrl sandbox: the relay did not start" >&2; exit 125; }
    sleep 0.01
  done
else
  shift
fi
set +e
chroot "$root" /bin/sh -c 'cd "$1" && shift && exec "$@"' sandbox-cwd "$cwd" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done
exit "$rc"
"""


class SandboxError(RuntimeError):
    """The sandbox cannot be set up here; the message says what to do instead."""


@dataclass(frozen=True)
class SandboxConfig:
    """How rollouts (and verifiers) run. ``cpu_seconds`` None: as many as the run's time limit (one busy core)."""

    mode: SandboxMode = "namespaces"
    memory_mb: int = 4096
    cpu_seconds: float | None = None
    workdir: str = "/app"
    """Where the workspace appears inside (namespaces mode); the command runs there."""

    def __post_init__(self) -> None:
        if self.mode not in ("namespaces", "none"):
            raise ValueError(f"sandbox mode must be 'namespaces' or 'none', got {self.mode!r}")
        if self.memory_mb < 1:
            raise ValueError(f"sandbox memory_mb must be at least 1, got {self.memory_mb}")
        if self.cpu_seconds is not None and not self.cpu_seconds > 0:
            raise ValueError(f"sandbox cpu_seconds must be positive (or None), got {self.cpu_seconds}")
        check_mount_point(self.workdir)


@dataclass(frozen=True)
class Mount:
    """Bind ``outside`` (a host directory) at ``inside`` (a top-level path such as ``/app``) in the sandbox."""

    inside: str
    outside: Path

    def __post_init__(self) -> None:
        check_mount_point(self.inside)


def check_mount_point(inside: str) -> None:
    parts = Path(inside).parts
    if len(parts) != 2 or parts[0] != "/" or inside in RESERVED:
        raise ValueError(f"sandbox path {inside!r} must be a top-level path such as /app, not one of the host's")


def check_available() -> None:
    """Raise :class:`SandboxError` unless namespaces mode works on this machine (a ~20 ms probe)."""
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    else:
        if done.returncode == 0:
            return
        why = done.stderr.strip() or f"exit status {done.returncode}"
    raise SandboxError(
        f"the namespaces sandbox is unavailable here (`{' '.join(UNSHARE)} true` failed: {why}); "
        "pass --sandbox none to run without one (no network isolation, no /app mapping)"
    )


@dataclass(frozen=True)
class Prepared:
    """The command to start and the directory to start it in."""

    argv: list[str]
    cwd: Path


@contextmanager
def sandboxed(
    config: SandboxConfig,
    argv: Sequence[str],
    workdir: Path,
    scratch: Path,
    *,
    proxy_url: str | None = None,
    mounts: Sequence[Mount] = (),
) -> Iterator[Prepared]:
    """The command that runs ``argv`` in ``workdir`` under ``config``; the outside relay lives while this is open.

    In namespaces mode ``workdir`` is mounted at ``config.workdir`` and the command starts there.
    """
    if config.mode == "none":
        yield Prepared(list(argv), workdir)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    root = scratch / "sandbox-root"
    root.mkdir(exist_ok=True)
    binds = [Mount(config.workdir, workdir), *mounts]
    head = ["bash", "-c", _INIT, "harnessrl-init", str(root), config.workdir, str(len(binds))]
    head += [p for m in binds for p in (m.inside, str(m.outside.resolve()))]
    if proxy_url is None:
        yield Prepared([*UNSHARE, *head, "norelay", *argv], scratch)
        return
    target = urlsplit(proxy_url)
    if target.hostname is None or target.port is None:
        raise ValueError(f"proxy URL {proxy_url!r} needs a host and a port")
    ready = scratch / "relay.ready"
    ready.unlink(missing_ok=True)
    # A Unix socket path must fit in 108 bytes, which a scratch folder under a run folder need not: a short one.
    with tempfile.TemporaryDirectory(prefix="hrl-", dir=_short_tmp()) as short:
        sock = Path(short) / "proxy.sock"
        relay = ["relay", sys.executable, str(RELAY_SCRIPT), str(target.port), str(sock), str(ready)]
        with UnixToTcp(sock, target.hostname, target.port):
            yield Prepared([*UNSHARE, *head, *relay, *argv], scratch)


def _short_tmp() -> str | None:
    """``/tmp`` when it exists (the sandbox sees it at the same path), else the default temp folder."""
    return "/tmp" if os.path.isdir("/tmp") else None


@dataclass(frozen=True)
class Usage:
    rss_mb: float
    cpu_s: float


def tree_usage(pid: int) -> Usage:
    """Resident memory and CPU time of ``pid`` and all its descendants (reaped children's CPU included)."""
    stats: dict[int, list[str]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stats[int(entry.name)] = f.read().rsplit(")", 1)[1].split()
            except OSError:  # it ended while we looked
                continue
    children: dict[int, list[int]] = {}
    for p, stat in stats.items():
        children.setdefault(int(stat[1]), []).append(p)
    rss_pages, ticks, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        own = stats.get(p)
        if own is None:
            continue
        # after ")": state ppid ... utime(11) stime(12) cutime(13) cstime(14) ... rss(21)
        ticks += sum(int(x) for x in own[11:15])
        rss_pages += int(own[21])
        todo.extend(children.get(p, []))
    return Usage(rss_pages * _PAGE / 2**20, ticks / _TICK)


@dataclass(frozen=True)
class Watchdog:
    """Checks a process tree against the limits; :meth:`exceeded` names the first limit passed, else None."""

    pid: int
    memory_mb: int
    cpu_seconds: float

    def exceeded(self) -> tuple[Literal["memory", "cpu"], str] | None:
        usage = tree_usage(self.pid)
        if usage.rss_mb > self.memory_mb:
            return "memory", f"{usage.rss_mb:.0f} MB resident > limit {self.memory_mb} MB"
        if usage.cpu_s > self.cpu_seconds:
            return "cpu", f"{usage.cpu_s:.1f} CPU s > limit {self.cpu_seconds:g} s"
        return None

"""Install a pinned harness on demand into the tools folder, once.

Contract
--------
``install(spec, tools_dir)`` returns the harness's executable, installing it first when needed:

* npm harnesses go to ``<tools>/npm/<name>`` via ``npm install --prefix`` (each its own prefix, so their
  dependency trees never meet); the executable is ``node_modules/.bin/<executable>``.
* Python harnesses go to their own venv ``<tools>/venv-<name>`` (mini-swe-agent and hermes pin conflicting
  versions of the same packages), made with the engine env's Python 3.11 when present, else ``python3``.

A stamp file holding the pin is written last, so an install that failed or was stopped half-way is redone (a venv
without the stamp is removed first) and a second call with the stamp in place does nothing. An exclusive file lock
per harness makes parallel test workers wait for one install instead of racing. Lifecycle scripts of npm packages
are not run (npm 11 skips unapproved ones anyway): every pinned harness here works without them.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOOLS_DIR = ROOT / ".cache" / "harnessrl" / "tools"
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python3.11"
STAMP = ".harnessrl-installed"
INSTALL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Installed:
    """Where the harness's executable is, and what this call cost (``cached``: nothing was installed)."""

    executable: Path
    seconds: float
    cached: bool


class InstallError(RuntimeError):
    """The package manager failed; the message carries the tail of its output."""


def install_dir(spec: HarnessSpec, tools_dir: Path = DEFAULT_TOOLS_DIR) -> Path:
    return tools_dir / ("npm" / Path(spec.name) if spec.installer == "npm" else Path(f"venv-{spec.name}"))


def executable_path(spec: HarnessSpec, tools_dir: Path = DEFAULT_TOOLS_DIR) -> Path:
    where = install_dir(spec, tools_dir)
    return where / ("node_modules/.bin" if spec.installer == "npm" else "bin") / spec.executable


def install(spec: HarnessSpec, tools_dir: Path = DEFAULT_TOOLS_DIR) -> Installed:
    """Install ``spec`` unless its stamp says it is there (see the module docstring)."""
    where = install_dir(spec, tools_dir)
    stamp = where / STAMP
    t0 = time.monotonic()
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".{where.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if stamp.exists() and stamp.read_text() == spec.pin:
            return Installed(executable_path(spec, tools_dir), time.monotonic() - t0, cached=True)
        stamp.unlink(missing_ok=True)
        if spec.installer == "pip" and where.exists():
            # no stamp: an install was stopped half-way (Ctrl-C during `venv` leaves a venv without pip), so the
            # venv is made afresh rather than trusted
            shutil.rmtree(where)
        for step in _steps(spec, where):
            _run(step, where.parent)
        exe = executable_path(spec, tools_dir)
        if not exe.exists():
            raise InstallError(f"{spec.pin} installed but {exe} is missing")
        stamp.write_text(spec.pin)
    return Installed(exe, time.monotonic() - t0, cached=False)


def _steps(spec: HarnessSpec, where: Path) -> list[list[str]]:
    if spec.installer == "npm":
        npm = shutil.which("npm")
        if npm is None:
            raise InstallError(f"{spec.pin}: npm is not on PATH")
        where.mkdir(parents=True, exist_ok=True)
        return [[npm, "install", "--prefix", str(where), "--no-audit", "--no-fund", "--save-exact", spec.pin]]
    python = str(ENGINE_PYTHON) if ENGINE_PYTHON.exists() else (shutil.which("python3") or "python3")
    return [
        [python, "-m", "venv", str(where)],
        [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet", spec.pin],
    ]


def _run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise InstallError(f"{' '.join(cmd)} exited with {done.returncode}:\n{tail}")

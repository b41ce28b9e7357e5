"""The ``harnessrl`` command: one console script whose subcommands run the project's module CLIs.

Contract
--------
* ``harnessrl COMMAND [ARGS ...]`` runs ``python -m MODULE [PREFIX ...] ARGS ...`` of :data:`COMMANDS`: the module's
  own ``main(argv)``, imported only when its command runs, so ``harnessrl COMMAND --help`` is that module's help and
  ``python -m MODULE`` keeps working. ``harnessrl --help`` lists the commands; ``harnessrl --version`` prints the
  installed version (package metadata).
* This module imports only the standard library, so the script runs in both environments (the proxy env with
  ``.[proxy]``, the engine env with ``.[engine-cpu|engine-cuda,trainer]``) and in a core-only install.
* A command whose packages (:attr:`Command.needs`) are missing here runs in the other environment's interpreter:
  ``$HARNESSRL_ENGINE_PYTHON`` / ``$HARNESSRL_PROXY_PYTHON`` when set, else ``.venvs/engine/bin/python`` /
  ``.venvs/proxy/bin/python`` of the source checkout this package is installed from (editable install). It replaces
  this process (``os.execve``: same arguments, working directory, environment, exit status), with the checkout on
  ``PYTHONPATH``. With no such interpreter it exits 2 saying which extra to install. ``--help`` never switches.

Run: ``harnessrl --help`` (or ``python -m tasks.cli --help``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TextIO

ROOT = Path(__file__).resolve().parent.parent
PROG = "harnessrl"


@dataclass(frozen=True)
class Env:
    """One of the two environments: where its interpreter is found and what installs it."""

    name: str
    python_var: str
    venv: str
    install: str
    python: str


PROXY = Env("proxy", "HARNESSRL_PROXY_PYTHON", ".venvs/proxy", "pip install -e '.[proxy]'", "Python >= 3.12")
ENGINE = Env(
    "engine",
    "HARNESSRL_ENGINE_PYTHON",
    ".venvs/engine",
    "pip install -e '.[engine-cpu,trainer]'",
    "Python 3.11; '.[engine-cuda,trainer]' on a GPU machine",
)


@dataclass(frozen=True)
class Command:
    """A subcommand: ``python -m module *prefix *args`` in ``env``, which must provide ``needs`` (import names)."""

    module: str
    summary: str
    env: Env
    prefix: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    needs_for: Mapping[str, tuple[str, ...]] | None = None  # by first argument, instead of ``needs`` (eval run)

    def required(self, args: Sequence[str]) -> tuple[str, ...]:
        if self.needs_for is not None:
            return self.needs_for.get(args[0], ()) if args else ()
        return self.needs


COMMANDS: dict[str, Command] = {
    "collect": Command(
        "tasks.collect", "run harnesses on tasks through the capture proxy; score; write episodes + summary",
        PROXY, needs=("mitmproxy",),
    ),
    "train": Command(
        "trainer.train", "RL training: alternating collect / train / sync iterations (TRL GRPOConfig)",
        ENGINE, needs=("torch", "trl", "vllm"),
    ),
    "sft": Command("trainer.sft", "TRL SFT on the episodes of collect runs", ENGINE, needs=("torch", "trl")),
    "eval": Command(
        "trainer.evaluate", "run: held-out pass@1 + tool calls, base vs checkpoint; compare: two collect runs",
        ENGINE, needs_for={"run": ("vllm",)},
    ),
    "report": Command(
        "trainer.report", "HTML page and PNG plots of a training run", ENGINE, needs=("matplotlib",)
    ),
    "serve": Command(
        "trainer.engine", "start vLLM in the background (or reuse a healthy one); print its URL",
        ENGINE, prefix=("serve",), needs=("vllm",),
    ),
    "stop": Command("trainer.engine", "stop the engine that `serve` started", ENGINE, prefix=("stop",)),
    "status": Command(
        "trainer.engine", "print the recorded engine's state as JSON; exit 0 if healthy", ENGINE, prefix=("status",)
    ),
    "model": Command(
        "trainer.model", "prepare a model (convert the embedded default once); print its folder",
        ENGINE, prefix=("prepare",), needs=("torch", "transformers"),
    ),
    "proxy": Command(
        "addon.launch", "run the capture proxy (mitmdump + addon) in the foreground", PROXY, needs=("mitmproxy",)
    ),
    "check-tasks": Command(
        "tasks.oracle", "oracle check: every task's solution passes, every untouched workspace fails", PROXY
    ),
}  # fmt: skip

HELP_FLAGS = frozenset({"-h", "--help"})


class CommandError(Exception):
    """A command cannot run here and no other environment can run it; the message says what to install."""


def version() -> str:
    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: {PROG} [-h] [--version] COMMAND [ARGS ...]",
        "",
        "Train open models with RL inside real, unmodified coding-agent harnesses.",
        "",
        "commands (`harnessrl COMMAND --help` for each one's options):",
        *(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items()),
        "",
        "options:",
        "  -h, --help  show this help message and exit",
        "  --version   print the installed version and exit",
        "",
        "A command needing the other environment (collect and proxy: the proxy env; train, sft, eval run, serve and",
        "model: the engine env) runs in it when its interpreter is found: $HARNESSRL_PROXY_PYTHON /",
        "$HARNESSRL_ENGINE_PYTHON, else .venvs/proxy or .venvs/engine of the source checkout.",
    ]
    return "\n".join(lines) + "\n"


def missing(names: Sequence[str]) -> list[str]:
    """The import names among ``names`` that this interpreter cannot import (found without importing them)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def other_python(env: Env, environ: Mapping[str, str]) -> Path:
    """The interpreter of ``env``: its variable when set, else the checkout's venv; :class:`CommandError` if none."""
    given = environ.get(env.python_var, "")
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise CommandError(f"${env.python_var} is {given}, which is not an executable file")
        return path
    if (ROOT / "setup.cfg").is_file():
        path = ROOT / env.venv / "bin" / "python"
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise CommandError(f"${env.python_var} is not set and {path} does not exist")
    raise CommandError(f"${env.python_var} is not set (and this is not an editable install with {env.venv})")


def _same_environment(python: Path) -> bool:
    """Whether ``python`` belongs to this very environment (venv interpreters are links to one base interpreter)."""
    try:
        return python.absolute().parent.parent.resolve() == Path(sys.prefix).resolve()
    except OSError:
        return False


def reexec_plan(
    name: str, cmd: Command, args: Sequence[str], environ: Mapping[str, str]
) -> tuple[Path, list[str], dict[str, str]] | None:
    """None when ``cmd`` runs here; else (interpreter, argv, environment) to run it in its own environment."""
    before_dashes = list(args[: args.index("--")] if "--" in args else args)
    if HELP_FLAGS.intersection(before_dashes) and not missing([cmd.module]):
        return None  # help needs only the module itself, which imports with the core dependencies
    absent = missing(cmd.required(args))
    if not absent:
        return None
    reason = f"{PROG} {name}: needs the {cmd.env.name} env ({', '.join(absent)} missing in {sys.executable})"
    try:
        python = other_python(cmd.env, environ)
    except CommandError as e:
        raise CommandError(
            f"{reason}, and no {cmd.env.name} env was found: {e}.\n"
            f"Install it with `{cmd.env.install}` ({cmd.env.python}), build it with `make {cmd.env.name}-env` in the "
            f"checkout, or point ${cmd.env.python_var} at its interpreter."
        ) from None
    if _same_environment(python):
        raise CommandError(
            f"{reason}; ${cmd.env.python_var} names this same environment. Install `{cmd.env.install}` "
            f"({cmd.env.python})."
        )
    child_env = dict(environ)
    if (ROOT / "setup.cfg").is_file():  # the other interpreter may not have this checkout installed
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environ.get("PYTHONPATH", "")) if p)
    return python, [str(python), "-m", cmd.module, *cmd.prefix, *args], child_env


def _execve(path: Path, argv: list[str], env: dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(path, argv, env)


# Replaced in tests; os.execve never returns.
exec_fn: Callable[[Path, list[str], dict[str, str]], object] = _execve


def run_command(name: str, args: Sequence[str], environ: Mapping[str, str] = os.environ) -> int:
    cmd = COMMANDS[name]
    try:
        plan = reexec_plan(name, cmd, args, environ)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if plan is not None:
        python, argv, env = plan
        print(f"{PROG} {name}: running in the {cmd.env.name} env: {python}", file=sys.stderr)
        exec_fn(python, argv, env)
        return 0  # only reached when exec_fn is replaced
    module = importlib.import_module(cmd.module)
    try:
        return int(module.main([*cmd.prefix, *args]) or 0)
    except SystemExit as e:  # argparse (--help, usage errors), sys.exit(...)
        if isinstance(e.code, int) or e.code is None:
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = stdout or sys.stdout
    if not args:
        sys.stderr.write(usage())
        return 2
    first, rest = args[0], args[1:]
    if first in HELP_FLAGS:
        out.write(usage())
        return 0
    if first == "--version":
        out.write(f"{PROG} {version()}\n")
        return 0
    if first not in COMMANDS:
        print(f"{PROG}: unknown command {first!r}; one of: {', '.join(COMMANDS)} ({PROG} --help)", file=sys.stderr)
        return 2
    return run_command(first, rest)


if __name__ == "__main__":
    sys.exit(main())

"""tasks/cli.py, the ``harnessrl`` console script: every subcommand is its module's own CLI (same help, same
arguments), a command needing the other environment runs in that environment's interpreter or exits 2 naming the
extra to install, and the wheel ships the built-in tasks."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tasks import cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "harnessrl"
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python"


def squash(text: str) -> str:
    """Text without whitespace: argparse wraps descriptions at any width (and after hyphens)."""
    return "".join(text.split())


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} is not installed (pip install -e .)")
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_the_installed_script_lists_every_subcommand_and_its_version() -> None:
    done = run_script("--help")
    assert done.returncode == 0, done.stderr
    for name, command in cli.COMMANDS.items():
        assert f"  {name} " in done.stdout and command.summary in done.stdout
    version = run_script("--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"harnessrl {importlib.metadata.version('harnessrl')}"


def test_the_installed_script_runs_a_module_cli() -> None:
    done = run_script("collect", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: python -m tasks.collect" in done.stdout and "--group-size" in done.stdout


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_subcommand_help_is_its_module_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    command = cli.COMMANDS[name]
    assert cli.main([name, "--help"]) == 0
    got = capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        importlib.import_module(command.module).main([*command.prefix, "--help"])
    assert done.value.code == 0
    assert got == capsys.readouterr().out
    assert f"usage: python -m {' '.join((command.module, *command.prefix))}" in got
    if not command.prefix:  # a subparser's help has no description of its own
        doc = importlib.import_module(command.module).__doc__ or ""
        assert squash(doc.splitlines()[0]) in squash(got)


def test_the_script_imports_no_environment_specific_package() -> None:
    """It must start in both environments and in a core-only install: standard library only until a command runs."""
    probe = "import sys, tasks.cli; print(sorted({m.split('.')[0] for m in sys.modules} & {'mitmproxy', 'torch', "
    probe += "'vllm', 'trl', 'transformers', 'httpx', 'pyarrow', 'addon', 'trainer', 'converters'}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_no_command_an_unknown_one_and_a_bad_argument_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: harnessrl" in capsys.readouterr().err
    assert cli.main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err
    assert cli.main(["report", "run-dir", "--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the other environment


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, list[str], dict[str, str]]]:
    """Every package a command needs is missing here; re-executions are recorded instead of run."""
    execs: list[tuple[Path, list[str], dict[str, str]]] = []
    modules = {command.module for command in cli.COMMANDS.values()}
    monkeypatch.setattr(cli, "missing", lambda names: [n for n in names if n not in modules])
    monkeypatch.setattr(cli, "exec_fn", lambda python, argv, env: execs.append((python, argv, env)))
    return execs


def fake_python(tmp_path: Path) -> Path:
    python = tmp_path / "other-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "ran: $*"\necho "PYTHONPATH=$PYTHONPATH"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize(
    ("name", "var", "args", "module_argv"),
    [
        ("train", "HARNESSRL_ENGINE_PYTHON", ["--iterations", "1"], ["-m", "trainer.train", "--iterations", "1"]),
        ("serve", "HARNESSRL_ENGINE_PYTHON", ["--port", "0"], ["-m", "trainer.engine", "serve", "--port", "0"]),
        ("model", "HARNESSRL_ENGINE_PYTHON", [], ["-m", "trainer.model", "prepare"]),
        ("eval", "HARNESSRL_ENGINE_PYTHON", ["run", "--run", "r"], ["-m", "trainer.evaluate", "run", "--run", "r"]),
        ("collect", "HARNESSRL_PROXY_PYTHON", ["--tasks", "smoke"], ["-m", "tasks.collect", "--tasks", "smoke"]),
        ("proxy", "HARNESSRL_PROXY_PYTHON", ["--engine-url", "u"], ["-m", "addon.launch", "--engine-url", "u"]),
    ],
)
def test_a_command_whose_packages_are_missing_runs_in_the_other_env(
    name: str, var: str, args: list[str], module_argv: list[str], tmp_path: Path, nothing_installed: list
) -> None:
    python = fake_python(tmp_path)
    assert cli.run_command(name, args, {var: str(python), "PYTHONPATH": "/elsewhere"}) == 0
    [(ran, argv, env)] = nothing_installed
    assert ran == python and argv == [str(python), *module_argv]
    assert env[var] == str(python) and env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere"


def test_the_checkouts_venv_is_the_default_other_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nothing_installed: list
) -> None:
    checkout = tmp_path / "checkout"
    python = checkout / ".venvs" / "engine" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (checkout / "setup.cfg").write_text("")
    monkeypatch.setattr(cli, "ROOT", checkout)
    assert cli.run_command("sft", ["--runs", "a"], {}) == 0
    assert nothing_installed[0][1] == [str(python), "-m", "trainer.sft", "--runs", "a"]


@pytest.mark.parametrize(
    ("name", "var", "extra"),
    [
        ("train", "HARNESSRL_ENGINE_PYTHON", "pip install -e '.[engine-cpu,trainer]'"),
        ("serve", "HARNESSRL_ENGINE_PYTHON", "pip install -e '.[engine-cpu,trainer]'"),
        ("collect", "HARNESSRL_PROXY_PYTHON", "pip install -e '.[proxy]'"),
        ("proxy", "HARNESSRL_PROXY_PYTHON", "pip install -e '.[proxy]'"),
    ],
)
def test_without_the_other_env_a_command_exits_2_naming_the_extra(
    name: str, var: str, extra: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_installed: list
) -> None:
    assert cli.run_command(name, ["--x"], {var: str(tmp_path / "nowhere" / "python")}) == 2
    err = capsys.readouterr().err
    assert f"harnessrl {name}: needs the" in err and extra in err and f"${var}" in err
    assert not nothing_installed


def test_without_a_checkout_venv_a_command_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], nothing_installed: list
) -> None:
    monkeypatch.setattr(cli, "ROOT", tmp_path)  # an installed wheel: no setup.cfg, no .venvs beside the package
    assert cli.run_command("train", [], {}) == 2
    assert "$HARNESSRL_ENGINE_PYTHON is not set" in capsys.readouterr().err
    assert not nothing_installed


def test_help_and_commands_needing_nothing_never_switch_env(
    capsys: pytest.CaptureFixture[str], nothing_installed: list
) -> None:
    assert cli.run_command("train", ["--help"], {"HARNESSRL_ENGINE_PYTHON": "/nowhere"}) == 0
    assert "usage: python -m trainer.train" in capsys.readouterr().out
    assert cli.run_command("eval", ["compare", "--help"], {"HARNESSRL_ENGINE_PYTHON": "/nowhere"}) == 0
    assert not nothing_installed


def test_the_script_re_executes_in_the_other_interpreter(tmp_path: Path) -> None:
    if not cli.missing(["torch"]):
        pytest.skip("torch is installed here: `harnessrl sft` would run in this env")
    python = fake_python(tmp_path)
    done = run_script("sft", "--runs", "a b", env={"HARNESSRL_ENGINE_PYTHON": str(python)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "ran: -m trainer.sft --runs a b"
    assert f"harnessrl sft: running in the engine env: {python}" in done.stderr
    absent = run_script("sft", "--runs", "a", env={"HARNESSRL_ENGINE_PYTHON": str(tmp_path / "nowhere")})
    assert absent.returncode == 2 and "pip install -e '.[engine-cpu,trainer]'" in absent.stderr


# ---------------------------------------------------------------------------------------------- packaging


def test_the_wheel_ships_the_entry_point_and_every_builtin_task_file(tmp_path: Path) -> None:
    """A non-editable wheel, built offline with the engine env's setuptools from a copy of the sources."""
    if not ENGINE_PYTHON.exists():
        pytest.skip("the engine env (with setuptools) is not built")
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("addon", "converters", "trainer", "tasks"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [str(ENGINE_PYTHON), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=src, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = tmp_path.glob("harnessrl-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        z.extractall(tmp_path / "installed")
    assert "harnessrl = tasks.cli:main" in entry_points
    builtin = ROOT / "tasks" / "builtin"
    shipped = {
        p.relative_to(ROOT).as_posix() for p in builtin.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    assert shipped and shipped <= names  # dotfiles too (gitignore-add/environment/.gitignore)
    assert "tasks/cli.py" in names
    # the installed package finds its tasks beside itself
    listed = subprocess.run(
        [sys.executable, "-c", "from tasks.taskset import builtin_taskset as b; import tasks; print(tasks.__file__);"
         "print(len(b('all').tasks))"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "installed")},
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    where, count = listed.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "installed")
    assert int(count) == sum(1 for p in builtin.iterdir() if (p / "task.toml").exists())

"""tasks/harnesses/install.py: an install stopped half-way is redone, a stamped one is reused.

The spec here pins the pip that the venv's own ``ensurepip`` bundles, so pip finds it satisfied without a download
and the test runs offline; everything else (venv, pip, stamp, lock) is the real install path.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tasks.harnesses import install
from tasks.harnesses.base import HarnessSpec
from tasks.harnesses.install import ENGINE_PYTHON, STAMP, executable_path, install_dir

PYTHON = str(ENGINE_PYTHON) if ENGINE_PYTHON.exists() else "python3"


def bundled_pip() -> str:
    out = subprocess.run([PYTHON, "-c", "import ensurepip; print(ensurepip.version())"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.strip()


@dataclass(frozen=True)
class PipProbe(HarnessSpec):
    """A "harness" whose package is pip itself: installable with no index."""

    name = "pip-probe"
    package = "pip"
    version = bundled_pip()
    installer = "pip"
    executable = "pip"
    wire_format = "chat"
    ca_vars = ("SSL_CERT_FILE",)
    timeout_s = 30.0


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    return tmp_path / "tools"


def test_a_venv_left_without_pip_by_a_stopped_install_is_made_afresh(tools: Path) -> None:
    spec = PipProbe()
    where = install_dir(spec, tools)
    # what Ctrl-C during `python -m venv` leaves: bin/python there, pip not yet, no stamp
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(where)], check=True)
    assert (where / "bin" / "python").exists() and not (where / "bin" / "pip").exists()
    done = install(spec, tools)
    assert not done.cached and done.executable == executable_path(spec, tools) and done.executable.exists()
    assert (where / STAMP).read_text() == spec.pin


def test_a_stamped_install_is_reused_and_a_changed_pin_reinstalls(tools: Path) -> None:
    spec = PipProbe()
    first = install(spec, tools)
    marker = install_dir(spec, tools) / "marker"
    marker.write_text("kept while the stamp matches")
    again = install(spec, tools)
    assert not first.cached and again.cached and marker.exists()
    (install_dir(spec, tools) / STAMP).write_text("pip==0.0")  # another pin was installed here before
    assert not install(spec, tools).cached and not marker.exists()

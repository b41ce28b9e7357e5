"""benchmarks/gpu_smoke.py on a CPU machine: ``--dry-run`` prints the plan without torch or a GPU, and without CUDA
the script exits 2 with a message before it starts anything. (The smoke itself needs a GPU: docs/gpu.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tasks.rewards import EpisodeOutcome, load_reward_fn

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.py"
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_smoke  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_the_plan_and_exits_0(tmp_path: Path) -> None:
    done = run("--dry-run", "--model", "/models/qwen3b", "--harness", "mini-swe-agent", "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines[1:5]] == ["1", "2", "3", "4"]
    assert "--model /models/qwen3b" in lines[1] and "mean |diff| <= 0.05" in lines[2]
    assert "constrained harness: not bounded" in lines[3]  # mini-swe-agent's forced frames make the diff large
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def test_without_cuda_it_exits_2_with_a_message(tmp_path: Path) -> None:
    done = run("--out", str(tmp_path / "o"))  # this machine has no GPU (the proxy env has no torch at all)
    assert done.returncode == 2
    assert "gpu_smoke: needs a CUDA GPU:" in done.stderr
    assert not (tmp_path / "o").exists()


def fake_torch(available: bool) -> ModuleType:
    module = ModuleType("torch")
    module.cuda = SimpleNamespace(is_available=lambda: available)  # type: ignore[attr-defined]
    return module


def test_cuda_check_with_torch_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    assert gpu_smoke.cuda_problem() == "no CUDA device is visible to torch (torch.cuda.is_available() is False)"
    assert gpu_smoke.main(["--out", str(tmp_path / "o")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "o").exists()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True))
    assert gpu_smoke.cuda_problem() is None


def test_the_smoke_reward_loads_by_its_spec() -> None:
    fn = load_reward_fn("benchmarks.gpu_smoke:noisy_reward")  # what the collect subprocess imports
    outcome = EpisodeOutcome("t", "pi", None, False, 0, 0)
    rewards = {fn(outcome).reward for _ in range(5)}
    assert len(rewards) > 1 and all(0.0 <= r < 1.0 for r in rewards)  # random: groups always have variance

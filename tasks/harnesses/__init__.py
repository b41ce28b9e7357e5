"""Real coding-agent harnesses, pinned, installed on demand and run unmodified through the capture proxy.

``HARNESSES`` maps each adapter's name to its (stateless) spec; ``install`` and ``run_harness`` do the work (see
``base``, ``install`` and ``runner`` for the contracts, one module per harness for what differs).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tasks.harnesses.aider import Aider
from tasks.harnesses.base import HarnessRun, HarnessSpec, WireFormat
from tasks.harnesses.claude_code import ClaudeCode
from tasks.harnesses.codex import Codex
from tasks.harnesses.gemini_cli import GeminiCli
from tasks.harnesses.hermes import Hermes
from tasks.harnesses.install import Installed, install
from tasks.harnesses.kilo import Kilo
from tasks.harnesses.mini_swe_agent import MiniSweAgent
from tasks.harnesses.opencode import OpenCode
from tasks.harnesses.pi import Pi
from tasks.harnesses.qwen_code import QwenCode
from tasks.harnesses.runner import run_executable, run_harness

HARNESSES: Mapping[str, HarnessSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ClaudeCode(),
            Codex(),
            GeminiCli(),
            Pi(),
            MiniSweAgent(),
            OpenCode(),
            QwenCode(),
            Hermes(),
            Kilo(),
            Aider(),
        )
    }
)

__all__ = [
    "HARNESSES",
    "HarnessRun",
    "HarnessSpec",
    "Installed",
    "WireFormat",
    "install",
    "run_executable",
    "run_harness",
]

"""Kilo CLI (``@kilocode/cli``, an OpenCode fork, a Bun binary shipped through npm) in ``run`` mode with its
Anthropic provider.

It speaks Anthropic Messages to api.anthropic.com and honours ``HTTPS_PROXY`` and ``NODE_EXTRA_CA_CERTS``. Its
model catalogue lives on a host the proxy passes through, unreachable here, so the fetch is switched off and the
model named on the command line. Auto-compaction is off: with a model whose context a prompt overflows it reports
the vendor's context-length error once instead of compacting and retrying.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tasks.harnesses.base import HarnessSpec

# The output limit keeps a small CPU-served model from sampling to the end of its context on every call.
MODEL_LIMIT = {"claude-sonnet-4-5": {"limit": {"context": 200000, "output": 64}}}
CONFIG = {
    "$schema": "https://kilo.ai/config.json",
    "autoupdate": False,
    "share": "disabled",
    "provider": {"anthropic": {"models": MODEL_LIMIT}},
}


@dataclass(frozen=True)
class Kilo(HarnessSpec):
    name = "kilo"
    package = "@kilocode/cli"
    version = "7.7.7"
    installer = "npm"
    executable = "kilo"
    wire_format = "anthropic"
    ca_vars = ("NODE_EXTRA_CA_CERTS",)
    # its ~12.5k-token first prompt costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 480.0
    model: ClassVar[str] = "anthropic/claude-sonnet-4-5"

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".config/kilo/kilo.json": json.dumps(CONFIG, indent=2)}

    def env(self) -> Mapping[str, str]:
        return {
            "ANTHROPIC_API_KEY": "sk-ant-harnessrl-dummy",
            "KILO_DISABLE_MODELS_FETCH": "1",
            "KILO_DISABLE_AUTOCOMPACT": "1",
        }

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "run", "-m", self.model, instruction]

"""OpenCode (``opencode-ai``, a Bun binary shipped through npm) in ``run`` mode with its Anthropic provider.

It speaks Anthropic Messages to api.anthropic.com and honours ``HTTPS_PROXY`` and ``NODE_EXTRA_CA_CERTS``. Its
model catalogue lives on a host the proxy passes through, unreachable here, so the fetch is switched off and the
model named on the command line.
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
    "$schema": "https://opencode.ai/config.json",
    "autoupdate": False,
    "share": "disabled",
    "provider": {"anthropic": {"models": MODEL_LIMIT}},
}


@dataclass(frozen=True)
class OpenCode(HarnessSpec):
    name = "opencode"
    package = "opencode-ai"
    version = "1.18.33"
    installer = "npm"
    executable = "opencode"
    wire_format = "anthropic"
    ca_vars = ("NODE_EXTRA_CA_CERTS",)
    # its ~7.6k-token prefill on a loaded 2-core CPU engine alone has taken ~170 s
    timeout_s = 420.0
    model: ClassVar[str] = "anthropic/claude-sonnet-4-5"

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".config/opencode/opencode.json": json.dumps(CONFIG, indent=2)}

    def env(self) -> Mapping[str, str]:
        return {"ANTHROPIC_API_KEY": "sk-ant-harnessrl-dummy", "OPENCODE_DISABLE_MODELS_FETCH": "1"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "run", "-m", self.model, instruction]

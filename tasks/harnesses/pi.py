"""Pi (``@mariozechner/pi-coding-agent``) in print mode with its built-in Anthropic provider.

Pi speaks all four wire formats; this adapter uses Anthropic Messages to api.anthropic.com. It honours
``HTTPS_PROXY`` (it installs an undici proxy agent itself) and ``NODE_EXTRA_CA_CERTS``; ``PI_OFFLINE=1`` stops its
start-up network calls. Its prompt (4 tools, a short system prompt) fits the default model's context, so the model
really samples; ``~/.pi/agent/models.json`` caps the model's output (Pi asks for 32,000 tokens, which a small
CPU-served model may spend minutes filling).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

MODEL = "claude-opus-4-7"
MODELS = {"providers": {"anthropic": {"modelOverrides": {MODEL: {"maxTokens": 256}}}}}


@dataclass(frozen=True)
class Pi(HarnessSpec):
    name = "pi"
    package = "@mariozechner/pi-coding-agent"
    version = "0.73.1"
    installer = "npm"
    executable = "pi"
    wire_format = "anthropic"
    ca_vars = ("NODE_EXTRA_CA_CERTS",)
    timeout_s = 240.0

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".pi/agent/models.json": json.dumps(MODELS, indent=2)}

    def env(self) -> Mapping[str, str]:
        return {"ANTHROPIC_API_KEY": "sk-ant-harnessrl-dummy", "PI_OFFLINE": "1"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-p", "--model", f"anthropic/{MODEL}", instruction]

"""Gemini CLI (``@google/gemini-cli``) in ``-p`` mode.

It speaks the Gemini API to generativelanguage.googleapis.com and honours ``HTTPS_PROXY`` and
``NODE_EXTRA_CA_CERTS``. ``~/.gemini/settings.json`` selects API-key auth (without it ``-p`` refuses to start) and
turns usage statistics off. ``--yolo`` lets it run its shell and file tools unasked. An explicit ``-m`` skips the
model router, whose classifier call wants JSON a small model does not produce (the CLI would retry it with backoff
for about 100 s). Its requests name no output limit, so its proxy caps answers that give none
(``harnessrl_default_max_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tasks.harnesses.base import HarnessSpec

SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False}}


@dataclass(frozen=True)
class GeminiCli(HarnessSpec):
    name = "gemini-cli"
    package = "@google/gemini-cli"
    version = "0.61.0"
    installer = "npm"
    executable = "gemini"
    wire_format = "gemini"
    ca_vars = ("NODE_EXTRA_CA_CERTS",)
    # its first prompt (~8-10k tokens) costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 420.0
    proxy_options = ("harnessrl_default_max_tokens=256",)
    model: ClassVar[str] = "gemini-2.5-flash"

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".gemini/settings.json": json.dumps(SETTINGS, indent=2)}

    def env(self) -> Mapping[str, str]:
        return {"GEMINI_API_KEY": "harnessrl-dummy", "GEMINI_CLI_TRUST_WORKSPACE": "true"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-p", instruction, "--yolo", "-m", self.model]

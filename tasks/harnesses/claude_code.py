"""Claude Code (``@anthropic-ai/claude-code``, a native binary shipped through npm) in print mode.

It speaks Anthropic Messages to api.anthropic.com, honours ``HTTPS_PROXY`` and ``NODE_EXTRA_CA_CERTS`` (and
``SSL_CERT_FILE``), and takes the dummy ``ANTHROPIC_API_KEY`` without asking in ``-p`` mode. Running as root it
refuses ``--dangerously-skip-permissions``, so the tools it may use unasked are listed with ``--allowedTools``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec


@dataclass(frozen=True)
class ClaudeCode(HarnessSpec):
    name = "claude-code"
    package = "@anthropic-ai/claude-code"
    version = "2.1.197"
    installer = "npm"
    executable = "claude"
    wire_format = "anthropic"
    ca_vars = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE")
    timeout_s = 180.0

    def env(self) -> Mapping[str, str]:
        return {"ANTHROPIC_API_KEY": "sk-ant-harnessrl-dummy", "DISABLE_AUTOUPDATER": "1"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-p", instruction, "--allowedTools", "Bash,Read,Write,Edit"]

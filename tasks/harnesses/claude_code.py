"""Claude Code (``@anthropic-ai/claude-code``, a native binary shipped through npm) in print mode.

It speaks Anthropic Messages to api.anthropic.com, honours ``HTTPS_PROXY`` and ``NODE_EXTRA_CA_CERTS`` (and
``SSL_CERT_FILE``), and takes the dummy ``ANTHROPIC_API_KEY`` without asking in ``-p`` mode. Running as root it
refuses ``--dangerously-skip-permissions``, so the tools it may use unasked are listed with ``--allowedTools``.
``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` caps each answer (it asks for 64,000 tokens, which a small CPU-served model may
spend minutes filling).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

MAX_OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class ClaudeCode(HarnessSpec):
    name = "claude-code"
    package = "@anthropic-ai/claude-code"
    version = "2.1.197"
    installer = "npm"
    executable = "claude"
    wire_format = "anthropic"
    ca_vars = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE")
    # its ~13k-token first prompt costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 480.0

    def env(self) -> Mapping[str, str]:
        return {
            "ANTHROPIC_API_KEY": "sk-ant-api03-harnessrl-dummy",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
        }

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-p", instruction, "--allowedTools", "Bash,Read,Write,Edit"]

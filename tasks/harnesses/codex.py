"""Codex CLI (``@openai/codex``, a Rust binary shipped through npm) in ``exec`` mode with its built-in provider.

It speaks OpenAI Responses to api.openai.com. It first tries a WebSocket upgrade on ``/v1/responses``; the proxy
answers 426 and Codex falls back to HTTPS SSE at once. It honours ``HTTPS_PROXY``, ``CODEX_CA_CERTIFICATE`` and
``SSL_CERT_FILE``, and reads the dummy key from ``CODEX_API_KEY``. Its requests name no output limit, so its proxy
caps answers that give none (``harnessrl_default_max_tokens``; a small CPU-served model would otherwise sample
1,024 tokens per call).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec


@dataclass(frozen=True)
class Codex(HarnessSpec):
    name = "codex"
    package = "@openai/codex"
    version = "0.171.0"
    installer = "npm"
    executable = "codex"
    wire_format = "responses"
    ca_vars = ("CODEX_CA_CERTIFICATE", "SSL_CERT_FILE")
    # its ~19k-token first prompt, the largest, costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 600.0
    proxy_options = ("harnessrl_default_max_tokens=256",)

    def env(self) -> Mapping[str, str]:
        return {"CODEX_API_KEY": "sk-harnessrl-dummy"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", instruction]

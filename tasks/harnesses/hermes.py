"""hermes-agent (PyPI ``hermes-agent``) in one-shot mode with a custom OpenAI-compatible provider.

``~/.hermes/config.yaml`` points its custom provider at api.openai.com with ``api_mode: chat_completions`` (on that
host it would pick the Responses API by itself), so it speaks streaming Chat Completions through the proxy. The SDK
calls go through httpx (``SSL_CERT_FILE``) and its model-metadata probes through ``requests``
(``REQUESTS_CA_BUNDLE``), so both name the CA bundle. ``-z`` runs one instruction with approvals bypassed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

CONFIG = """\
model:
  provider: custom
  default: gpt-4o-mini
  base_url: https://api.openai.com/v1
  api_key: sk-harnessrl-dummy
  api_mode: chat_completions
"""


@dataclass(frozen=True)
class Hermes(HarnessSpec):
    name = "hermes"
    package = "hermes-agent"
    version = "0.19.0"
    installer = "pip"
    executable = "hermes"
    wire_format = "chat"
    ca_vars = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    timeout_s = 240.0

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".hermes/config.yaml": CONFIG}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-z", instruction]

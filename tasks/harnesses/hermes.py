"""hermes-agent (PyPI ``hermes-agent``) in one-shot mode with its built-in Anthropic provider.

Configured as a new user with an Anthropic API key would: ``~/.hermes/config.yaml`` selects ``provider: anthropic``
and a Claude model, and the key comes from ``ANTHROPIC_API_KEY`` (shaped like a real API key, ``sk-ant-api03-``:
other shapes make hermes impersonate Claude Code's OAuth client). It speaks streaming Anthropic Messages to
api.anthropic.com through ``HTTPS_PROXY``. The SDK calls go through httpx (``SSL_CERT_FILE``) and its
model-metadata probes through ``requests`` (``REQUESTS_CA_BUNDLE``), so both name the CA bundle. ``model.max_tokens``
caps each answer (hermes asks for 65,536 tokens, which a small CPU-served model may spend minutes filling). ``-z``
runs one instruction with approvals bypassed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

MAX_TOKENS = 256
CONFIG = f"""\
model:
  provider: anthropic
  default: claude-sonnet-4-5
  max_tokens: {MAX_TOKENS}
"""


@dataclass(frozen=True)
class Hermes(HarnessSpec):
    name = "hermes"
    package = "hermes-agent[anthropic]"  # the Anthropic provider needs the SDK from this extra
    version = "0.19.0"
    installer = "pip"
    executable = "hermes"
    wire_format = "anthropic"
    ca_vars = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    # its ~12k-token first prompt costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 480.0

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".hermes/config.yaml": CONFIG}

    def env(self) -> Mapping[str, str]:
        return {"ANTHROPIC_API_KEY": "sk-ant-api03-harnessrl-dummy"}

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-z", instruction]

"""mini-swe-agent (PyPI ``mini-swe-agent``, calls through litellm) in yolo mode with its ``openai/`` model route.

It sends non-streaming Chat Completions to api.openai.com and honours ``HTTPS_PROXY`` and ``SSL_CERT_FILE`` (not
``REQUESTS_CA_BUNDLE``). ``MSWEA_CONFIGURED`` skips its first-run setup and ``LITELLM_LOCAL_MODEL_COST_MAP`` stops
litellm fetching its price list; ``MSWEA_COST_TRACKING=ignore_errors`` keeps it going when a call reports no usage
(the proxy's budget-stop answers), which it would otherwise take for an unpriced model and abort on.

Every step must be a ``bash`` tool call, so it runs behind a proxy that forces tool calls; the proxy's call budget,
or the step limit set here, then ends the episode. ``max_tokens`` bounds each answer (litellm sends none itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tasks.harnesses.base import HarnessSpec


@dataclass(frozen=True)
class MiniSweAgent(HarnessSpec):
    name = "mini-swe-agent"
    package = "mini-swe-agent"
    version = "2.4.6"
    installer = "pip"
    executable = "mini"
    wire_format = "chat"
    ca_vars = ("SSL_CERT_FILE",)
    timeout_s = 240.0
    proxy_options = ("harnessrl_force_tool_calls=true",)
    model: ClassVar[str] = "openai/gpt-5-mini"
    # mini.yaml sets no step limit; this one ends the run even when the model never submits
    step_limit: ClassVar[int] = 5
    max_tokens: ClassVar[int] = 512

    def env(self) -> Mapping[str, str]:
        return {
            "OPENAI_API_KEY": "sk-harnessrl-dummy",
            "MSWEA_CONFIGURED": "true",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MSWEA_COST_TRACKING": "ignore_errors",
        }

    def base_url_env(self, base_url: str) -> Mapping[str, str]:
        return {"OPENAI_BASE_URL": f"{base_url}/v1"}  # litellm's openai/ route reads it

    def command(self, executable: Path, instruction: str) -> list[str]:
        limits = ["-c", f"agent.step_limit={self.step_limit}", "-c", f"model.model_kwargs.max_tokens={self.max_tokens}"]
        head = [str(executable), "-y", "--exit-immediately", "-m", self.model, "-c", "mini.yaml"]
        return [*head, *limits, "-t", instruction]

"""aider (PyPI ``aider-chat``, calls through litellm) answering one ``--message`` with its ``openai/`` model route.

It sends streaming Chat Completions to api.openai.com and honours ``HTTPS_PROXY``; the OpenAI SDK (httpx) reads
``SSL_CERT_FILE`` and its side fetches use ``requests`` (``REQUESTS_CA_BUNDLE``), so both name the CA bundle.
Aider has no tools: the model edits files by answering in an edit format, here ``whole`` (the simplest for a small
model: the file name, then the whole file in a fence), which aider applies without asking (``--yes-always``).
``~/.aider.conf.yml`` in the private HOME keeps it non-interactive and offline otherwise: no git, no repo map, no
update or release-notes checks, no analytics, and its history files outside the workspace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tasks.harnesses.base import HarnessSpec

MAX_TOKENS = 256
MODEL = "openai/gpt-4o-mini"


def _config() -> str:
    settings = {
        "model": MODEL,
        "edit-format": "whole",
        "yes-always": "true",
        "git": "false",
        "auto-commits": "false",
        "map-tokens": "0",
        "check-update": "false",
        "show-release-notes": "false",
        "analytics-disable": "true",
        "pretty": "false",
        "fancy-input": "false",
        "detect-urls": "false",
        "show-model-warnings": "false",
        "suggest-shell-commands": "false",
        # aider does not expand "~" here and would write its histories into the workspace
        "chat-history-file": "/dev/null",
        "input-history-file": "/dev/null",
    }
    return "".join(f"{k}: {v}\n" for k, v in settings.items())


@dataclass(frozen=True)
class Aider(HarnessSpec):
    name = "aider"
    package = "aider-chat"
    version = "0.86.2"
    installer = "pip"
    executable = "aider"
    wire_format = "chat"
    ca_vars = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    timeout_s = 240.0
    max_tokens: ClassVar[int] = MAX_TOKENS

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        settings = f"- name: {MODEL}\n  edit_format: whole\n  use_temperature: false\n"
        settings += f"  extra_params:\n    max_tokens: {self.max_tokens}\n"
        return {".aider.conf.yml": _config(), ".aider.model.settings.yml": settings}

    def env(self) -> Mapping[str, str]:
        return {"OPENAI_API_KEY": "sk-harnessrl-dummy", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def base_url_env(self, base_url: str) -> Mapping[str, str]:
        return {"OPENAI_API_BASE": f"{base_url}/v1"}  # aider's own variable, passed on to litellm

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "--message", instruction]

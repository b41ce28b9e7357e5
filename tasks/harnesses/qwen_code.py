"""Qwen Code (``@qwen-code/qwen-code``) in ``-p`` mode with its OpenAI-compatible auth.

It speaks Chat Completions (streaming) to the base URL in ``OPENAI_BASE_URL``; pointed at api.openai.com it goes
through the proxy like any vendor call. It honours ``HTTPS_PROXY`` and ``NODE_EXTRA_CA_CERTS``. ``--yolo`` lets
it run its tools unasked; ``~/.qwen/settings.json`` switches usage statistics off and caps the output. After the
main turn (even a failed one) it sends a "managed memory extraction" side request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.harnesses.base import HarnessSpec

# Qwen asks for up to 8,000 tokens; a small CPU-served model would spend minutes filling that, so the output is
# capped in both places Qwen reads a cap from.
MAX_OUTPUT_TOKENS = 256
# Qwen drops a request after 120 s and retries it, but the cold prefill of its ~19k-token first prompt alone takes
# ~4 minutes on a 2-core CPU engine: every attempt would be abandoned and the episode's call budget spent on them.
REQUEST_TIMEOUT_MS = 900_000
SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "model": {"generationConfig": {"timeout": REQUEST_TIMEOUT_MS, "samplingParams": {"max_tokens": MAX_OUTPUT_TOKENS}}},
}


@dataclass(frozen=True)
class QwenCode(HarnessSpec):
    name = "qwen-code"
    package = "@qwen-code/qwen-code"
    version = "0.15.10"
    installer = "npm"
    executable = "qwen"
    wire_format = "chat"
    ca_vars = ("NODE_EXTRA_CA_CERTS",)
    # its ~19k-token first prompt, the largest, costs minutes of cold prefill on a 2-core CPU engine (docs/engine.md)
    timeout_s = 600.0

    def config_files(self, workdir: Path) -> Mapping[str, str]:
        return {".qwen/settings.json": json.dumps(SETTINGS, indent=2)}

    def env(self) -> Mapping[str, str]:
        return {
            "OPENAI_BASE_URL": "https://api.openai.com/v1",
            "OPENAI_API_KEY": "sk-harnessrl-dummy",
            "OPENAI_MODEL": "gpt-4o-mini",
            "QWEN_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
        }

    def command(self, executable: Path, instruction: str) -> list[str]:
        return [str(executable), "-p", instruction, "--yolo"]

"""What a call is sampled with: the applied sampling parameters, the per-call seed, and the test-only forced tool call.

Contract
--------
* :meth:`SamplingPolicy.apply` turns a request's sampling into what the engine gets. By default top_p/top_k/min_p and
  the penalties are forced neutral, so the recorded logprobs are those of the distribution actually sampled (at the
  applied temperature). Stop strings are never applied (the record must hold exactly what was sampled).
  ``max_tokens`` is bounded by the room left in the context and by ``max_tokens_cap``.
* :meth:`SamplingPolicy.call_seed`: a call's seed derived from the base seed, the session and the call index.
* :func:`engine_sampling`: the applied values the engine request takes.
* :func:`forced_tool_call`: a regex constraint that makes the model call the request's first function tool.

Pure functions of their inputs; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from addon.engine.client import Regex
from converters.canonical import ModelRequest


@dataclass(frozen=True)
class SamplingPolicy:
    temperature: float | None = None  # None: the request's temperature, else 1.0
    default_max_tokens: int = 1024
    neutral: bool = True  # force top_p/top_k/min_p/penalties neutral
    seed: int | None = None  # base of the per-call seeds of calls whose request gives none (reproducible collection)
    max_tokens_cap: int | None = None  # no call samples more (whatever it asks); recorded as applied

    def call_seed(self, session_id: str, call_index: int) -> int | None:
        """The seed of one call: derived from the base seed, the session and the call index, so that a rerun samples
        the same tokens while the G rollouts of a group (different sessions) still differ, as GRPO needs."""
        if self.seed is None:
            return None
        digest = hashlib.sha256(f"{self.seed}:{session_id}:{call_index}".encode()).digest()
        return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF

    def apply(
        self, request: ModelRequest, prompt_len: int, max_model_len: int, session_id: str = "", call_index: int = 0
    ) -> dict[str, Any]:
        s = request.sampling
        room = max_model_len - prompt_len
        temperature = self.temperature if self.temperature is not None else s.temperature
        applied: dict[str, Any] = {
            "temperature": 1.0 if temperature is None else temperature,
            "max_tokens": max(1, min(s.max_tokens or self.default_max_tokens, room, self.max_tokens_cap or room)),
            # Stop strings are not applied: vLLM would cut the text but not say which sampled ids made the match,
            # and the record must hold exactly what was sampled. The requested ones stay in sampling_requested.
            "stop": [],
            "seed": s.seed if s.seed is not None else self.call_seed(session_id, call_index),
        }
        if self.neutral:
            applied |= {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        else:
            applied |= {"top_p": s.top_p or 1.0, "top_k": s.top_k or 0, "min_p": s.min_p or 0.0}
            applied |= {"presence_penalty": s.presence_penalty or 0.0, "frequency_penalty": s.frequency_penalty or 0.0}
        return applied


def engine_sampling(applied: Mapping[str, Any]) -> dict[str, Any]:
    return {k: applied[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed") if k in applied}


def forced_tool_call(request: ModelRequest) -> Regex | None:
    """Test-only decoding constraint: the model must emit one call to the request's first function tool, in the
    default parser's ``<tool_call>`` form, with a short string for each required string argument. Lets a 135M model
    exercise the whole tool loop through real harnesses."""
    tool = next((t for t in request.tools if t.kind == "function"), None)
    if tool is None:
        return None
    props = (tool.parameters or {}).get("properties", {})
    required = [n for n in (tool.parameters or {}).get("required", []) if props.get(n, {}).get("type") == "string"]
    args = ", ".join(f'"{re.escape(n)}": "[a-z][a-z0-9 ._-]{{0,24}}"' for n in required)
    name = re.escape(json.dumps(tool.name))
    return Regex(rf'<tool_call>\{{"name": {name}, "arguments": \{{{args}\}}\}}</tool_call>')

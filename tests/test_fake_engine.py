"""benchmarks/fake_engine.py: the FAKE engine answers the completions API exactly as addon.engine.client expects
(token ids + one logprob each, vLLM's stream shape, usage, [DONE]), paces tokens, injects faults, and its direct
vendor routes stream each format's own shape."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import msgspec
import pytest
from aiohttp.test_utils import TestServer

from addon.engine.client import (
    ContextTooLong,
    EngineClient,
    EngineError,
    EngineUnavailable,
    GenerationRequest,
)
from addon.generation.parser import OutputParser
from benchmarks.fake_engine import FakeEngine, Faults, Pace, count_ids
from benchmarks.sessions import FORMATS, decode_reply, path_for
from converters.canonical import ToolCallStarted


@pytest.fixture
async def served(smollm2_tokenizer_dir: Path) -> AsyncIterator[tuple[FakeEngine, str]]:
    engine = FakeEngine.build(smollm2_tokenizer_dir, tokens=40, max_model_len=4096)
    server = TestServer(engine.app())
    await server.start_server()
    try:
        yield engine, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


async def test_streamed_answer_is_real_tokens_with_a_tool_call_and_end_of_turn(served, smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    engine, url = served
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    async with EngineClient(url) as client:
        result = await client.stream_result(GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=500))
        whole = await client.generate(GenerationRequest(prompt_ids=(1, 2, 3), max_tokens=500))
    assert result.finish_reason == "stop" and result.usage.prompt_tokens == 3
    assert len(result.completion_ids) == len(result.logprobs) >= 40
    assert result.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(list(result.completion_ids[:-1])) == result.text  # the ids are the text, token for token
    assert result.completion_ids == whole.completion_ids and result.text == whole.text  # same prompt, same answer
    parser = OutputParser(allowed={"read_file": "function", "bash": "function"})
    events = parser.feed(result.text) + parser.finish("stop", result.usage)  # type: ignore[arg-type]
    assert [e.name for e in events if isinstance(e, ToolCallStarted)] in (["read_file"], ["bash"])


async def test_a_stream_interval_groups_tokens_as_vllm_does(served):
    """The first token at once, then one event per N tokens, the rest with the last: the same ids as one by one."""
    _, url = served

    async def events(interval: int | None) -> list[dict]:
        body = {"prompt": [1, 2, 3], "max_tokens": 20, "stream": True, "logprobs": 0, "return_token_ids": True}
        if interval is not None:
            body["stream_interval"] = interval
        async with httpx.AsyncClient() as http:
            raw = (await http.post(f"{url}/v1/completions", json=body)).content
        datas = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ") and line != b"data: [DONE]"]
        return [choice for d in datas for choice in json.loads(d)["choices"]]

    one_by_one, grouped = await events(None), await events(8)
    assert [len(c["token_ids"]) for c in grouped] == [1, 8, 8, 3]
    assert [len(c["token_ids"]) for c in one_by_one] == [1] * 20
    ids = [i for c in grouped for i in c["token_ids"]]
    assert ids == [i for c in one_by_one for i in c["token_ids"]]
    assert [len(c["logprobs"]["token_logprobs"]) for c in grouped] == [1, 8, 8, 3]
    assert "".join(c["text"] for c in grouped) == "".join(c["text"] for c in one_by_one)
    assert [c["finish_reason"] for c in grouped] == [None, None, None, "length"]


async def test_an_answers_events_are_encoded_once_and_every_call_gets_the_same_bytes(served):
    """As the direct routes' frames are: the engine's own JSON work is not counted as the proxy's latency."""
    engine, url = served
    body = {"prompt": [7, 8, 9], "max_tokens": 12, "stream": True, "logprobs": 0, "return_token_ids": True}
    async with httpx.AsyncClient() as http:
        first, again = [(await http.post(f"{url}/v1/completions", json=body)).content for _ in range(2)]
    assert first == again and first.endswith(b"data: [DONE]\n\n")
    assert len(engine._frames) == 1  # one answer, one length, one interval
    (((a, n, interval), frames),) = engine._frames.items()
    assert (n, interval, [i for i, _ in frames]) == (12, 1, list(range(12)))
    assert b"".join(f for _, f in frames) in first  # then the usage event and [DONE]


async def test_max_tokens_cuts_with_length(served):
    _, url = served
    async with EngineClient(url) as client:
        result = await client.stream_result(GenerationRequest(prompt_ids=(5,), max_tokens=4))
    assert result.finish_reason == "length" and len(result.completion_ids) == 4


async def test_token_rate_paces_the_stream(served):
    engine, url = served
    engine.token_rate = 400.0
    async with EngineClient(url) as client:
        t0 = time.perf_counter()
        result = await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=40))
        took = time.perf_counter() - t0
    assert took >= len(result.completion_ids) / 400.0 * 0.9


async def test_a_late_wake_up_is_not_carried_into_later_tokens():
    # a GPU engine's token clock: 20 tokens at 200/s take 100 ms from the answer's start, even when the process is
    # 50 ms late once (the tokens already due then go at once); a sleep per token would take ~150 ms
    pace = Pace(200.0)
    t0 = time.monotonic()
    time.sleep(0.05)  # the event loop blocked by other work
    took_after_block = []
    for _ in range(20):
        await pace(1)
        took_after_block.append(time.monotonic() - t0)
    assert took_after_block[8] < 0.07  # tokens 1-9 were due by 45 ms: sent without waiting
    assert 0.099 <= took_after_block[-1] < 0.14


async def test_no_rate_never_sleeps():
    pace = Pace(0.0)
    t0 = time.monotonic()
    for _ in range(1000):
        await pace(5)
    assert time.monotonic() - t0 < 0.05


async def test_models_and_context_length(served, smollm2_tokenizer_dir):
    _, url = served
    async with EngineClient(url) as client:
        (model,) = await client.models()
        assert model.root == str(smollm2_tokenizer_dir) and model.max_model_len == 4096
        assert await client.weight_version() == "0"
        with pytest.raises(ContextTooLong) as err:
            await client.generate(GenerationRequest(prompt_ids=(1,) * 5000, max_tokens=1))
    assert err.value.max_context == 4096 and err.value.prompt_tokens == 5000


@pytest.mark.parametrize("ids", [[7], [0, 49151, 12], list(range(3000))])
def test_prompt_ids_are_counted_without_decoding(ids):
    assert count_ids(msgspec.Raw(json.dumps(ids).encode())) == len(ids)
    assert count_ids(msgspec.Raw(b" [ 1 ,2,\n3 ] ")) == 3


@pytest.mark.parametrize("prompt", ["[]", '"text"', '[1, "a,b"]', "[1.5]", "[-1]", "[1e3]", "[[1, 2]]", "[null]", "{}"])
async def test_a_prompt_that_is_not_token_ids_gets_a_400(served, prompt):
    engine, url = served
    body = b'{"prompt": ' + prompt.encode() + b', "max_tokens": 4}'
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400 and engine.calls == 0


async def test_faults_status_drop_and_delay_then_healthy_again(served):
    engine, url = served
    async with EngineClient(url) as client:
        engine.faults = Faults(status=500, calls=1)
        with pytest.raises(EngineError) as err:
            await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=8))
        assert err.value.status == 500
        engine.faults = Faults(drop_after=2, calls=1)
        with pytest.raises(EngineUnavailable):
            await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=8))
        engine.faults = Faults(delay_s=0.3, calls=1)
        t0 = time.perf_counter()
        await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=2))
        assert time.perf_counter() - t0 >= 0.3
        result = await client.stream_result(GenerationRequest(prompt_ids=(1,), max_tokens=8))
    assert len(result.completion_ids) == 8 and engine.faults.calls == 0


@pytest.mark.parametrize("format", FORMATS)
async def test_direct_routes_stream_each_vendor_shape(served, format):
    _, url = served
    async with httpx.AsyncClient() as http:
        r = await http.post(url + path_for(format), content=b'{"model": "m"}')
    reply = decode_reply(format, r.content)
    assert reply.complete and reply.error is None
    assert reply.text.startswith("Let me look") and [c.name for c in reply.tool_calls] in (["read_file"], ["bash"])

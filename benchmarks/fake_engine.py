"""A FAKE engine for benchmarks and fault tests: answers vLLM's completions API (token ids in, token ids + logprobs
out, streamed) at a configurable token rate, so the proxy's own cost can be isolated. It samples nothing.

Contract
--------
* ``POST /v1/completions`` (``prompt`` = token ids, ``stream`` true or false, ``return_token_ids``, ``logprobs: 0``):
  one of a few canned answers, chosen by the prompt length (deterministic; the ids are checked and counted, not
  decoded into Python ints: :func:`count_ids`), each ``tokens`` ids long, made of the real tokenizer's ids so the
  proxy's parser sees real text: prose, then a ``<tool_call>`` to ``read_file`` or
  ``bash`` (tools every :mod:`benchmarks.sessions` session offers), then the end-of-turn id. Tokens are paced at
  ``token_rate`` tokens/s (0: no pacing) and sent one per chunk, or grouped as vLLM groups them for a request's
  ``stream_interval`` N (the first at once, then N per chunk, the rest with the last), in vLLM's exact chunk shape
  (``token_ids``, ``logprobs.token_logprobs``, a usage chunk, ``[DONE]``). Pacing keeps a clock per answer
  (:class:`Pace`): token k is due ``k / token_rate`` s after the answer starts, and a late wake-up sends what is due
  at once, as a GPU engine's token clock runs on whatever the host does. (A sleep per token, as before, stretched
  every answer by 64 wake-up lags: on this 2-core machine a proxy's CPU made the engine itself ~45 ms slower per
  answer at 32 sessions, counted as the proxy's added latency, while direct calls ran with an idle core.) Each
  answer's events are encoded once (:func:`completion_frames`), as the direct routes' frames are.
* ``GET /v1/models`` (the tokenizer folder as ``root``, ``max_model_len``), ``GET /health``, ``GET /weight_info``.
* Direct baseline: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/messages``,
  ``/v1beta/models/{m}:streamGenerateContent`` answer the same canned answer in that vendor's stream shape at the
  same pace (bytes pre-encoded by ``converters``), after only a decode of the body: an ideal vendor server, so
  *proxied minus direct* is the proxy's added latency. Every route decodes (and encodes) JSON with the same library,
  msgspec: with the standard library's, a completions call of an 8k context (11k prompt ids in, 64 events out)
  cost the engine ~3 ms against ~0.5 ms for the direct call of the same context, and ~2 ms of that was counted as
  the proxy's added latency.
* ``POST /v1/chat/completions`` with ``return_token_ids`` (OpenEnv's capture server's upstream call): vLLM's
  non-streamed chat answer with ``prompt_token_ids`` (fake ids, prefix-consistent across turns), ``token_ids`` and
  ``logprobs.content``.
* Faults (``POST /_fake/faults``, JSON :class:`Faults`): delay the first token, answer an HTTP error, drop the
  connection after k tokens, or hang — for the next ``calls`` completions (-1: all). As vLLM does, a request whose
  client went away is aborted (also while delayed or hanging) and counted as ``aborted``.
* ``GET /_fake/stats``: calls, in flight, aborted, and the engine's own view of load
  (:class:`benchmarks.load_monitor.LoadMonitor`): the event loop's worst lag, the longest accept queue seen on its
  listening socket (``/proc/net/tcp``) against its backlog, and the kernel's listen-overflow counter since start
  (system wide) — to tell a starved engine from a proxy fault.
* The CLI listens with a backlog of :data:`LISTEN_BACKLOG` (aiohttp's default of 128 overflowed under the soak's
  hundreds of sessions: the kernel drops the connects, which wait 1 s, 3 s, 7 s for SYN retransmits).

CLI: ``python benchmarks/fake_engine.py --model-dir D [--port P] [--token-rate R] [--tokens N]`` prints its URL.
:func:`spawn` starts it as a subprocess (its own process group) and returns a :class:`FakeEngineProcess`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import msgspec
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.load_monitor import LISTEN_BACKLOG, LoadMonitor  # noqa: E402
from converters import dialect_for  # noqa: E402
from converters.base import Route  # noqa: E402
from converters.canonical import (  # noqa: E402
    Finish,
    Message,
    ModelRequest,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallEnded,
    ToolCallStarted,
    Usage,
    WireFormat,
)

SERVED = "fake-engine"
_CALLS = (("read_file", "path", "src/module_{i}.py"), ("bash", "command", "pytest -x tests/test_{i}.py"))


@dataclass(frozen=True)
class Faults:
    delay_s: float = 0.0  # extra wait before the first token
    status: int = 0  # answer this HTTP status instead (0: none)
    drop_after: int = -1  # close the connection after this many tokens (-1: never)
    hang: bool = False  # accept, then never answer
    calls: int = 0  # how many completions are affected (-1: all)


@dataclass(frozen=True)
class Answer:
    ids: tuple[int, ...]  # ends with the end-of-turn id
    pieces: tuple[str, ...]  # text of each id (the end-of-turn id's is "")
    prose: str
    tool: str
    args: str

    @property
    def tool_text(self) -> str:
        return f'<tool_call>{{"name": "{self.tool}", "arguments": {self.args}}}</tool_call>'


@dataclass
class FakeEngine:
    answers: tuple[Answer, ...]
    model_dir: str
    token_rate: float = 0.0
    max_model_len: int = 262_144
    faults: Faults = field(default_factory=Faults)
    calls: int = 0
    active: int = 0
    peak_active: int = 0  # most completions in flight at once
    prompt_tokens: int = 0
    aborted: int = 0  # completions whose client went away before the answer ended
    port: int = 0  # the listening port, for the load monitor (0: not monitored)
    monitor: LoadMonitor = field(default_factory=lambda: LoadMonitor(0))
    # stream events by (answer, tokens, stream_interval): encoded once, as the direct routes' frames are
    _frames: dict[tuple[Answer, int, int], list[tuple[int, bytes]]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, model_dir: str | Path, tokens: int = 64, **kw: Any) -> FakeEngine:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        eot = tok.convert_tokens_to_ids("<|im_end|>")
        answers = tuple(_answer(tok, eot, i, tokens) for i in range(8))
        return cls(answers, str(model_dir), **kw)

    def pick(self, key: int) -> Answer:
        return self.answers[key % len(self.answers)]

    def take_fault(self) -> Faults | None:
        f = self.faults
        if f.calls == 0:
            return None
        if f.calls > 0:
            self.faults = replace(f, calls=f.calls - 1)
        return f

    async def wait(self, request: web.Request, seconds: float) -> bool:
        """Sleep ``seconds`` unless the client goes away first (then False): vLLM aborts such a request."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if request.transport is None or request.transport.is_closing():
                return False
            await asyncio.sleep(min(left, 0.05))
        return True

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        if self.port:
            self.monitor = LoadMonitor(self.port)
            app.on_startup.append(self.monitor.start)
            app.on_cleanup.append(self.monitor.stop)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/weight_info", self._weight_info)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/_fake/faults", self._set_faults)
        app.router.add_get("/_fake/stats", self._stats)
        for path, fmt in (
            ("/v1/chat/completions", "chat"),
            ("/v1/responses", "responses"),
            ("/v1/messages", "anthropic"),
            ("/v1beta/models/{model}:streamGenerateContent", "gemini"),
        ):
            app.router.add_post(path, self._direct(fmt))
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _weight_info(self, _: web.Request) -> web.Response:
        return web.json_response({"weight_version": "0"})

    async def _models(self, _: web.Request) -> web.Response:
        card = {"id": SERVED, "object": "model", "root": self.model_dir, "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _set_faults(self, request: web.Request) -> web.Response:
        self.faults = Faults(**(await request.json()))
        return web.json_response(asdict(self.faults))

    async def _stats(self, _: web.Request) -> web.Response:
        stats = {"calls": self.calls, "active": self.active, "peak_active": self.peak_active, "aborted": self.aborted}
        return web.json_response(stats | {"prompt_tokens": self.prompt_tokens} | self.monitor.snapshot())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = _read_call(await request.read())
            prompt = count_ids(body.prompt)
        except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as e:
            return _json({"error": {"message": str(e), "type": "BadRequestError", "code": 400}}, status=400)
        self.calls += 1
        self.prompt_tokens += prompt
        if prompt + 1 > self.max_model_len:
            msg = f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
            msg += f"contains {prompt} input tokens."
            return _json({"error": {"message": msg, "type": "BadRequestError", "code": 400}}, status=400)
        fault = self.take_fault()
        if fault and fault.status:
            return web.json_response({"error": {"message": "injected", "code": fault.status}}, status=fault.status)
        answer = self.pick(prompt)
        n = min(len(answer.ids), int(body.max_tokens or len(answer.ids)))
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        try:
            if fault and not await self.wait(request, 1e9 if fault.hang else fault.delay_s):
                self.aborted += 1
                return web.Response(status=499)  # nobody reads it: the client is gone
            pace = Pace(self.token_rate)  # after an injected delay: the delay is the first token's
            if not body.stream:
                await pace(n)
                return _json(_completion_body(answer, n, prompt))
            interval = max(1, int(body.stream_interval or 1))
            drop = fault.drop_after if fault else -1
            return await self._stream(request, answer, n, prompt, pace, drop, interval)
        except (ConnectionResetError, asyncio.CancelledError):  # the client went away (cancelled: when served so)
            self.aborted += 1
            raise
        finally:
            self.active -= 1

    async def _stream(
        self, request: web.Request, a: Answer, n: int, prompt: int, pace: Pace, drop: int, interval: int = 1
    ) -> web.StreamResponse:
        """vLLM's stream: with ``interval`` > 1 (its ``stream_interval``) the first token goes out at once, then one
        event per ``interval`` tokens, the rest with the last; tokens are paced one by one either way."""
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        key = (a, n, interval)
        if (frames := self._frames.get(key)) is None:
            frames = self._frames[key] = completion_frames(a, n, interval)
        k = 0
        for i in range(n):
            await pace(1)
            if i == drop:
                assert request.transport is not None
                request.transport.close()  # what a killed engine looks like to the proxy
                return resp
            if frames[k][0] == i:
                await resp.write(frames[k][1])
                k += 1
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        await resp.write(_sse({"id": "cmpl-fake", "object": "text_completion", "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _chat_with_ids(self, body: dict[str, Any]) -> web.Response:
        """vLLM's chat route with ``return_token_ids`` (what OpenEnv's capture server calls, never streamed): the
        prompt's ids (fake, but prefix-consistent from turn to turn, as the engine's own tokenisation is) and the
        sampled ids with their logprobs."""
        prompt = _fake_prompt_ids(body, {a.prose + a.tool_text: a for a in self.answers})
        self.calls += 1
        a = self.pick(len(prompt))
        await Pace(self.token_rate)(len(a.ids))
        content = [{"token": p, "logprob": -0.5, "bytes": None, "top_logprobs": []} for p in a.pieces]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": a.prose + a.tool_text},
            "logprobs": {"content": content},
            "finish_reason": "stop",
            "token_ids": list(a.ids),
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(a.ids),
            "total_tokens": len(prompt) + len(a.ids),
        }
        body = {"id": "chatcmpl-fake", "object": "chat.completion", "model": SERVED, "choices": [choice]}
        return _json(body | {"usage": usage, "prompt_token_ids": prompt})

    def _direct(self, fmt: WireFormat):
        frames = {i: _direct_frames(fmt, a) for i, a in enumerate(self.answers)}

        async def handler(request: web.Request) -> web.StreamResponse:
            raw = await request.read()
            body = _decode(raw)  # an ideal vendor server still reads the body
            if fmt == "chat" and body.get("return_token_ids"):
                return await self._chat_with_ids(body)
            self.calls += 1
            encoded = frames[len(raw) % len(self.answers)]
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            pace = Pace(self.token_rate)
            for data, tokens in encoded:
                await pace(tokens)
                if data:
                    await resp.write(data)
            await resp.write_eof()
            return resp

        return handler


class Pace:
    """One answer's token clock: ``await pace(k)`` returns when the next ``k`` tokens are due (``k / rate`` s after
    the previous ones were due, not after the previous wake-up), so a late wake-up is not carried into every later
    token; it never sleeps when ``rate`` is 0."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.due = time.monotonic()

    async def __call__(self, tokens: int) -> None:
        if self.rate <= 0 or not tokens:
            return
        self.due += tokens / self.rate
        if (left := self.due - time.monotonic()) > 0:
            await asyncio.sleep(left)


def _answer(tok: Any, eot: int, i: int, tokens: int) -> Answer:
    name, key, value = _CALLS[i % len(_CALLS)]
    args = json.dumps({key: value.format(i=i)})
    call = f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'  # Answer.tool_text
    call_ids = tok.encode(call, add_special_tokens=False)
    lead = "Let me look at this step by step."
    filler = " Checking the next part of the code now."
    prose = lead
    while len(tok.encode(prose + filler, add_special_tokens=False)) + len(call_ids) + 2 <= tokens:
        prose += filler
    prose += "\n"
    prose_ids = tok.encode(prose, add_special_tokens=False)
    ids = tuple(prose_ids + call_ids + [eot])
    pieces = tuple(tok.decode([t]) for t in ids[:-1]) + ("",)
    if "".join(pieces) != prose + call:
        raise ValueError("canned answer does not decode token by token; pick ASCII text")
    return Answer(ids, pieces, prose, name, args)


def _fake_prompt_ids(body: dict[str, Any], answers: dict[str, Answer]) -> list[int]:
    """Ids standing for a chat prompt: one id per 6 bytes of each message (an assistant turn that is one of our
    answers gets that answer's sampled ids, as a real engine's re-tokenisation mostly would), two ids of template
    per message and two of generation prompt: turn k's prompt + completion is a prefix of turn k+1's prompt."""
    ids = list(json.dumps(body.get("tools") or []).encode()[::6])
    for m in body.get("messages") or []:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        ids += [1, len(str(m.get("role")))]
        ids += list(answers[text].ids) if text in answers else list(text.encode()[::6]) + [2]
    return ids + [1, len("assistant")]


_decode = msgspec.json.decode  # every route reads its body with the same decoder (the fastest at hand)


class _CompletionCall(msgspec.Struct):
    """The fields of a completions call this engine reads (others are ignored). ``prompt`` stays raw JSON: the
    engine samples nothing, so it only counts the ids."""

    prompt: msgspec.Raw
    max_tokens: int | None = None
    stream: bool = False
    stream_interval: int | None = None


_read_call = msgspec.json.Decoder(_CompletionCall).decode
# A byte a JSON list of non-negative integers cannot hold (msgspec has checked that it is valid JSON)
_NOT_IN_IDS = (b'"', b"{", b".", b"n", b"t", b"f", b"e", b"E", b"-")


def count_ids(raw: msgspec.Raw) -> int:
    """How many ids a prompt's JSON list holds, without making them Python ints. Making them (decoding into a
    list) cost this engine 5.3 ms for 131k ids against 1.6 ms to check and count: an engine-side cost that the
    direct routes (a decode of text) do not pay, and so was counted as the proxy's added latency at 128k."""
    b = bytes(raw).strip()
    if len(b) < 3 or b[0] != ord("[") or b.find(b"[", 1) != -1 or any(c in b for c in _NOT_IN_IDS):
        raise ValueError("prompt must be a non-empty list of token ids (non-negative integers)")
    return b.count(b",") + 1


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(obj), status=status, content_type="application/json")


def _sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def completion_frames(a: Answer, n: int, interval: int) -> list[tuple[int, bytes]]:
    """The stream events of the first ``n`` tokens of ``a`` (no usage event): (the position of the event's last
    token, its bytes). Made once per answer, length and interval, as the direct routes' vendor frames are: the
    engine's own JSON work must not count as the proxy's added latency (before they were shared, it was ~0.6 ms of
    each streamed 64-token answer, on the critical path of a lone call)."""
    frames: list[tuple[int, bytes]] = []
    pending: list[int] = []  # positions not in an event yet
    for i in range(n):
        pending.append(i)
        last = i == n - 1
        if not (last or i == 0 or len(pending) >= interval):
            continue
        finish = ("stop" if a.ids[i] == a.ids[-1] and i == len(a.ids) - 1 else "length") if last else None
        choice = {
            "index": 0,
            "text": "".join(a.pieces[j] for j in pending),
            "logprobs": {
                "token_logprobs": [-0.5] * len(pending),
                "tokens": [a.pieces[j] for j in pending],
                "text_offset": [0] * len(pending),
            },
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": [a.ids[j] for j in pending],
        }
        frames.append((i, _sse({"id": "cmpl-fake", "object": "text_completion", "choices": [choice]})))
        pending = []
    return frames


def _completion_body(a: Answer, n: int, prompt: int) -> dict[str, Any]:
    finish = "stop" if n == len(a.ids) else "length"
    choice = {
        "index": 0,
        "text": "".join(a.pieces[:n]),
        "logprobs": {"token_logprobs": [-0.5] * n},
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": list(a.ids[:n]),
    }
    usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
    return {"id": "cmpl-fake", "object": "text_completion", "choices": [choice], "usage": usage}


def _direct_frames(fmt: WireFormat, a: Answer) -> list[tuple[bytes, int]]:
    """The vendor-shaped stream of answer ``a``: (bytes, tokens that frame stands for), paced like the engine."""
    route = {
        "chat": Route("chat", "/v1/chat/completions"),
        "responses": Route("responses", "/v1/responses"),
        "anthropic": Route("anthropic", "/v1/messages"),
        "gemini": Route("gemini", "/v1beta/models/m:streamGenerateContent", model="m", stream=True, sse=True),
    }[fmt]
    req = ModelRequest(fmt, "m", (Message("user", (TextPart("x"),)),), stream=True, include_usage=True)
    enc = dialect_for(fmt).stream_encoder(route, req)
    prose_tokens = _prose_count(a)
    events: list[tuple[StreamEvent, int]] = [(StreamStart("direct", "m", int(time.time()), 0), 0)]
    events += [(TextDelta(p), 1) for p in a.pieces[:prose_tokens]]
    call_tokens = len(a.ids) - prose_tokens
    events += [(ToolCallStarted(0, "call_direct", a.tool), 0), (ToolCallDelta(0, a.args), call_tokens)]
    events += [(ToolCallEnded(0), 0), (Finish("tool_calls", Usage(0, len(a.ids))), 0)]
    return [(enc.feed(e), n) for e, n in events]


def _prose_count(a: Answer) -> int:
    """How many ids make the prose (the rest is the tool call and the end-of-turn id)."""
    text = ""
    for i, piece in enumerate(a.pieces):
        if text == a.prose:
            return i
        text += piece
    return len(a.pieces)


# --------------------------------------------------------------------------------------------------- process


@dataclass
class FakeEngineProcess:
    process: subprocess.Popen
    url: str

    def faults(self, faults: Faults) -> None:
        httpx.post(f"{self.url}/_fake/faults", json=asdict(faults), timeout=10).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_fake/stats", timeout=10).json()

    def kill(self) -> None:
        """SIGKILL, as a crashed engine."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def spawn(model_dir: str | Path, port: int, *, token_rate: float = 0.0, tokens: int = 64) -> FakeEngineProcess:
    cmd = [sys.executable, str(Path(__file__)), "--model-dir", str(model_dir), "--port", str(port)]
    cmd += ["--token-rate", str(token_rate), "--tokens", str(tokens)]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake engine exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return FakeEngineProcess(proc, url)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError("fake engine not ready after 120 s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="tokenizer folder (also reported as the model root)")
    ap.add_argument("--port", type=int, default=8031)
    ap.add_argument("--token-rate", type=float, default=0.0, help="tokens/s per call (0: unpaced)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    ap.add_argument("--max-model-len", type=int, default=262_144)
    args = ap.parse_args(argv)
    engine = FakeEngine.build(
        args.model_dir, args.tokens, token_rate=args.token_rate, max_model_len=args.max_model_len, port=args.port
    )
    print(f"http://127.0.0.1:{args.port}", flush=True)
    app = engine.app()
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, backlog=LISTEN_BACKLOG)
    return 0


if __name__ == "__main__":
    sys.exit(main())

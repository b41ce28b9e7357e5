"""Async typed client for the vLLM server: token ids in, sampled token ids and their logprobs out.

Contract
--------
* Generation goes through ``POST /v1/completions`` with ``prompt`` = a list of token ids, ``return_token_ids`` and
  ``logprobs: 0`` (the sampled token's own logprob). Nothing is tokenized on the server's side of this client: the
  caller renders and tokenizes, and gets back exactly the ids vLLM sampled (including a final EOS id, which the
  ``text`` leaves out) with one logprob each. The server must run with ``--logprobs-mode processed_logprobs`` so the
  logprobs are those of the distribution actually sampled from (after temperature, top-p/k, structured outputs).
  A logprob the engine sends as ``null`` (vLLM's JSON for a non-finite value) becomes :data:`MISSING_LOGPROB`
  (NaN): the token was sampled and reaches the client; records keep the NaN and the trainer masks that token.
* :meth:`EngineClient.generate` returns one :class:`GenerationResult`; :meth:`EngineClient.stream` yields
  :class:`GenerationChunk` s, and :func:`accumulate` folds them into the same result (``stream_options.include_usage``
  makes the last chunk carry the usage).
* Weight updates (the server needs ``VLLM_SERVER_DEV_MODE=1``): :meth:`EngineClient.reload_weights` pauses, reloads
  from a safetensors folder in place (``collective_rpc`` -> the worker's ``reload_weights(weights_path=...)``),
  resets the prefix cache (cached KV blocks were computed by the old weights), sets the weight version, resumes.
  LoRA adapters hot-load with :meth:`EngineClient.load_lora_adapter` (needs ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``); select one per request with ``GenerationRequest.model``.
* ``/v1/completions`` does not report which weight version sampled a completion; :meth:`weight_version` reads the
  current one (``GET /weight_info``), so callers that need it pause/reload through this client and know it.
* Errors are one small hierarchy: :class:`EngineError` > :class:`EngineUnavailable` (connection refused/dropped),
  :class:`EngineTimeout` > :class:`EngineConnectTimeout`, :class:`BadRequest` > :class:`ContextTooLong`, and
  :class:`MalformedResponse`.

Streams (the per-call hot path) go through ``aiohttp``'s client, everything else through ``httpx``: for one
streamed call with an 8k-token prompt aiohttp's client spends 0.9 ms of CPU against httpx's 1.9 ms, 1.4 against
2.9 ms at 131k (``benchmarks/engine_client.py``, same fake engine, one process). Both libraries are in both
environments (vLLM depends on aiohttp), so the proxy env and the engine env can use this module. Neither reads
proxy settings from the environment (``HTTP_PROXY``...): the engine is reached directly.

Layout: the request/result types, errors and parsers live in :mod:`addon.engine.protocol` (sans-IO) and are
re-exported here; this module holds the I/O: line batching of the response body and the client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from addon.engine.protocol import (
    _JSON_HEADERS,
    ENGINE_FINISH_REASONS,
    MAX_ENGINE_CONNECTIONS,
    MISSING_LOGPROB,
    BadRequest,
    Choice,
    ClientTimeouts,
    ContextTooLong,
    EngineConnectTimeout,
    EngineError,
    EngineFinishReason,
    EngineTimeout,
    EngineUnavailable,
    EngineUsage,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Grammar,
    JsonSchema,
    MalformedResponse,
    ModelInfo,
    PauseMode,
    Regex,
    ReloadResult,
    StructuredOutput,
    accumulate,
    coalesce,
    completion_body,
    completion_payload,
    error_from_body,
    parse_choice,
    parse_completion,
    parse_usage,
    sse_data,
    stream_event_chunks,
)

__all__ = [  # the protocol's names, re-exported: callers import the engine API from this one module
    "BadRequest",
    "Choice",
    "ClientTimeouts",
    "ContextTooLong",
    "EngineClient",
    "EngineConnectTimeout",
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "ENGINE_FINISH_REASONS",
    "EngineFinishReason",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "Grammar",
    "JsonSchema",
    "MAX_ENGINE_CONNECTIONS",
    "MISSING_LOGPROB",
    "MalformedResponse",
    "ModelInfo",
    "PauseMode",
    "Regex",
    "ReloadResult",
    "StructuredOutput",
    "EngineUsage",
    "accumulate",
    "coalesce",
    "completion_body",
    "completion_payload",
    "error_from_body",
    "parse_choice",
    "parse_completion",
    "parse_usage",
    "sse_data",
    "stream_event_chunks",
]


async def _line_batches(parts: AsyncIterator[bytes]) -> AsyncGenerator[list[bytes], None]:
    """The body's complete lines (bytes, split on LF; a CR before it is left to :func:`sse_data`), one list per
    network read. httpx's ``aiter_lines`` decoded text and split in pure Python: ~8% of the proxy's CPU."""
    rest = b""
    async for part in parts:
        *lines, rest = (rest + part).split(b"\n")
        if lines:
            yield lines
    if rest:
        yield [rest]


# --- the client -----------------------------------------------------------------------------------------------


class EngineClient:
    """One connection pool to one vLLM server. Use as ``async with EngineClient(url) as engine: ...``."""

    def __init__(
        self,
        base_url: str,
        *,
        timeouts: ClientTimeouts | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = MAX_ENGINE_CONNECTIONS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or ClientTimeouts()
        self.max_connections = max_connections
        # ``transport`` replaces httpx's (control requests and non-streamed completions only; tests inject faults)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=httpx.Timeout(self.timeouts.control, connect=self.timeouts.connect),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            trust_env=False,
        )
        self._streams: aiohttp.ClientSession | None = None  # made on first use: aiohttp binds it to the running loop

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._streams is not None:
            await self._streams.close()
            self._streams = None

    def _stream_session(self) -> aiohttp.ClientSession:
        if self._streams is None or self._streams.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300)
            # connect: a pool slot (held by running streams) plus the TCP connection; sock_connect: the connection
            # alone (what ClientTimeouts.connect bounds); sock_read: the gap between two chunks
            timeout = aiohttp.ClientTimeout(
                total=None,
                connect=self.timeouts.generate,
                sock_connect=self.timeouts.connect,
                sock_read=self.timeouts.generate,
            )
            self._streams = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
            )
        return self._streams

    # -- transport --

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        t = httpx.Timeout(timeout or self.timeouts.control, connect=self.timeouts.connect)
        headers = _JSON_HEADERS if content is not None else None
        try:
            resp = await self._http.request(
                method, path, json=json_body, content=content, headers=headers, params=params, timeout=t
            )
        except httpx.ConnectTimeout as e:
            raise EngineConnectTimeout(f"{method} {path}: no connection within {self.timeouts.connect} s") from e
        except httpx.TimeoutException as e:
            raise EngineTimeout(f"{method} {path}: no answer within {timeout or self.timeouts.control} s") from e
        except httpx.TransportError as e:
            raise EngineUnavailable(f"{method} {self.base_url}{path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise error_from_body(resp.status_code, resp.content)
        return resp

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._request(method, path, **kw)
        try:
            return resp.json()
        except ValueError as e:
            raise MalformedResponse(f"{method} {path}: body is not JSON: {resp.text[:200]!r}") from e

    # -- generation --

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        body = await self._json(
            "POST",
            "/v1/completions",
            content=completion_body(req, stream=False),
            timeout=self.timeouts.generate,
        )
        return parse_completion(body, tuple(req.prompt_ids))

    async def stream(self, req: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Yield chunks as vLLM streams them, the events of one network read merged (:func:`coalesce`); the usage
        arrives on a last, token-less chunk."""
        body = completion_body(req, stream=True)
        url = self.base_url + "/v1/completions"
        try:
            async with self._stream_session().post(url, data=body, headers=_JSON_HEADERS) as resp:
                if resp.status >= 400:
                    raise error_from_body(resp.status, await resp.read())
                done = False
                try:
                    async for lines in _line_batches(resp.content.iter_any()):
                        batch: list[GenerationChunk] = []
                        for line in lines:
                            data = sse_data(line)
                            if data is None:
                                continue
                            if data == b"[DONE]":
                                done = True
                                break
                            try:
                                batch.extend(stream_event_chunks(data))
                            except EngineError:
                                for chunk in coalesce(batch):  # what was sampled before the error still counts
                                    yield chunk
                                raise
                        for chunk in coalesce(batch):
                            yield chunk
                        if done:
                            return
                finally:
                    if not done:  # left early (client gone, error): close, never pool, so vLLM stops sampling
                        resp.close()
        except aiohttp.ConnectionTimeoutError as e:
            # say which limit: under load a connect timeout (seconds) was reported as the 600 s chunk gap
            raise EngineConnectTimeout(f"stream: no connection within {self.timeouts.connect} s ({e})") from e
        except TimeoutError as e:  # aiohttp's SocketTimeoutError is one
            raise EngineTimeout(f"stream: no chunk within {self.timeouts.generate} s ({type(e).__name__})") from e
        except aiohttp.ClientError as e:
            raise EngineUnavailable(f"stream from {self.base_url}: {type(e).__name__}: {e}") from e
        raise MalformedResponse("the stream ended without [DONE]")

    async def stream_result(self, req: GenerationRequest) -> GenerationResult:
        """Stream, then fold: the same result :meth:`generate` gives, delivered incrementally to the server."""
        return accumulate([c async for c in self.stream(req)], tuple(req.prompt_ids))

    # -- server state --

    async def health(self) -> bool:
        """True when ``/health`` answers 200; False when refused, timing out or unhealthy (never raises)."""
        try:
            await self._request("GET", "/health", timeout=self.timeouts.connect)
        except EngineError:
            return False
        return True

    async def models(self) -> list[ModelInfo]:
        body = await self._json("GET", "/v1/models")
        try:
            return [
                ModelInfo(m["id"], m.get("root") or m["id"], m.get("max_model_len"), m.get("parent"))
                for m in body["data"]
            ]
        except (KeyError, TypeError) as e:
            raise MalformedResponse(f"/v1/models: unexpected body {str(body)[:200]}") from e

    async def weight_version(self) -> str:
        body = await self._json("GET", "/weight_info")
        if not isinstance(body, dict) or not isinstance(body.get("weight_version"), str):
            raise MalformedResponse(f"/weight_info: unexpected body {body!r}")
        return body["weight_version"]

    # -- weight updates (VLLM_SERVER_DEV_MODE=1) --

    async def pause(self, mode: PauseMode = "wait") -> None:
        await self._request("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self._request("POST", "/resume")

    async def reset_prefix_cache(self) -> None:
        body = await self._json("POST", "/reset_prefix_cache")
        if not (isinstance(body, dict) and body.get("success") is True):
            raise EngineError(f"the prefix cache could not be reset (blocks still held?): {body!r}")

    async def reload_weights(
        self, folder: str | Path, version: str | None = None, pause_mode: PauseMode = "wait"
    ) -> ReloadResult:
        """Load new weights in place from a safetensors folder with the served model's architecture.

        ``pause_mode="wait"`` lets in-flight requests finish on the old weights first, so no completion mixes two
        policies. On failure the engine is left paused (its weights may be half-loaded): fix and reload, or call
        :meth:`resume` deliberately.
        """
        started = time.monotonic()
        path = str(Path(folder).resolve())
        new_version = version if version is not None else path
        await self.pause(pause_mode)
        await self._request(
            "POST",
            "/collective_rpc",
            json_body={"method": "reload_weights", "kwargs": {"weights_path": path}},
        )
        # Cached KV blocks hold keys/values computed by the old weights; reusing them gives stale logprobs.
        await self.reset_prefix_cache()
        await self._request("POST", "/update_weight_version", json_body={"new_version": new_version})
        await self.resume()
        return ReloadResult(new_version, time.monotonic() - started)

    async def load_lora_adapter(self, name: str, folder: str | Path, replace: bool = False) -> None:
        """Hot-load a PEFT adapter folder under ``name`` (``replace`` swaps the weights of a loaded one)."""
        await self._request(
            "POST",
            "/v1/load_lora_adapter",
            json_body={"lora_name": name, "lora_path": str(Path(folder).resolve()), "load_inplace": replace},
        )

    async def unload_lora_adapter(self, name: str) -> None:
        await self._request("POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})

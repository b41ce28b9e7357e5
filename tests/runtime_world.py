"""A real capture runtime (generator, record store, tokenizer) on the FAKE engine of benchmarks/fake_engine.py,
served in this process: shared by the tests of the internal server and of the base-URL endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from mitmproxy.options import Options

from addon.serving.config import CaptureConfig, add_options
from addon.serving.runtime import Runtime
from benchmarks.fake_engine import FakeEngine


def runtime_options(engine_port: int, model_dir: Path, records: Path, **options: Any) -> CaptureConfig:
    """The capture config of an in-process runtime on the engine at ``engine_port`` (``options``: extra
    ``harnessrl_*`` settings)."""
    opts = Options()
    add_options(opts)
    opts.update(
        harnessrl_engine_url=f"http://127.0.0.1:{engine_port}",
        harnessrl_model_dir=str(model_dir),
        harnessrl_records_dir=str(records),
        harnessrl_gc_young=0,  # no gc.freeze of the whole test process (the stats test times a full collection)
        **options,
    )
    return CaptureConfig.from_options(opts)


async def start_fake_engine(tokenizer_dir: Path, *, tokens: int) -> tuple[FakeEngine, TestServer]:
    """The fake engine (``tokens`` per answer) on a test server; the caller closes the server."""
    engine = FakeEngine.build(tokenizer_dir, tokens=tokens, max_model_len=8192)
    server = TestServer(engine.app())
    await server.start_server()
    return engine, server


async def start_runtime(
    tokenizer_dir: Path, records: Path, *, tokens: int, **options: Any
) -> tuple[FakeEngine, TestServer, Runtime]:
    """The fake engine (``tokens`` per answer) on a test server, and a runtime bound to it; ``options`` are extra
    ``harnessrl_*`` settings. The caller stops the runtime, then closes the server."""
    engine, server = await start_fake_engine(tokenizer_dir, tokens=tokens)
    port = server.port
    assert port is not None
    return engine, server, await Runtime.start(runtime_options(port, tokenizer_dir, records, **options))

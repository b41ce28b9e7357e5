"""addon/serving/runtime.py: a start-up that fails part-way releases what it opened (the record store's lock, the
internal
server's port), so a proxy that cannot start exits cleanly and a retry in the same folder works.

The engine is the FAKE of benchmarks/fake_engine.py (in-process); the record store, tokenizer loading and server are
real."""

from __future__ import annotations

from pathlib import Path

import pytest

from addon.serving.runtime import Runtime
from tests.runtime_world import runtime_options, start_fake_engine, start_runtime


async def test_a_start_up_that_fails_after_the_server_started_releases_the_store_and_the_port(
    smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    # the fake engine answers, but the proxy's tokenizer folder is empty: bind fails after the server and store opened
    _, server = await start_fake_engine(smollm2_tokenizer_dir, tokens=4)
    assert server.port is not None
    try:
        with pytest.raises((OSError, ValueError)):
            await Runtime.start(runtime_options(server.port, empty, records))
    finally:
        await server.close()
    # same record folder again: the first attempt's lock is gone, so this start works
    _, server, runtime = await start_runtime(smollm2_tokenizer_dir, records, tokens=4)
    try:
        assert runtime.generator is not None and runtime.port > 0
        assert runtime.stats.snapshot()["ready"] is True  # bound: the admin stats say so
    finally:
        await runtime.stop()
        await server.close()

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


async def test_on_listening_sees_the_relay_and_the_admin_listening_before_the_tokenizer_loads(
    smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The capture addon relays tunnels from ``on_listening`` on: those that open while the tokenizer loads too."""
    import asyncio

    seen: list[tuple[bool, bool, bool]] = []

    def listening(runtime: Runtime) -> None:
        async def reachable(port: int) -> bool:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return True

        assert runtime.relay is not None
        seen.append((runtime.generator is None, runtime.relay.port > 0, runtime.server.port > 0))
        pending.append(asyncio.ensure_future(reachable(runtime.relay.port)))

    pending: list[asyncio.Future[bool]] = []
    _, server = await start_fake_engine(smollm2_tokenizer_dir, tokens=4)
    assert server.port is not None
    runtime = await Runtime.start(
        runtime_options(server.port, smollm2_tokenizer_dir, tmp_path / "records", harnessrl_relay=True),
        on_listening=listening,
    )
    try:
        assert seen == [(True, True, True)]  # not bound yet, both servers listening
        assert await pending[0] and runtime.generator is not None
    finally:
        await runtime.stop()
        await server.close()

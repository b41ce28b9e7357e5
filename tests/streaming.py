"""Test helpers shared by the converter tests: odd chunk splits and httpx transports that stream them.

``chunkings(data)`` yields the same bytes split several ways (whole, 1 byte at a time, mid-UTF-8, seeded random),
so every stream fixture is fed to the SDK parsers at odd boundaries. ``streaming_transport`` builds an
``httpx.MockTransport`` whose response body arrives in exactly those chunks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import httpx


def split_every(data: bytes, n: int) -> list[bytes]:
    return [data[i : i + n] for i in range(0, len(data), n)] or [b""]


def split_mid_utf8(data: bytes) -> list[bytes]:
    """Split inside every multi-byte UTF-8 sequence (after its lead byte), and nowhere else."""
    cuts = [i + 1 for i, b in enumerate(data) if b >= 0xC0 and i + 1 < len(data)]
    if not cuts:
        cuts = [len(data) // 2]
    out, prev = [], 0
    for c in cuts:
        out.append(data[prev:c])
        prev = c
    out.append(data[prev:])
    return [c for c in out if c]


def split_random(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 17)
        out.append(data[i : i + n])
        i += n
    return out or [b""]


def chunkings(data: bytes) -> Iterator[tuple[str, list[bytes]]]:
    """Named ways to split ``data``: whole, 1-byte, 7-byte, mid-UTF-8, two seeded random splits."""
    yield "whole", [data]
    yield "bytewise", split_every(data, 1)
    yield "7", split_every(data, 7)
    yield "mid-utf8", split_mid_utf8(data)
    yield "random-1", split_random(data, 1)
    yield "random-2", split_random(data, 2)


class _ChunkStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    def __init__(self, chunks: Sequence[bytes]) -> None:
        self._chunks = list(chunks)

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks

    async def __aiter__(self):  # type: ignore[override]
        for c in self._chunks:
            yield c


def streaming_transport(
    chunks: Sequence[bytes],
    content_type: str,
    status: int = 200,
    headers: dict[str, str] | None = None,
    on_request: Callable[[httpx.Request], None] | None = None,
) -> httpx.MockTransport:
    """A transport answering every request with ``chunks`` as the body, delivered one chunk at a time."""

    def handler(request: httpx.Request) -> httpx.Response:
        if on_request is not None:
            on_request(request)
        h = {"content-type": content_type, **(headers or {})}
        return httpx.Response(status, headers=h, stream=_ChunkStream(chunks))

    return httpx.MockTransport(handler)

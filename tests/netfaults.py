"""Network faults for the engine-client tests, made with real sockets (no transport mock can fake aiohttp's).

:func:`unreachable_port` is a loopback port whose TCP handshake never completes: a listening socket with a backlog
of 0 whose accept queue is filled and never accepted, so Linux drops further SYNs and a connect times out, as one
to a host that does not answer does.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


@contextmanager
def unreachable_port() -> Iterator[int]:
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):  # more than the queue holds (backlog 0 takes one); the rest wait in SYN-SENT
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        time.sleep(0.1)
        yield port

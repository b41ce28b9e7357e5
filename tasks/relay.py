"""A byte relay between a listening socket and a connect function; the sandbox's only way out of its network.

Contract
--------
:func:`serve` accepts connections on a listening socket and, for each, opens a second connection with ``connect``
and copies bytes both ways until both sides have closed (a half-close is passed on with ``shutdown(SHUT_WR)``).
:class:`UnixToTcp` runs it in background threads outside the sandbox: a Unix socket (a filesystem path, which
crosses network namespaces) forwarded to the proxy's TCP port. Run as a script inside the sandbox's fresh network
namespace, it first brings the loopback interface up, then listens on ``127.0.0.1:PORT`` and forwards to the Unix
socket, and touches ``READY`` once it listens::

    python relay.py PORT UNIX_SOCKET READY

So a harness inside reaches ``127.0.0.1:PORT`` (the proxy's own port number, so proxy URLs stay unchanged) and
nothing else. Stdlib only: the script runs with whatever Python started the sandbox, before any import path is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path

_CHUNK = 65536
# <linux/sockios.h> and <net/if.h>: read and set an interface's flags through a struct ifreq.
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def serve(listener: socket.socket, connect: Callable[[], socket.socket], stop: threading.Event | None = None) -> None:
    """Accept on ``listener`` until it is closed (or ``stop`` is set); relay each connection in its own threads."""
    while stop is None or not stop.is_set():
        try:
            client, _ = listener.accept()
        except OSError:  # the listener was closed: the relay is done
            return
        try:
            threading.Thread(target=_relay_pair, args=(client, connect), daemon=True).start()
        except RuntimeError:  # the interpreter is shutting down: no new threads, so no new connections
            client.close()
            return


def _relay_pair(client: socket.socket, connect: Callable[[], socket.socket]) -> None:
    try:
        upstream = connect()
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF or an error, then half-close ``dst`` so the other side sees the EOF."""
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class UnixToTcp:
    """Listen on the Unix socket ``path`` and forward each connection to ``host:port`` (background threads)."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(64)
        target = (host, port)
        self._thread = threading.Thread(
            target=serve, args=(self._listener, lambda: socket.create_connection(target)), daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        # shutdown wakes the thread blocked in accept(); close alone does not on Linux
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> UnixToTcp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def loopback_up() -> None:
    """Bring ``lo`` up (a fresh network namespace has it down), as ``ip link set lo up`` does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def main(argv: list[str]) -> int:
    port, unix_path, ready = int(argv[0]), argv[1], Path(argv[2])
    loopback_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(unix_path)
        return s

    ready.touch()
    serve(listener, connect)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

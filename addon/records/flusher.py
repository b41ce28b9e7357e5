"""A background thread that writes a record store's full buffer as a shard, off the path of the call that filled it.

Contract
--------
:class:`ShardFlusher` runs ``flush`` on its own thread after each :meth:`~ShardFlusher.request`; requests that
arrive while a flush runs make one more run, not one each. ``flush`` must be safe to call at any time (the record
store's ``_flush_if`` takes its own locks and writes nothing when the buffer is not full). A failure is logged and
counted, never raised: the rows are acknowledged already (in the fsync'd WAL) and stay in memory for the next
flush, which is where the store reports it (see :mod:`addon.records.store`). :meth:`~ShardFlusher.close` lets a
running or requested flush finish and stops the thread; ``request`` returns False after it.

Why: with the shard written by the append that filled the buffer, one call in every ``shard_rows`` waited for a
whole shard before its last event: 1,000 rows at 8k tokens are ~270 MB of Arrow data, ~0.2 s to convert and ~0.6 s
to compress, write and fsync (`benchmarks/results/round14.md`), about 16x that at 128k. The call's own record is
durable when its WAL frame is fsync'd; the shard can follow.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class ShardFlusher:
    """Runs ``flush`` on a daemon thread named ``name`` when asked (see the module docstring)."""

    def __init__(self, flush: Callable[[], None], name: str) -> None:
        self._flush = flush
        self._wake = threading.Condition()
        self._pending = False
        self._running = False
        self._closed = False
        self.runs = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self) -> bool:
        """Ask for a flush; False once closed (the caller flushes itself, or its close does)."""
        with self._wake:
            if self._closed:
                return False
            self._pending = True
            self._wake.notify()
            return True

    def close(self, timeout: float | None = None) -> None:
        """Finish a running or requested flush, then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout)

    @property
    def busy(self) -> bool:
        """A flush is requested or running."""
        return self._pending or self._running

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return  # closed, nothing asked for
                self._pending = False
                self._running = True
            try:
                self._flush()
            except Exception:  # the rows are in the WAL and in memory: the next flush retries and reports
                self.failures += 1
                log.exception("%s: background shard write failed; the rows are kept in the WAL", self._thread.name)
            finally:
                with self._wake:
                    self._running = False
                    self.runs += 1
                    self._wake.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no flush is requested or running; False on timeout."""
        with self._wake:
            return self._wake.wait_for(lambda: not (self._pending or self._running), timeout)


__all__ = ["ShardFlusher"]

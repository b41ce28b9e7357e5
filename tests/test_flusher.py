"""addon/records/flusher.py: requests coalesce, failures are logged and counted, close finishes what was asked."""

from __future__ import annotations

import logging
import threading

import pytest

from addon.records.flusher import ShardFlusher


def test_requests_during_a_flush_make_one_more_run_not_one_each() -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def flush() -> None:
        calls.append(len(calls))
        entered.set()
        assert release.wait(30)

    flusher = ShardFlusher(flush, "test-flusher")
    assert flusher.request()
    assert entered.wait(30) and flusher.busy
    for _ in range(5):
        assert flusher.request()  # all while the first run is held
    release.set()
    assert flusher.wait_idle(30)
    assert calls == [0, 1] and flusher.runs == 2 and not flusher.busy
    flusher.close()


def test_a_failure_is_logged_counted_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    outcomes = [OSError("disk full"), None]

    def flush() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    flusher = ShardFlusher(flush, "test-flusher")
    with caplog.at_level(logging.ERROR, logger="addon.records.flusher"):
        flusher.request()
        assert flusher.wait_idle(30)
        flusher.request()
        assert flusher.wait_idle(30)
    assert (flusher.failures, flusher.runs, outcomes) == (1, 2, [])
    assert "background shard write failed" in caplog.text and "disk full" in caplog.text
    flusher.close()


def test_close_finishes_a_requested_flush_and_refuses_later_requests() -> None:
    release = threading.Event()
    done: list[str] = []

    def flush() -> None:
        assert release.wait(30)
        done.append("flushed")

    flusher = ShardFlusher(flush, "test-flusher")
    flusher.request()
    closer = threading.Thread(target=flusher.close)
    closer.start()
    release.set()
    closer.join(30)
    assert not closer.is_alive() and done == ["flushed"]
    assert not flusher.request() and flusher.runs == 1


def test_close_without_requests_stops_at_once() -> None:
    flusher = ShardFlusher(lambda: None, "test-flusher")
    flusher.close(timeout=10)
    assert flusher.runs == 0 and not flusher.request()

"""benchmarks/handover_compare.py: the targets' order alternates by round; the summary takes each target's share of
its own round's direct run and gives the median over rounds; a failed shards check shows; bad arguments are
refused. (Running it needs minutes of load: it is run on demand, not here.)"""

from __future__ import annotations

import pytest

from benchmarks.handover_compare import TARGETS, Sample, main, order, summary


def test_the_order_of_the_targets_reverses_every_other_round() -> None:
    assert order(0) == TARGETS and order(1) == TARGETS[::-1] and order(2) == TARGETS


def test_the_summary_gives_the_median_share_of_each_round_s_own_direct_run() -> None:
    samples = [
        Sample(0, 192, "one port", 150.0, 200.0, 7.0, (80, 70)),
        Sample(1, 192, "one port", 180.0, 250.0, 6.0, (90, 90)),
        Sample(2, 192, "one port", 210.0, 250.0, 6.5, (100, 110)),
        Sample(0, 192, "separate proxies", 100.0, 200.0, 8.0, shards_ok=False, errors=2),
    ]
    rows = summary(samples)
    assert rows[2] == "| 192 | one port | 75% | 75 / 72 / 84 | 6.50 | 180.0 | 0 | ok |"
    assert rows[3] == "| 192 | separate proxies | 50% | 50 | 8.00 | 100.0 | 2 | FAILED |"
    assert len(rows) == 4  # no row for a target that was not run


def test_bad_arguments_are_refused_with_the_reason(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--model-dir", "x", "--procs", "1"])
    assert "--procs must be at least 2" in capsys.readouterr().err

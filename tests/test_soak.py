"""benchmarks/soak.py, short form: concurrent sessions for a few seconds through one proxy against the fake engine;
no call lost, duplicated or misattributed (checked against the replayer's own log), no error answers, memory
sampled and fitted. The long form (384 sessions x 10 min) is ``make bench``."""

from __future__ import annotations

from pathlib import Path

from benchmarks.soak import slope_per_min, soak


def test_slope_is_mib_per_minute() -> None:
    assert slope_per_min([(0.0, 100.0), (30.0, 101.0), (60.0, 102.0)]) == 2.0
    assert slope_per_min([(0.0, 100.0)]) == 0.0
    assert abs(slope_per_min([(0.0, 5.0), (10.0, 5.0), (20.0, 5.0)])) < 1e-9


def test_short_soak_loses_nothing(smollm2_tokenizer_dir: Path, tmp_path: Path) -> None:
    result = soak(
        smollm2_tokenizer_dir, sessions=12, seconds=8.0, work=tmp_path, token_rate=200, sample_s=1.0, scale=0.2
    )
    assert result.complete >= 12 and result.errors == {}, result
    assert result.verdict.ok and result.verdict.seen_complete == result.complete, result.verdict
    assert result.verdict.rows >= result.complete  # every completed call is in a shard (and nothing else failed)
    assert result.samples >= 3 and result.rss_end_mib > 50  # the mitmdump process was sampled while it ran
    assert result.ok

"""tasks/episodes.py: call statistics from call records, the episode Parquet round trip, the summary, the output
files and the progress line."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from addon.records.schema import TurnTokens, to_batch
from tasks.episodes import (
    ALL,
    EPISODE_SCHEMA,
    EPISODE_SCHEMA_VERSION_KEY,
    CallStats,
    EpisodeRecord,
    Progress,
    call_stats,
    judge,
    read_episodes,
    rejoin,
    summarize,
    summary_csv,
    summary_figures,
    summary_markdown,
    task_markdown,
    write_episodes,
    write_outputs,
)
from tasks.figures import mean_interval, wilson_interval
from tasks.rewards import RewardConfig, Rewarder
from tests.record_factory import make_record


def chain(session: str = "s") -> list:
    """Three calls: a root, a spliced child (prompt extends root prompt + completion), and a fork."""
    root = make_record(0, session_id=session, prompt_len=5, completion_len=3, auxiliary=False, auxiliary_reason=None,
                       budget_stop=None, incomplete=False, tool_call_names=("bash",), policy_version=3)  # fmt: skip
    ids = root.tokens.prompt_ids + root.tokens.completion_ids
    child = make_record(1, session_id=session, auxiliary=False, auxiliary_reason=None, budget_stop=None,
                        incomplete=False, parent_call_id=root.call_id, fork_reason=None, prompt_reused_tokens=8,
                        tokens=TurnTokens((*ids, 1, 2), (7, 8), (-0.1, -0.2)),
                        tool_call_names=("bash", "read"), policy_version=4)  # fmt: skip
    fork = make_record(2, session_id=session, prompt_len=4, completion_len=0, auxiliary=False, auxiliary_reason=None,
                       incomplete=False, parent_call_id=child.call_id, fork_reason="history_rewritten",
                       prompt_reused_tokens=0, tool_call_names=(), policy_version=4, budget_stop="max_calls=2",
                       error="budget")  # fmt: skip
    return [fork, root, child]  # out of order on purpose


def test_call_stats_counts_tools_tokens_splices_forks_and_budget_stop() -> None:
    stats = call_stats(chain())
    assert stats.calls == 3 and stats.sampled_calls == 2 and stats.error_calls == 1
    assert stats.tool_call_names == ("bash", "bash", "read") and stats.tool_call_count == 3
    assert stats.prompt_tokens == 5 + 10 + 4 and stats.completion_tokens == 3 + 2
    assert stats.policy_versions == (3, 4)
    assert stats.budget_stop == "max_calls=2"
    assert (stats.splices, stats.forks, stats.broken_edges) == (1, 1, 0)
    assert stats.session_grade in ("ok", "warn")


def test_call_stats_counts_a_malformed_tool_call_as_sampled_not_as_an_error() -> None:
    root, child = sorted(chain(), key=lambda r: r.call_index)[:2]
    stats = call_stats([root, replace(child, error="malformed_tool_calls=1")])
    assert (stats.calls, stats.sampled_calls, stats.error_calls) == (2, 2, 0)
    stats = call_stats([root, replace(child, error="engine_error", incomplete=True)])
    assert (stats.calls, stats.sampled_calls, stats.error_calls) == (2, 1, 1)


def test_call_stats_of_no_records_is_empty() -> None:
    assert call_stats([]) == CallStats()


def make_episode(harness: str = "pi", task: str = "t1", g: int = 0, *, passed: bool = True, reward: float = 1.0,
                 tools: int = 2, calls: int = 3, crashed: bool = False,
                 error: str | None = None) -> EpisodeRecord:  # fmt: skip
    stats = CallStats(calls=calls, sampled_calls=calls, tool_call_count=tools, tool_call_names=("bash",) * tools,
                      policy_versions=(0,), prompt_tokens=100, completion_tokens=20, splices=calls - 1,
                      session_grade="ok", budget_stop=None)  # fmt: skip
    return EpisodeRecord(
        run_id="r",
        session_id=f"r-{task}-{harness}-{g}",
        task_id=task,
        task_version="1.0",
        harness=harness,
        harness_version="0.73.1",
        group_id=f"{task}/{harness}",
        task_group_id=task,
        sample_index=g,
        started_at=datetime(2026, 12, 2, 14, 0, tzinfo=UTC),
        reward=reward,
        reward_components={"correct": reward},
        verifier_passed=passed,
        verifier_reward=1.0 if passed else 0.0,
        verifier_status="ok",
        verifier_output_tail="FAIL: x" if not passed else "",
        exit_status=0 if not crashed else 1,
        timed_out=False,
        crashed=crashed,
        wall_s=12.5,
        harness_s=11.0,
        stderr_tail="warn",
        stats=stats,
        error=error,
    )


def test_episode_parquet_round_trip_keeps_every_field(tmp_path: Path) -> None:
    eps = [make_episode(), make_episode("mini-swe-agent", g=1, passed=False, reward=0.0, error="OSError: boom")]
    eps.append(replace(make_episode(g=2), verifier_reward=None, verifier_status=None, exit_status=None,
                       stats=replace(eps[0].stats, budget_stop="max_calls=8", session_grade=None)))  # fmt: skip
    path = tmp_path / "out" / "episodes.parquet"
    assert write_episodes(path, eps) == 3
    assert not path.with_name("episodes.parquet.tmp").exists()
    table = pq.read_table(path)
    assert table.schema.equals(EPISODE_SCHEMA)
    assert table.schema.metadata[EPISODE_SCHEMA_VERSION_KEY] == b"1"
    assert read_episodes(path) == eps


def test_read_episodes_rejects_another_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    write_episodes(path, [make_episode()])
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({EPISODE_SCHEMA_VERSION_KEY: b"99"}), path)
    with pytest.raises(ValueError, match="schema version"):
        read_episodes(path)


def test_write_episodes_of_nothing_writes_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "e.parquet"
    assert write_episodes(path, []) == 0
    assert read_episodes(path) == []


def test_summary_per_harness_and_overall() -> None:
    eps = [
        make_episode("pi", "t1", 0, passed=True, reward=1.0, tools=2, calls=3),
        make_episode("pi", "t1", 1, passed=False, reward=0.0, tools=0, calls=1),
        make_episode("pi", "t2", 0, passed=False, reward=0.0, tools=4, calls=5, crashed=True),
        make_episode("pi", "t2", 1, passed=False, reward=0.0, tools=1, calls=2),
        make_episode("mini", "t1", 0, passed=True, reward=1.0, tools=3, calls=3, error="x"),
    ]
    pi, mini, overall = summarize(eps)
    assert (pi.harness, pi.episodes, pi.pass_at_1, pi.mean_reward) == ("pi", 4, 0.25, 0.25)
    assert (pi.mean_tool_calls, pi.mean_calls, pi.errors) == (7 / 4, 11 / 4, 1)
    assert (pi.groups, pi.varied_groups) == (2, 1)  # t1 has rewards 1 and 0; t2 only 0
    assert (mini.episodes, mini.pass_at_1, mini.errors, mini.groups, mini.varied_groups) == (1, 1.0, 1, 1, 0)
    assert (overall.harness, overall.episodes, overall.pass_at_1, overall.errors) == (ALL, 5, 0.4, 2)
    assert overall.mean_tool_calls == 10 / 5 and overall.groups == 3
    assert summarize([]) == []


def test_summary_csv_and_markdown_carry_every_row() -> None:
    rows = summarize([make_episode("pi"), make_episode("pi", g=1, passed=False, reward=0.0)])
    parsed = list(csv.DictReader(io.StringIO(summary_csv(rows))))
    assert [r["harness"] for r in parsed] == ["pi", ALL]
    assert parsed[0]["pass_at_1"] == "0.500" and parsed[0]["episodes"] == "2"
    md = summary_markdown(rows).splitlines()
    assert md[0].startswith("| harness | episodes | pass_at_1 |") and len(md) == 4
    assert md[2].startswith("| pi | 2 | 0.500 | 0.500 |")


def test_the_per_task_table_gives_pass_rates_with_wilson_intervals() -> None:
    eps = [make_episode("pi", "t1", g, passed=g < 1, reward=float(g < 1)) for g in range(4)]
    eps += [make_episode("mini", "t1", 0, passed=False, reward=0.25)]
    lines = task_markdown(eps).splitlines()
    assert lines[0].startswith("| task | harness | passed / episodes |")
    low, high = wilson_interval(1, 4) or (0, 0)
    assert lines[2:] == [
        "| t1 | mini | 0 / 1 | 0% [0%, 79%] | 0.250 |",
        f"| t1 | pi | 1 / 4 | 25% [{low:.0%}, {high:.0%}] | 0.250 |",
    ]
    assert task_markdown([]) == ""


def test_outputs_are_written_for_a_finished_run(tmp_path: Path) -> None:
    eps = [make_episode("pi", g=0), make_episode("pi", g=1, passed=False, reward=0.0), make_episode("mini")]
    files = write_outputs(tmp_path, eps)
    assert set(files) == {"episodes", "csv", "markdown", "pass_at_1", "tool_calls"}
    assert read_episodes(files["episodes"]) == eps
    assert files["csv"].read_text().splitlines()[1].startswith("pi,2,0.500,0.500")
    assert "## Per task" in files["markdown"].read_text()
    for k in ("pass_at_1", "tool_calls"):
        image = Image.open(files[k])
        assert image.format == "PNG" and image.size[0] > 400 and image.size[1] > 200
    assert "tool_calls" not in write_outputs(tmp_path / "empty", [])  # no episodes: no charts


def test_summary_figures_show_the_summary_with_95_percent_intervals() -> None:
    eps = [make_episode("pi", "t1", g, passed=g < 1, tools=t) for g, t in enumerate((2, 4, 9))]
    eps += [make_episode("mini", "t2", passed=True, tools=5)]
    rows = {r.harness: r for r in summarize(eps)}
    figs = summary_figures(eps, "run-7")
    ax = figs["pass_at_1"].axes[0]
    title, ticks = ax.get_title(loc="left"), [t.get_text() for t in ax.get_xticklabels()]
    assert title.startswith("pass@1 per harness") and "4 episodes on 2 tasks, run run-7" in title
    assert "fraction" in ax.get_ylabel() and ticks == ["pi\n(n=3)", "mini\n(n=1)"]
    assert [b.get_height() for b in ax.patches] == [rows["pi"].pass_at_1, rows["mini"].pass_at_1]
    (errors,) = [c for c in ax.collections if len(c.get_segments()) == 2]
    assert [tuple(seg[:, 1]) for seg in errors.get_segments()] == [
        pytest.approx(wilson_interval(1, 3)),
        pytest.approx(wilson_interval(1, 1)),
    ]
    ax = figs["tool_calls"].axes[0]
    assert [b.get_height() for b in ax.patches] == [rows["pi"].mean_tool_calls, 5.0]
    low, high = mean_interval([2, 4, 9])  # type: ignore[misc]
    (errors,) = [c for c in ax.collections if len(c.get_segments()) == 2]
    assert tuple(errors.get_segments()[0][:, 1]) == (pytest.approx(max(0.0, low)), pytest.approx(high))
    assert tuple(errors.get_segments()[1][:, 1]) == (5.0, 5.0)  # one episode: no interval, a zero-length bar
    assert ax.get_ylabel() == "tool calls per episode"
    assert summary_figures([]) == {}


def test_progress_line_shows_done_pass_rate_and_eta() -> None:
    out = io.StringIO()
    p = Progress(4, out, width=8, started=100.0)
    assert "0/4" in p.line(now=100.0) and "eta ?" in p.line(now=100.0)
    p.update(make_episode(passed=True, reward=1.0))
    p.update(make_episode(passed=False, reward=0.0))
    line = p.line(now=160.0)
    assert "[####....] 2/4" in line and "pass@1 50%" in line and "reward 0.50" in line
    assert "elapsed 1m00s eta 1m00s" in line
    assert out.getvalue().count("\n") == 2  # not a terminal: one line per finished rollout


def write_shard(folder: Path, records: list) -> None:
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([to_batch(records)]), folder / "shard-00000.parquet")


def test_rejoin_recounts_from_the_final_records_and_rescores(tmp_path: Path) -> None:
    """An episode read before its last call was recorded (a time-out) gets the call, and the reward follows."""
    rewarder = Rewarder.from_config(RewardConfig("tool_shaping", on_budget_stop="score"))
    late = replace(make_episode(task="t1"), stats=CallStats(), reward=1.0, reward_components={"correct": 1.0})
    settled = make_episode(task="t2")
    calls = chain(late.session_id)
    write_shard(tmp_path / "records" / "proxy-0", calls)
    late_after, settled_after = rejoin([late, settled], tmp_path / "records", rewarder)
    assert late_after.stats == call_stats(calls) and late_after.stats.tool_call_count == 3
    assert late_after.reward == pytest.approx(1 + 0.1 * 15 / 18)  # the tool bonus now counts 3 calls
    assert settled_after.stats.calls == 0  # it has no records: recounted to zero tool calls, so no bonus
    assert settled_after.reward_components == {"correct": 1.0, "tool_bonus": 0.0}
    assert rejoin([late], tmp_path / "empty", rewarder)[0].stats == CallStats()


def test_judge_counts_time_outs_as_budget_stops_and_nonzero_exits_as_crashes() -> None:
    stats = CallStats(tool_call_count=2)
    ok = judge("t", "pi", (1.0, True), (0, False), stats)
    assert (ok.verifier_reward, ok.verifier_passed, ok.tool_call_count, ok.crashed, ok.budget_stop) == (
        1.0, True, 2, False, False)  # fmt: skip
    assert judge("t", "pi", (0.0, False), (None, True), stats).budget_stop
    assert judge("t", "pi", (0.0, False), (2, False), stats).crashed
    stopped = judge("t", "pi", (0.0, False), (2, False), CallStats(budget_stop="max_calls=8"))
    assert stopped.budget_stop and not stopped.crashed
    never = judge("t", "pi", (None, False), None, stats)
    assert never.crashed and never.exit_status is None and never.verifier_reward is None

"""trainer/report.py: plots every numeric key per phase from a crafted (partial) metrics.jsonl and renders one
self-contained HTML page with valid PNGs, the last values, the eval comparison and the config."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from PIL import Image

from tasks.figures import PALETTE
from trainer import report


def png_size(data: bytes) -> tuple[int, int]:
    """Decode a PNG fully; its width and height."""
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()
    return image.size


def rows() -> list[dict]:
    out: list[dict] = []
    step = 0
    for it in (1, 2, 3):
        out.append({"iteration": it, "phase": "collect", "step": None, "wall_s": 60.0 + it, "reward_mean": 0.1 * it,
                    "reward_std": 0.05,
                    "pass_at_1": 0.2 * it, "pass_at_1/pi": 0.1 * it, "pass_at_1/mini-swe-agent": 0.3 * it,
                    "episodes": 8})  # fmt: skip
        for _ in range(2):
            step += 1
            out.append({"iteration": it, "phase": "train", "step": step, "wall_s": 5.0, "loss": 1.0 / step,
                        "kl": 0.01 * step, "a_new_metric_t1_adds": 7.5, "note": "text is ignored"})  # fmt: skip
        out.append({"iteration": it, "phase": "sync", "step": None, "wall_s": 0.5, "seconds": 0.4 + it / 10,
                    "policy_version": it})  # fmt: skip
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "train" / "r1"
    run.mkdir(parents=True)
    lines = [json.dumps(r) for r in rows()]
    # an interrupted run: the last write was cut short
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"iteration": 4, "phase": "coll')
    (run / "config.json").write_text(json.dumps({"learning_rate": 1e-6, "harnesses": ["pi"]}))
    (run / "state.json").write_text(json.dumps({"iteration": 3, "policy_version": 3, "checkpoint": "ckpt"}))
    return run


def test_charts_cover_every_numeric_key_per_phase() -> None:
    charts = {(c.phase, c.name): c for c in report.charts(rows())}
    assert set(charts) == {
        ("collect", "wall_s"), ("collect", "reward_mean"), ("collect", "reward_std"), ("collect", "pass_at_1"),
        ("collect", "episodes"),
        ("train", "wall_s"), ("train", "loss"), ("train", "kl"), ("train", "a_new_metric_t1_adds"),
        ("sync", "wall_s"), ("sync", "seconds"), ("sync", "policy_version"),
    }  # fmt: skip
    pass1 = charts[("collect", "pass_at_1")]
    assert pass1.x_label == "iteration"
    assert [s.label for s in pass1.series] == ["all", "pi", "mini-swe-agent"]
    assert pass1.series[1].points == ((1.0, 0.1), (2.0, 0.2), (3.0, pytest.approx(0.3)))
    assert not any(s.band for s in pass1.series)
    loss = charts[("train", "loss")]
    assert loss.x_label == "step" and [x for x, _ in loss.series[0].points] == [1, 2, 3, 4, 5, 6]
    (reward,) = charts[("collect", "reward_mean")].series  # the mean gets a band of ± reward_std
    assert [x for x, _, _ in reward.band] == [1.0, 2.0, 3.0]
    assert [v for _, lo, hi in reward.band for v in (lo, hi)] == pytest.approx([0.05, 0.15, 0.15, 0.25, 0.25, 0.35])
    assert reward.band_label == "all ± 1 reward_std"


def test_figure_titles_say_metric_axis_phase_and_run_with_units() -> None:
    charts = {(c.phase, c.name): c for c in report.charts(rows())}
    ax = report.figure(charts[("collect", "reward_mean")], "r1").axes[0]
    assert ax.get_title(loc="left") == "reward_mean per iteration (collect phase, run r1)"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("iteration", "reward_mean (reward per episode)")
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 1  # the ± std band
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    ax = report.figure(charts[("train", "loss")]).axes[0]
    assert (ax.get_title(loc="left"), ax.get_xlabel()) == ("loss per optimizer step (train phase)", "optimizer step")
    ax = report.figure(charts[("collect", "pass_at_1")]).axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["all", "pi", "mini-swe-agent"]
    assert ax.get_lines()[0].get_color() == PALETTE[0]
    labels = [report.metric_label(k) for k in ("wall_s", "tokens_per_s", "engine_seconds_max", "loss")]
    assert labels == ["wall_s (s)", "tokens_per_s (tokens/s)", "engine_seconds_max (s)", "loss"]


def test_steps_that_restart_fall_back_to_iteration() -> None:
    restarting = [{"iteration": i, "phase": "train", "step": s, "loss": 1.0} for i in (1, 2) for s in (1, 2)]
    assert report.charts(restarting)[0].x_label == "iteration"
    no_axis = [{"phase": "train", "loss": 1.0}, {"phase": "train", "loss": 2.0}]
    assert report.charts(no_axis)[0].x_label == "row"


def test_report_renders_pngs_and_a_self_contained_page(run: Path) -> None:
    eval_dir = run / "eval"
    eval_dir.mkdir()
    (eval_dir / "comparison.md").write_text(
        "Before: a. After: b.\n\n| harness | pass@1 before |\n|---|---|\n| pi | 0.250 |\n"
    )
    assert report.main([str(run)]) == 0
    out = run / "report"
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 12 and (out / "collect-pass_at_1.png") in pngs
    for png in pngs:
        width, height = png_size(png.read_bytes())
        assert width >= 400 and height >= 200
        first_colour = tuple(int(PALETTE[0][i : i + 2], 16) for i in (1, 3, 5))
        assert first_colour in {c for _, c in Image.open(png).convert("RGB").getcolors(1 << 20)}  # a line was drawn
    page = (out / "index.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 12
    png_size(base64.b64decode(embedded[0]))
    assert "1 unreadable lines skipped" in page
    assert "<td>a_new_metric_t1_adds</td><td>7.5</td>" in page
    assert "<td>pi</td><td>0.250</td>" in page  # the eval table, rendered
    assert "learning_rate" in page and "policy_version" in page
    assert 'src="http' not in page and "<script" not in page


def test_clear_errors(tmp_path: Path) -> None:
    assert report.main([str(tmp_path)]) == 2
    (tmp_path / "metrics.jsonl").write_text("garbage\n")
    with pytest.raises(ValueError, match="no metrics rows"):
        report.write_report(tmp_path)


def test_markdown_table_to_html() -> None:
    text = "Intro <b>.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nAfter.\n"
    assert report.markdown_to_html(text) == (
        "<p>Intro &lt;b&gt;.</p>\n<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>\n"
        "<p>After.</p>"
    )

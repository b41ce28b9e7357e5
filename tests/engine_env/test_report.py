"""trainer/report.py: plots every numeric key per phase from a crafted (partial) metrics.jsonl and renders one
self-contained HTML page with valid PNGs, the last values, the eval comparison and the config."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from pathlib import Path

import pytest

from trainer import report


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Decode an 8-bit RGB, filter-0 PNG (what tasks.barchart writes) into its raw rows."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert (depth, color) == (8, 2)
    raw = zlib.decompress(data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8])
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


def rows() -> list[dict]:
    out: list[dict] = []
    step = 0
    for it in (1, 2, 3):
        out.append({"iteration": it, "phase": "collect", "step": None, "wall_s": 60.0 + it, "reward_mean": 0.1 * it,
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
        ("collect", "wall_s"), ("collect", "reward_mean"), ("collect", "pass_at_1"), ("collect", "episodes"),
        ("train", "wall_s"), ("train", "loss"), ("train", "kl"), ("train", "a_new_metric_t1_adds"),
        ("sync", "wall_s"), ("sync", "seconds"), ("sync", "policy_version"),
    }  # fmt: skip
    pass1 = charts[("collect", "pass_at_1")]
    assert pass1.x_label == "iteration"
    assert [s.label for s in pass1.series] == ["all", "pi", "mini-swe-agent"]
    assert pass1.series[1].points == ((1.0, 0.1), (2.0, 0.2), (3.0, pytest.approx(0.3)))
    loss = charts[("train", "loss")]
    assert loss.x_label == "step" and [x for x, _ in loss.series[0].points] == [1, 2, 3, 4, 5, 6]


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
    assert len(pngs) == 11 and (out / "collect-pass_at_1.png") in pngs
    for png in pngs:
        width, height, raw = png_pixels(png.read_bytes())
        assert width >= 400 and height >= 200
        assert raw.count(bytes((70, 110, 180))) > 20  # the first series' colour was drawn
    page = (out / "index.html").read_text()
    embedded = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(embedded) == 11
    png_pixels(base64.b64decode(embedded[0]))
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

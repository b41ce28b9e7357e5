"""trainer/tracking.py: ``--report-to`` resolution, and the per-iteration rows of the loop landing in trackio.

The trackio test runs the loop's own row producers, :func:`trainer.loop.learn` (collect row, samples, staleness,
``Trainer.train()``'s per-step rows through the real :class:`~trainer.grpo.MetricsFileCallback`) and
:func:`trainer.loop.publish` (sync row), for two iterations over crafted collect folders, with a real
:class:`~trainer.tracking.Tracker` on ``report_to=["trackio"]``. Only the Trainer is a stand-in (its ``train()``
emits two logged steps with known numbers); trackio is the real package, writing into ``TRACKIO_DIR=tmp_path``.
trackio reads ``TRACKIO_DIR`` when it is imported, so writing and reading run in subprocesses (this file run as a
script: ``feed SPEC`` / ``read PROJECT RUN``); the stored rows are read back with trackio's own storage reader and
one value through its public CLI (``trackio get metric``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROJECT, RUN_NAME = "harnessrl", "tracking-test"
# per iteration: (session, harness, reward, tool calls, policy version of its records); one task, so one group
ITERATIONS: dict[int, list[tuple[str, str, float, int, int]]] = {
    1: [("a1", "pi", 1.0, 3, 0), ("b1", "pi", 0.0, 1, 0), ("c1", "mini-swe-agent", 1.0, 4, 0),
        ("d1", "mini-swe-agent", 0.0, 2, 0)],
    2: [("a2", "pi", 1.0, 5, 0), ("b2", "pi", 1.0, 5, 0), ("c2", "mini-swe-agent", 1.0, 0, 1),
        ("d2", "mini-swe-agent", 0.0, 2, 1)],
}  # fmt: skip
# the logged optimizer steps of each iteration's train(): trained tokens, |captured - recomputed| mean and max
STEPS = {1: [(10.0, 0.1, 0.3), (30.0, 0.2, 0.5)], 2: [(20.0, 0.4, 0.9), (20.0, 0.0, 0.1)]}


# ------------------------------------------------------------------------------------------------ the tests


def test_default_is_trackio_when_installed_and_unknown_backends_are_refused(tmp_path: Path, monkeypatch: Any,
                                                                           capsys: Any) -> None:  # fmt: skip
    from trainer import sft, train
    from trainer.config import ConfigError
    from trainer.tracking import resolve_report_to

    assert importlib.util.find_spec("trackio") is not None, "the engine env installs trackio"
    assert resolve_report_to("auto") == ["trackio"]
    assert resolve_report_to("none") == [] and resolve_report_to("") == [] and resolve_report_to(None) == []
    assert resolve_report_to("trackio, trackio") == ["trackio"]
    try:
        resolve_report_to("trackio,mlflow")
        raise AssertionError("mlflow was accepted")
    except ConfigError as e:
        assert "unknown backend 'mlflow'" in str(e) and "trackio, wandb, tensorboard" in str(e)
        assert "'none'" in str(e) and "REPORT_TO=" in str(e)
    if importlib.util.find_spec("wandb") is None:
        try:
            resolve_report_to("wandb")
            raise AssertionError("wandb was accepted without the package")
        except ConfigError as e:
            assert "pip install wandb" in str(e)

    # make train / harnessrl train without --report-to: trackio, in a run named after the run folder
    monkeypatch.delenv("REPORT_TO", raising=False)
    _, args = train.configs(train.build_parser().parse_args(["--run-dir", str(tmp_path / "exp7")]))
    assert args.report_to == ["trackio"] and args.run_name == "exp7" and args.project == PROJECT
    monkeypatch.setenv("REPORT_TO", "none")  # make train REPORT_TO=none
    _, args = train.configs(train.build_parser().parse_args(["--run-dir", str(tmp_path / "exp7")]))
    assert args.report_to == []
    assert train.main(["--report-to", "tensorbored", "--run-dir", str(tmp_path / "x")]) == 2
    assert "unknown backend 'tensorbored'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    monkeypatch.delenv("REPORT_TO")
    cfg = sft.config_from_args(sft.build_parser().parse_args(["--runs", str(tmp_path)]))
    assert sft.sft_args(cfg).report_to == ["trackio"] and sft.sft_args(cfg).run_name == cfg.run_id
    assert sft.main(["--runs", str(tmp_path), "--report-to", "wand"]) == 2
    assert "unknown backend 'wand'" in capsys.readouterr().err


def test_each_iteration_logs_reward_pass_at_1_tool_calls_logprob_mismatch_and_staleness(tmp_path: Path) -> None:
    spec = {"run_dir": str(tmp_path / "run"), "collects": {str(it): str(collect(tmp_path, it)) for it in ITERATIONS}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": str(REPO)}
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        env.pop(var, None)  # local storage only

    def script(*argv: str) -> str:
        done = subprocess.run([sys.executable, __file__, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    script("feed", str(tmp_path / "spec.json"))
    assert (tmp_path / "trackio" / f"{PROJECT}.db").is_file()  # it landed in TRACKIO_DIR
    logs: list[dict[str, Any]] = json.loads(script("read", PROJECT, RUN_NAME).splitlines()[-1])

    def at(it: int, phase: str) -> dict[str, Any]:
        rows = [r for r in logs if r.get("iteration") == it and any(k.startswith(f"{phase}/") for k in r)]
        assert len(rows) == 1, (it, phase, logs)
        return rows[0]

    expected = {
        1: {"collect/reward_mean": 0.5, "collect/reward_std": 0.5, "collect/pass_at_1": 0.5,
            "collect/pass_at_1/pi": 0.5, "collect/pass_at_1/mini-swe-agent": 0.5, "collect/tool_calls_mean": 2.5,
            "collect/tool_calls_mean/pi": 2.0, "collect/tool_calls_mean/mini-swe-agent": 3.0,
            "collect/staleness_mean": 0.0, "collect/staleness_max": 0.0, "collect/samples": 4.0,
            "collect/policy_version": 0.0},
        2: {"collect/reward_mean": 0.75, "collect/reward_std": 0.4330127, "collect/pass_at_1": 0.75,
            "collect/pass_at_1/pi": 1.0, "collect/pass_at_1/mini-swe-agent": 0.5, "collect/tool_calls_mean": 3.0,
            "collect/tool_calls_mean/pi": 5.0, "collect/tool_calls_mean/mini-swe-agent": 1.0,
            "collect/staleness_mean": 0.5, "collect/staleness_max": 1.0, "collect/samples": 4.0,
            "collect/policy_version": 1.0},
    }  # fmt: skip
    updates = {1: (0.175, 0.5, 40.0), 2: (0.2, 0.9, 40.0)}  # token-weighted mean, max, tokens of STEPS
    for it in ITERATIONS:
        row = at(it, "collect")
        for key, value in expected[it].items():
            assert abs(row[key] - value) < 1e-6, (it, key, row.get(key))
        update = at(it, "update")
        mean, top, tokens = updates[it]
        assert abs(update["update/logprob_diff_mean"] - mean) < 1e-9 and update["update/logprob_diff_max"] == top
        assert update["update/trained_tokens"] == tokens and update["update/steps"] == 2.0
        sync = at(it, "sync")
        assert sync["sync/policy_version"] == it and sync["sync/engines"] == 1.0
    # the rows arrive in loop order: collect, update, sync of iteration 1, then of iteration 2
    order = [(r["iteration"], next(k.split("/")[0] for k in r if "/" in k)) for r in sorted(logs, key=_step)]
    assert order == [(1, "collect"), (1, "update"), (1, "sync"), (2, "collect"), (2, "update"), (2, "sync")]

    # the same value through trackio's public CLI
    cli = Path(sys.executable).with_name("trackio")
    out = subprocess.run([str(cli), "get", "metric", "--project", PROJECT, "--run", RUN_NAME, "--metric",
                          "update/logprob_diff_mean", "--json"], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    values = [v["value"] for v in json.loads(out.stdout)["values"]]
    assert [round(v, 9) for v in values] == [0.175, 0.2]


def _step(row: dict[str, Any]) -> int:
    return int(row["step"])


# ------------------------------------------------------------------------------------------------ crafted collects


def collect(tmp: Path, it: int) -> Path:
    """A collect folder as tasks.collect writes it: episodes.parquet and one record shard."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from addon.records.schema import to_batch
    from tasks.episodes import CallStats, write_episodes
    from tests.engine_env.test_samples import episode, multi_call_session

    folder = tmp / f"collect-{it}"
    rows = ITERATIONS[it]
    write_episodes(folder / "episodes.parquet",
                   [episode(s, "t", h, r, stats=CallStats(tool_call_count=n)) for s, h, r, n, _ in rows])  # fmt: skip
    records = [rec for s, _, _, _, v in rows for rec in multi_call_session(s, version=v)]
    (folder / "records" / "proxy-0").mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([to_batch(records)]), folder / "records" / "proxy-0" / "shard-00000.parquet")
    return folder


# ------------------------------------------------------------------------------------------------ subprocess side


class StepTrainer:
    """Stands in for the Trainer in :func:`trainer.loop.learn`: ``train()`` logs the iteration's STEPS through the
    callbacks as ``Trainer.log`` would (loss plus the captured-vs-recomputed statistics)."""

    def __init__(self, callback: Any) -> None:
        self.callback, self.iteration, self.train_dataset = callback, 0, None
        self.state = SimpleNamespace(global_step=0, is_world_process_zero=True)

    def reset_step_clock(self) -> None:
        self.iteration += 1

    def train(self) -> None:
        assert self.train_dataset, "learn() gave the trainer no samples"
        self.state.global_step = 0
        for tokens, diff, top in STEPS[self.iteration]:
            self.state.global_step += 1
            logs = {"loss": 1.0, "trained_tokens": tokens, "logprob_diff_mean": diff, "logprob_diff_max": top}
            self.callback.on_log(None, self.state, None, logs=logs)


def feed(spec_path: str) -> None:
    from trainer import loop
    from trainer.config import RunConfig
    from trainer.grpo import MetricsFileCallback
    from trainer.sync import SyncResult
    from trainer.tracking import Tracker

    spec = json.loads(Path(spec_path).read_text())
    run = RunConfig(run_dir=Path(spec["run_dir"]), harnesses=("pi", "mini-swe-agent"), iterations=2)
    args = SimpleNamespace(scale_rewards="group", report_to=["trackio"], run_name=RUN_NAME, project=PROJECT,
                           output_dir=str(run.run_dir / "trainer"))  # fmt: skip
    tracker = Tracker.for_args(args, run.run_dir)
    callback = MetricsFileCallback(run.run_dir / loop.METRICS_FILE, on_row=tracker.log_row)
    trainer = StepTrainer(callback)
    steps = 0
    for it in (1, 2):
        steps = loop.learn(run, args, trainer, callback, Path(spec["collects"][str(it)]), it - 1, it, steps, 1.0,
                           tracker)  # fmt: skip
        loop.publish(run, ["http://engine.invalid:1"], run.run_dir / "ckpt", it,
                     lambda urls, folder, version: SyncResult(0.5, dict.fromkeys(urls, 0.5)), tracker)  # fmt: skip
    tracker.close()


def read(project: str, run: str) -> None:
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs(project, run)
    print(json.dumps([{k: v for k, v in r.items() if k != "timestamp"} for r in logs]))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if sys.argv[1] == "feed":
        feed(sys.argv[2])
    else:
        read(sys.argv[2], sys.argv[3])

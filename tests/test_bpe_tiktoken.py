"""addon/generation/bpe_tiktoken.py: tiktoken over a tokenizer's BPE gives the tokenizer's own ids, and is refused
(with the reason) for every tokenizer it could not compute exactly."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

from addon.generation.bpe_tiktoken import BYTE_OF_CHAR, SPLITS, TiktokenBPE, tiktoken_bpe, token_bytes
from addon.generation.token_encoder import PROBE_TEXTS

REPO = Path(__file__).resolve().parents[1]
CHAR_OF_BYTE = {b: c for c, b in BYTE_OF_CHAR.items()}


def exact(backend: Tokenizer) -> tuple[Callable[[str], list[int]], Callable[[list[str]], list[list[int]]]]:
    def one(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids

    def many(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

    return one, many


def build(backend: Tokenizer, spec: dict[str, Any] | None = None) -> TiktokenBPE | str:
    return tiktoken_bpe(json.dumps(spec) if spec else backend.to_str(), *exact(backend), list(PROBE_TEXTS))


@pytest.fixture(scope="module")
def backend(smollm2_tokenizer_dir: Path) -> Tokenizer:
    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir)).backend_tokenizer


@pytest.fixture(scope="module")
def bpe(backend: Tokenizer) -> TiktokenBPE:
    made = build(backend)
    assert isinstance(made, TiktokenBPE), made
    return made


@pytest.fixture(scope="module")
def spec(backend: Tokenizer) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(backend.to_str())
    return loaded


def ids(backend: Tokenizer, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


pieces = st.one_of(
    st.text(max_size=40),
    st.sampled_from(("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<reponame>")),
    # characters whose bytes have no token in SmolLM2 (they go to the tokenizer itself)
    st.sampled_from(("\x04", "\x06", "\x13", "\x1d", "\U00050000", "\U000b0001")),
    st.sampled_from((" ", "  ", "\n", "\n\n", "\t", "{", '"', "é", "東京", "🚀", "123", "def ", "'s", "'ll", " 's")),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(pieces, max_size=30).map("".join))
def test_ids_equal_the_tokenizers_own_on_any_text(backend: Tokenizer, bpe: TiktokenBPE, text: str) -> None:
    assert bpe.encode(text) == ids(backend, text)


def test_the_repositorys_own_text_gets_the_same_ids_alone_and_in_a_batch(backend: Tokenizer, bpe: TiktokenBPE) -> None:
    files = sorted(
        p for p in REPO.glob("**/*") if p.suffix in {".py", ".md", ".cfg", ".json"} and ".venvs" not in p.parts
    )
    texts = [p.read_text(errors="replace") for p in files if ".git" not in p.parts and p.stat().st_size < 1 << 20]
    assert sum(map(len, texts)) > 1_000_000  # the code, docs and results of this repository: ~3 MB of text
    assert bpe.encode_batch(texts) == [ids(backend, t) for t in texts]
    assert [bpe.encode(t) for t in texts[:50]] == [ids(backend, t) for t in texts[:50]]


def test_characters_without_a_token_and_lone_surrogates_go_to_the_tokenizer(
    backend: Tokenizer, bpe: TiktokenBPE
) -> None:
    for text in ("a\x04b", "x \U00050000 y", "\x1d\x1d"):
        assert bpe.fallback_chars.search(text) and bpe.encode(text) == ids(backend, text)
    assert bpe.encode_batch(["plain", "a\x04b"]) == [ids(backend, "plain"), ids(backend, "a\x04b")]
    with pytest.raises(TypeError):  # what the tokenizer itself does with one, not tiktoken's silent replacement
        bpe.encode("caf\ud800")
    assert bpe.fallback_chars.search("plain ascii, é, 東京 and 🚀") is None


def test_token_bytes_reads_byte_level_entries_and_refuses_others() -> None:
    assert token_bytes("Ġthe") == b" the" and token_bytes("Ċ") == b"\n" and token_bytes("Ã©") == "é".encode()
    assert [token_bytes(CHAR_OF_BYTE[b]) for b in range(256)] == [bytes([b]) for b in range(256)]
    for entry in ("東", "a b", "\x00", "\xad"):
        with pytest.raises(UnicodeEncodeError):
            token_bytes(entry)


def edited(spec: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    edit(out)
    return out


def _split(
    s: dict[str, Any], pattern: str, behavior: str = "Isolated", invert: bool = False, use_regex: bool = False
) -> None:
    """The pre-tokeniser of Llama 3's and Qwen 2's tokenizer.json: a Split by ``pattern``, then the byte map."""
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}
    s["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, byte_level]}


def _swap_two_merged_ids(s: dict[str, Any]) -> None:
    vocab = s["model"]["vocab"]
    a, b = ("".join(m) if isinstance(m, list) else m.replace(" ", "") for m in s["model"]["merges"][10:12])
    vocab[a], vocab[b] = vocab[b], vocab[a]


def _stray_token(s: dict[str, Any]) -> None:
    s["model"]["vocab"]["ĠzzzqqqÃ©"] = len(s["model"]["vocab"]) + 100


def _drop_a_continuation_byte(s: dict[str, Any]) -> None:
    c = CHAR_OF_BYTE[0x85]
    s["model"]["vocab"] = {t: i for t, i in s["model"]["vocab"].items() if c not in t}
    s["model"]["merges"] = [m for m in s["model"]["merges"] if CHAR_OF_BYTE[0x85] not in "".join(m)]


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "dropout": (lambda s: s["model"].update(dropout=0.1), "dropout=0.1"),
    "byte fallback": (lambda s: s["model"].update(byte_fallback=True), "byte_fallback=True"),
    "suffix": (lambda s: s["model"].update(end_of_word_suffix="</w>"), "sub-word prefix or suffix"),
    "wordpiece": (lambda s: s["model"].update(type="WordPiece"), "not BPE"),
    "normaliser": (lambda s: s.update(normalizer={"type": "Lowercase"}), "normaliser other than NFC"),
    "prefix space": (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "GPT-2's split"),
    "other split": (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "GPT-2's split"),
    "unknown split pattern": (lambda s: _split(s, r"\p{L}+|\p{N}+|[^\p{L}\p{N}]+"), "nor a known Split"),
    "split removes": (lambda s: _split(s, SPLITS["Qwen 2"], behavior="Removed"), "nor a known Split"),
    "split inverted": (lambda s: _split(s, SPLITS["Qwen 2"], invert=True), "nor a known Split"),
    "regex twice": (lambda s: _split(s, SPLITS["Llama 3"], use_regex=True), "nor a known Split"),
    "lstrip": (lambda s: s["added_tokens"][2].update(lstrip=True), "strips spaces"),
    "prefix special": (
        lambda s: s["added_tokens"].append({**s["added_tokens"][2], "id": 60000, "content": "<|im_end|>x"}),
        "prefix of another",
    ),
    "merge order": (_swap_two_merged_ids, "do not follow the merges' order"),
    "stray token": (_stray_token, "neither a byte nor a merge's product"),
    "continuation byte": (_drop_a_continuation_byte, "continuation byte"),
    "not byte-level": (lambda s: s["model"]["vocab"].update({"東京": 70000}), "not byte-level"),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_a_tokenizer_tiktoken_would_compute_otherwise_is_refused_with_the_reason(
    backend: Tokenizer, spec: dict[str, Any], name: str
) -> None:
    edit, reason = EDITS[name]
    refusal = build(backend, edited(spec, edit))
    assert isinstance(refusal, str) and reason in refusal


def test_merges_tiktoken_would_apply_otherwise_are_caught_by_the_vocabulary_check() -> None:
    # "b"+"c" merges first, so the tokenizer leaves "abc" as [a, bc]: its "abc" is made from "ab"+"c", a pair that
    # never meets. tiktoken merges any two neighbours that make a token, and would give [abc].
    vocab = {CHAR_OF_BYTE[b]: b for b in range(256)} | {"bc": 256, "ab": 257, "abc": 258}
    backend = Tokenizer(models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert ids(backend, "abc") == [97, 256]
    refusal = build(backend)
    assert isinstance(refusal, str) and "other ids than the tokenizer for 'abc'" in refusal


def test_a_training_consistent_toy_tokenizer_is_taken() -> None:
    vocab = {CHAR_OF_BYTE[b]: b for b in range(256)} | {"ab": 256, "abc": 257, "Ġab": 258}
    backend = Tokenizer(models.BPE(vocab, [("a", "b"), ("ab", "c"), ("Ġ", "ab")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    made = build(backend)
    assert isinstance(made, TiktokenBPE), made
    for text in ("abc ab abcabc", "cab  ab\n", "x"):
        assert made.encode(text) == ids(backend, text)


def test_without_tiktoken_installed_the_reason_says_so(backend: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # what `import tiktoken` meets where it is not installed
    assert build(backend) == "tiktoken is not installed"


def test_characters_whose_lead_byte_has_no_token_are_exactly_those_sent_to_the_tokenizer(spec: dict[str, Any]) -> None:
    gone = {CHAR_OF_BYTE[b] for b in (0xC3, 0xE0, 0xF4)}  # a vocabulary without these lead bytes' tokens

    def drop(s: dict[str, Any]) -> None:
        s["model"]["vocab"] = {t: i for t, i in s["model"]["vocab"].items() if not gone & set(t)}
        s["model"]["merges"] = [m for m in s["model"]["merges"] if not gone & set("".join(m))]

    edited_spec = edited(spec, drop)
    backend = Tokenizer.from_str(json.dumps(edited_spec))
    bpe = build(backend, edited_spec)
    assert isinstance(bpe, TiktokenBPE), bpe
    sent = ("é", "Ã", "\u0800", "\u0fff", "\U00100000", "\U0010ffff")  # UTF-8 led by 0xC3, 0xE0, 0xF4
    kept = ("\u00bf", "\u0100", "\u07ff", "\u1000", "東", "\U00010000", "\U000fffff", "🚀")
    assert all(bpe.fallback_chars.search(c) for c in sent)
    assert not any(bpe.fallback_chars.search(c) for c in kept)
    for text in (f"a{c}b" for c in sent + kept):
        assert bpe.encode(text) == ids(backend, text)


ASCII = st.text(st.characters(max_codepoint=127), max_size=40)
SPLIT_PIECES = st.one_of(
    ASCII,
    st.sampled_from(("<|im_start|>", "<|im_end|>", "<|endoftext|>", "\x04", "\r\n", "\n\n  ", "}\n\n", " \t\n x")),
    st.sampled_from(("1", "12", "1234", "1234567", " 99", "'S", "'LL", "DON'T", "I'm", "é", "東京", "🚀", "\u00a0")),
)


@pytest.fixture(scope="module", params=["Llama 3", "Qwen 2"])
def split_pair(request: pytest.FixtureRequest, spec: dict[str, Any]) -> tuple[Tokenizer, TiktokenBPE, list[str]]:
    """SmolLM2's vocabulary and merges behind Llama 3's pre-tokeniser (ignore_merges, as Llama 3 sets it) or Qwen 2's
    (and its NFC normaliser); the real files are not on this machine. The list collects the texts sent to the
    tokenizer itself."""
    name = request.param

    def edit(s: dict[str, Any]) -> None:
        _split(s, SPLITS[name])
        if name == "Qwen 2":
            s["normalizer"] = {"type": "NFC"}
        else:
            s["model"]["ignore_merges"] = True

    text = json.dumps(edited(spec, edit))
    backend = Tokenizer.from_str(text)
    one, many = exact(backend)
    sent: list[str] = []
    made = tiktoken_bpe(text, lambda t: sent.append(t) or one(t), many, list(PROBE_TEXTS))
    assert isinstance(made, TiktokenBPE) and made.ascii_only, made
    return backend, made, sent


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(SPLIT_PIECES, max_size=30).map("".join))
def test_behind_llama3s_or_qwen2s_split_the_ids_are_the_tokenizers_own(
    split_pair: tuple[Tokenizer, TiktokenBPE, list[str]], text: str
) -> None:
    backend, bpe, _ = split_pair
    assert bpe.encode(text) == ids(backend, text)


def test_behind_a_split_only_ascii_texts_go_to_tiktoken(split_pair: tuple[Tokenizer, TiktokenBPE, list[str]]) -> None:
    backend, bpe, sent = split_pair
    sent.clear()  # (the module's fixture: other tests' texts)
    sources = (f.read_text() for f in sorted((REPO / "addon").rglob("*.py")))
    code = next(t for t in sources if t.isascii() and len(t) > 5_000)  # a module of this repository
    texts = [code, "x = 1234567\r\n\r\n  return {'A': [1, 22, 333]}\n", "WE'LL SEE'S", "café", "a\x04b"]
    assert [bpe.encode(t) for t in texts] == [ids(backend, t) for t in texts]
    assert sent == ["café", "a\x04b"]  # not ASCII; a character without a token
    assert bpe.encode_batch(texts[:3]) == [ids(backend, t) for t in texts[:3]] and len(sent) == 2


def test_ignore_merges_and_nfc_are_taken_with_gpt2s_split(backend: Tokenizer, spec: dict[str, Any]) -> None:
    """tiktoken takes a piece that is a token whole, as ignore_merges does; NFC leaves ASCII as it is."""
    for edit, ascii_only in (
        (lambda s: s["model"].update(ignore_merges=True), False),
        (lambda s: s.update(normalizer={"type": "NFC"}), True),
    ):
        text = json.dumps(edited(spec, edit))
        other = Tokenizer.from_str(text)
        made = tiktoken_bpe(text, *exact(other), list(PROBE_TEXTS))
        assert isinstance(made, TiktokenBPE) and made.ascii_only is ascii_only, made
        for sample in (*PROBE_TEXTS, "e\u0301 é ﬁ", "<|im_end|>x 12345"):
            assert made.encode(sample) == ids(other, sample)

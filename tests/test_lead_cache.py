"""addon/generation/lead_cache.py: a full render takes its leading turn's ids from the cache, and the ids are exactly
those of tokenising the whole text (property test on the default model's tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon.generation.lead_cache import LeadCache
from addon.generation.render import PromptRenderer
from addon.generation.splice import SessionState, SpliceRenderer, plan
from converters.canonical import Message, ModelRequest, TextPart, ToolSpec

EOT = "<|im_end|>"


@pytest.fixture(scope="module")
def renderer(smollm2_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_pretrained(smollm2_tokenizer_dir)


def test_the_default_tokenizer_passes_the_probe_and_a_second_lead_is_a_hit(renderer: PromptRenderer) -> None:
    cache = LeadCache(renderer.encode, EOT)
    assert cache.enabled
    lead = "<|im_start|>system\nYou edit files. " * 50 + EOT
    for user in ("\n<|im_start|>user\nfix the bug<|im_end|>\n", "\n<|im_start|>user\nadd a test<|im_end|>\n"):
        assert cache.encode(lead + user) == renderer.encode(lead + user)
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


text_piece = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=text_piece, tail=text_piece, more=st.booleans())
def test_split_ids_equal_the_whole_texts_ids(renderer: PromptRenderer, head: str, tail: str, more: bool) -> None:
    cache = LeadCache(renderer.encode, EOT)
    text = head + EOT + tail + (EOT + "\n" + tail if more else "")
    assert cache.encode(text) == renderer.encode(text)
    assert cache.encode(text) == renderer.encode(text)  # from the cache this time
    assert cache.encode(head + tail) == renderer.encode(head + tail)  # no end-of-turn: tokenised whole


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(text_piece, min_size=1, max_size=12), piece=st.integers(1, 60))
def test_a_long_rest_tokenised_in_pieces_equals_the_whole_texts_ids(
    renderer: PromptRenderer, turns: list[str], piece: int
) -> None:
    cache = LeadCache(renderer.encode, EOT, encode_batch=renderer.token_encoder.encode_batch, piece_chars=piece)
    text = "lead" + EOT + "".join(f"\n<|im_start|>user\n{t}{EOT}" for t in turns) + "\n<|im_start|>assistant\n"
    rest = text[text.index(EOT) + len(EOT) :]
    pieces = cache.pieces(rest)
    assert "".join(pieces) == rest
    assert all(p.endswith(EOT) and len(p) >= piece for p in pieces[:-1])
    assert cache.encode(text) == renderer.encode(text)


def test_a_first_calls_rest_goes_to_the_batch_call_in_pieces(renderer: PromptRenderer) -> None:
    calls: list[list[str]] = []

    def batch(texts: list[str]) -> list[list[int]]:
        calls.append(texts)
        assert renderer.token_encoder.encode_batch is not None
        return renderer.token_encoder.encode_batch(texts)

    cache = LeadCache(renderer.encode, EOT, encode_batch=batch, piece_chars=1000)
    turns = "".join(f"\n<|im_start|>user\nstep {i}: " + "run the tests again. " * 30 + EOT for i in range(12))
    text = "<|im_start|>system\nYou edit files." + EOT + turns + "\n<|im_start|>assistant\n"
    assert cache.encode(text) == renderer.encode(text)
    assert len(calls) == 1 and len(calls[0]) > 4  # ~7.6k characters after the lead, in pieces of 1,000 or more
    short = "<|im_start|>system\nx" + EOT + "\n<|im_start|>user\nhi" + EOT
    assert cache.encode(short) == renderer.encode(short) and len(calls) == 1  # under two pieces: tokenised whole
    with pytest.raises(ValueError, match="piece_chars"):
        LeadCache(renderer.encode, EOT, piece_chars=0)


def test_a_tokenizer_that_merges_across_the_end_of_turn_is_not_split() -> None:
    """A fake tokenizer (one id per two characters, so a split in the middle of a pair changes the ids): the probe
    fails and every text is tokenised whole."""

    def pairs(text: str) -> tuple[int, ...]:
        return tuple(hash(text[i : i + 2]) & 0xFFFF for i in range(0, len(text), 2))

    cache = LeadCache(pairs, "<e>")
    assert not cache.enabled
    text = "abc<e>de"
    assert cache.encode(text) == pairs(text) and len(cache) == 0
    assert not LeadCache(pairs, "").enabled  # no special end-of-turn: nothing to split on


def test_the_cache_is_bounded_by_characters(renderer: PromptRenderer) -> None:
    cache = LeadCache(renderer.encode, EOT, max_chars=400)
    for i in range(10):
        cache.encode(f"system {i} " * 8 + EOT + "\nhi")
    assert len(cache) < 10 and cache.misses == 10
    big = "x" * 200 + EOT + "\nrest"  # over a quarter of the bound: tokenised, not kept
    assert cache.encode(big) == renderer.encode(big) and big[: big.index(EOT) + len(EOT)] not in cache._cache
    with pytest.raises(ValueError, match="max_chars"):
        LeadCache(renderer.encode, EOT, max_chars=0)


def test_first_calls_of_two_sessions_share_the_lead_and_equal_a_fresh_render(renderer: PromptRenderer) -> None:
    splicer = SpliceRenderer(renderer)
    tool = ToolSpec("Bash", "Run a command.", {"type": "object", "properties": {"cmd": {"type": "string"}}})
    system = Message("system", (TextPart("You are a coding agent. Follow the rules. " * 40),))
    for i, task in enumerate(("fix the failing test", "rename the module")):
        request = ModelRequest("chat", "m", (system, Message("user", (TextPart(task),))), tools=(tool,))
        got = plan(SessionState(f"s{i}"), request, splicer)
        assert got.reason == "first_call"
        assert tuple(got.prompt_ids) == renderer.render(request).prompt_ids
    assert splicer.leads.hits >= 1

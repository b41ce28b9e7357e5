"""addon/generation/splice.py: token-faithful prompts across the calls of a session, with the real SmolLM2 tokenizer.

Second requests are built the way each format's SDK sends a turn back: the wire body the proxy returned for the
first call is put into the next request body, which is parsed by the real dialect.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from addon.generation.render import PromptRenderer
from addon.generation.splice import (
    SessionGraphs,
    SessionState,
    SpliceConfig,
    SplicePlan,
    SpliceRenderer,
    assistant_message,
    message_key,
    plan,
    plan_without_root,
    record,
)
from addon.records import token_ids
from converters import dialect_for
from converters.base import Route
from converters.canonical import (
    Completion,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
)

ROUTES = {
    "chat": Route("chat", "/v1/chat/completions"),
    "responses": Route("responses", "/v1/responses"),
    "anthropic": Route("anthropic", "/v1/messages"),
    "gemini": Route("gemini", "/v1beta/models/m:generateContent", model="m", stream=False),
}
FORMATS = tuple(ROUTES)
SYSTEM = "You are a careful coding agent. Use the tools."
OTHER_SYSTEM = "You are a sub-agent that only searches files."
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.fixture(scope="module")
def renderer(smollm2_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def splicer(renderer: PromptRenderer) -> SpliceRenderer:
    return SpliceRenderer(renderer)


# A ChatML template with native tools: tools in the system turn, calls written by the template, named results.
NATIVE_TEMPLATE = (
    "{%- if messages[0].role == 'system' or tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{%- if tools %}\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response name=\"{{ m.name }}\">\n{{ m.content }}"
    "\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def native_splicer(renderer: PromptRenderer) -> SpliceRenderer:
    return SpliceRenderer(PromptRenderer(renderer.tokenizer, chat_template=NATIVE_TEMPLATE))


# ------------------------------------------------------------------------------------------------ wire bodies


def first_body(fmt: str, system: str = SYSTEM, tool: str = "read_file") -> dict[str, Any]:
    user = "Fix the bug in app.py please."
    if fmt == "chat":
        fn = {"name": tool, "description": "Read a file.", "parameters": SCHEMA}
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return {"model": "m", "messages": messages, "tools": [{"type": "function", "function": fn}]}
    if fmt == "responses":
        tools = [{"type": "function", "name": tool, "description": "Read a file.", "parameters": SCHEMA}]
        items = [{"role": "developer", "content": system}, {"role": "user", "content": user}]
        return {"model": "m", "input": items, "tools": tools}
    if fmt == "anthropic":
        blocks = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        tools = [{"name": tool, "description": "Read a file.", "input_schema": SCHEMA}]
        content = [{"type": "text", "text": user, "cache_control": {"type": "ephemeral"}}]
        turns: list[dict[str, Any]] = [{"role": "user", "content": content}]
        return {"model": "m", "max_tokens": 256, "system": blocks, "messages": turns, "tools": tools}
    decl = {"name": tool, "description": "Read a file.", "parametersJsonSchema": SCHEMA}
    return {
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": [{"role": "user", "parts": [{"text": user}]}],
        "tools": [{"functionDeclarations": [decl]}],
    }


def next_body(fmt: str, body: dict[str, Any], answer: dict[str, Any], call: ToolCall, result: str) -> dict[str, Any]:
    """``body`` + the returned turn as the SDK hands it back + the tool result."""
    body = json.loads(json.dumps(body))
    if fmt == "chat":
        body["messages"] += [
            answer["choices"][0]["message"],
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
    elif fmt == "responses":
        body["input"] += answer["output"] + [{"type": "function_call_output", "call_id": call.id, "output": result}]
    elif fmt == "anthropic":
        for msg in body["messages"]:  # the harness moves its cache breakpoint to the newest block
            for block in msg["content"] if isinstance(msg["content"], list) else ():
                block.pop("cache_control", None)
        res = {"type": "tool_result", "tool_use_id": call.id, "content": result, "cache_control": {"type": "ephemeral"}}
        body["messages"] += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": [res]}]
    else:
        response = {"functionResponse": {"id": call.id, "name": call.name, "response": {"output": result}}}
        body["contents"] += [answer["candidates"][0]["content"], {"role": "user", "parts": [response]}]
    return body


def parse(fmt: str, body: dict[str, Any]) -> ModelRequest:
    return dialect_for(fmt).parse_request(json.dumps(body).encode(), ROUTES[fmt])


def completion(i: int, reasoning: str = "", tool: str = "read_file") -> Completion:
    call = ToolCall(f"call_{i}x", tool, json.dumps({"path": f"src/mod{i}.py"}))
    text = f"Reading file {i}."
    return Completion(f"r{i}", "m", text=text, reasoning=reasoning, tool_calls=(call,), finish_reason="tool_calls")


def sampled(splicer: SpliceRenderer, comp: Completion, *, end: bool = True) -> tuple[int, ...]:
    """Ids the model "sampled": the tokenisation of the turn as the template writes it, plus end-of-turn."""
    user = [{"role": "user", "content": "x"}]
    opened = splicer.apply(user, generation=True)
    closed = splicer.apply(user + splicer.convert(assistant_message(comp), {}), generation=False)
    assert closed.startswith(opened) and closed.endswith(splicer.close_text) and splicer.eot_id is not None
    text = closed[len(opened) : len(closed) - len(splicer.close_text)]
    return splicer.renderer.encode(text) + ((splicer.eot_id,) if end else ())


def run_call(
    state: SessionState, splicer: SpliceRenderer, call_id: str, req: ModelRequest, comp: Completion, **kw: Any
) -> SplicePlan:
    p = plan(state, req, splicer, auxiliary=kw.pop("auxiliary", False))
    ids = kw.pop("ids", None) or sampled(splicer, comp)
    record(state, call_id, req, p, comp, ids, comp.finish_reason)
    return p


def tool_loop(
    fmt: str, splicer: SpliceRenderer, turns: int = 3, reasoning: str = ""
) -> tuple[SessionState, list[SplicePlan], list[ModelRequest], dict[str, Any]]:
    state, plans, reqs = SessionState("s"), [], []
    body = first_body(fmt)
    for i in range(turns):
        req = parse(fmt, body)
        comp = completion(i, reasoning)
        plans.append(run_call(state, splicer, f"c{i}", req, comp))
        reqs.append(req)
        answer = dialect_for(fmt).render_completion(comp)
        body = next_body(fmt, body, answer, comp.tool_calls[0], f"line {i}: x = {i}\n")
    return state, plans, reqs, body


# ------------------------------------------------------------------------------------------------ tests


def test_native_tool_template_is_probed_and_splices_with_named_results(native_splicer: SpliceRenderer) -> None:
    caps = native_splicer.renderer.capabilities
    assert caps.native_tools and native_splicer.local and native_splicer.close_text == "<|im_end|>\n"
    _, plans, reqs, _ = tool_loop("anthropic", native_splicer, turns=3)
    assert [p.reason for p in plans] == ["first_call", "extends", "extends"] and plans[1].mode == "native"
    assert '<tool_response name="read_file">' in plans[2].suffix_text  # the name comes from the earlier call
    assert plans[2].prompt_ids == native_splicer.renderer.render(reqs[2]).prompt_ids


def test_probe_of_smollm2_template(splicer: SpliceRenderer) -> None:
    assert splicer.close_text == "<|im_end|>\n"
    assert splicer.eot_id == splicer.renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert splicer.close_rest == "\n"
    assert splicer.local  # ChatML renders each message on its own
    assert splicer.renders_reasoning  # as a think span in the content (the template has no reasoning field)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tool_loop_splices_without_fork_in_every_format(fmt: str, splicer: SpliceRenderer) -> None:
    state, plans, reqs, _ = tool_loop(fmt, splicer, turns=4)
    assert [p.reason for p in plans] == ["first_call", "extends", "extends", "extends"]
    assert [p.parent_call_id for p in plans] == [None, "c0", "c1", "c2"]
    for i in range(1, 4):
        parent = state.nodes[i - 1]
        reused = state.prompt_ids(parent) + parent.completion_ids
        assert plans[i].prompt_ids[: len(reused)] == reused and plans[i].reused_tokens == len(reused)
        assert plans[i].fork_reason is None
        # The suffix starts right after the sampled end-of-turn token and holds only the new tool result.
        assert plans[i].suffix_text.startswith("\n<|im_start|>user\n<tool_response>\nline")
        assert "Fix the bug" not in plans[i].suffix_text
        # Sampled ids equal the text's tokenisation here, so the splice equals a fresh full render.
        assert plans[i].prompt_ids == splicer.renderer.render(reqs[i]).prompt_ids
    assert plans[-1].allowed_tools() == {"read_file": "function"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_reasoning_sent_back_splices_and_dropped_reasoning_forks(fmt: str, splicer: SpliceRenderer) -> None:
    state, plans, _, body = tool_loop(fmt, splicer, turns=2, reasoning="The bug is in mod0.")
    assert [p.reason for p in plans] == ["first_call", "extends"]
    # The harness strips reasoning blocks from the history it sends next.
    if fmt == "chat":
        for m in body["messages"]:
            m.pop("reasoning_content", None)
    elif fmt == "responses":
        body["input"] = [i for i in body["input"] if i.get("type") != "reasoning"]
    elif fmt == "anthropic":
        for m in body["messages"]:
            if m["role"] == "assistant":
                m["content"] = [b for b in m["content"] if b["type"] != "thinking"]
    else:
        for c in body["contents"]:
            c["parts"] = [p for p in c["parts"] if not p.get("thought")]
    p = plan(state, parse(fmt, body), splicer)
    assert (p.reason, p.parent_call_id, p.fork_reason, p.reused_tokens) == (
        "reasoning_dropped",
        "c1",
        "reasoning_dropped",
        0,
    )


def test_template_without_earlier_reasoning_ignores_a_dropped_block(splicer: SpliceRenderer) -> None:
    """With a template that shows no earlier reasoning, dropping it changes nothing: the call still extends."""
    quiet = SpliceRenderer(splicer.renderer)
    quiet.renders_reasoning = False
    state = SessionState("s")
    req = ModelRequest("chat", "m", (Message("user", (TextPart("hi"),)),))
    comp = Completion("r", "m", text="Hello.", reasoning="greet back", finish_reason="stop")
    run_call(state, quiet, "c0", req, comp)
    nxt = req.messages + (Message("assistant", (TextPart("Hello."),)), Message("user", (TextPart("bye"),)))
    assert plan(state, ModelRequest("chat", "m", nxt), quiet).reason == "extends"


def test_compaction_subagent_tools_and_auxiliary_are_new_roots(splicer: SpliceRenderer) -> None:
    state, _, reqs, body = tool_loop("anthropic", splicer, turns=2)
    compacted = json.loads(json.dumps(body))
    compacted["messages"] = [{"role": "user", "content": "Summary of the work so far: read mod0."}] + body["messages"][
        3:
    ]
    p = plan(state, parse("anthropic", compacted), splicer)
    assert (p.reason, p.parent_call_id, p.reused_tokens) == ("history_rewritten", "c1", 0)
    assert p.prompt_ids == splicer.renderer.render(parse("anthropic", compacted)).prompt_ids

    sub = parse("anthropic", first_body("anthropic", system=OTHER_SYSTEM, tool="grep"))
    assert plan(state, sub, splicer).reason == "instructions_changed"
    other_tools = parse("anthropic", first_body("anthropic", tool="grep"))
    assert plan(state, other_tools, splicer).reason == "tools_changed"
    aux = plan(state, reqs[1], splicer, auxiliary=True)
    assert (aux.reason, aux.parent_call_id, aux.reused_tokens) == ("auxiliary", "c1", 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_plan_without_root_is_the_plan_of_an_extension_or_a_retry_and_none_for_a_root(
    fmt: str, splicer: SpliceRenderer
) -> None:
    state, plans, reqs, body = tool_loop(fmt, splicer, turns=2)
    assert plan_without_root(state, parse(fmt, body), splicer) == plan(state, parse(fmt, body), splicer)
    retry = plan_without_root(state, reqs[1], splicer)
    assert retry is not None and retry.retry_of == "c1" and retry.prompt_ids == plans[1].prompt_ids
    assert plan_without_root(SessionState("new"), reqs[0], splicer) is None  # a first call
    sub = parse(fmt, first_body(fmt, system=OTHER_SYSTEM, tool="grep"))
    assert plan_without_root(state, sub, splicer) is None  # instructions changed
    assert plan(state, sub, splicer).reason == "instructions_changed"  # what plan renders instead


def test_subagent_interleaved_with_main_agent_each_extends_its_own_lineage(splicer: SpliceRenderer) -> None:
    state = SessionState("s")
    main_body, sub_body = first_body("chat"), first_body("chat", system=OTHER_SYSTEM, tool="grep")
    reasons = []
    for i in range(2):
        for name, body, tool in (("main", main_body, "read_file"), ("sub", sub_body, "grep")):
            comp = completion(i, tool=tool)
            reasons.append(run_call(state, splicer, f"{name}{i}", parse("chat", body), comp).reason)
            answer = dialect_for("chat").render_completion(comp)
            body.update(next_body("chat", body, answer, comp.tool_calls[0], "ok"))
    assert reasons == ["first_call", "instructions_changed", "extends", "extends"]
    assert [n.plan.parent_call_id for n in state.nodes] == [None, "main0", "main0", "sub0"]


def test_retries_are_siblings_and_either_can_be_extended(splicer: SpliceRenderer) -> None:
    state, plans, reqs, body = tool_loop("chat", splicer, turns=2)
    retry = run_call(state, splicer, "c1b", reqs[1], completion(7))
    assert (retry.reason, retry.parent_call_id, retry.retry_of) == ("extends", "c0", "c1")
    assert retry.prompt_ids == plans[1].prompt_ids
    # The harness kept the retry's answer: the next call extends the retry, not the first attempt.
    comp = completion(7)
    answer = dialect_for("chat").render_completion(comp)
    body = json.loads(json.dumps(first_body("chat")))
    body = next_body(
        "chat",
        body,
        dialect_for("chat").render_completion(completion(0)),
        completion(0).tool_calls[0],
        "line 0: x = 0\n",
    )
    body = next_body("chat", body, answer, comp.tool_calls[0], "done")
    p = plan(state, parse("chat", body), splicer)
    assert (p.reason, p.parent_call_id) == ("extends", "c1b")
    first_retry = run_call(state, splicer, "c0b", reqs[0], completion(0))
    assert (first_retry.reason, first_retry.parent_call_id, first_retry.retry_of) == ("first_call", None, "c0")


def test_memory_is_linear_and_a_rewind_can_still_extend_an_early_call(splicer: SpliceRenderer) -> None:
    state, plans, reqs, _ = tool_loop("responses", splicer, turns=5)
    completions = sum(len(n.completion_ids) for n in state.nodes)
    assert state.tokens_held == len(plans[-1].prompt_ids) + completions  # only the newest prompt is held whole
    assert [state.prompt_ids(n) for n in state.nodes] == [p.prompt_ids for p in plans]
    # The user rewinds to after the first answer and says something else: a branch off an early call.
    rewind = reqs[1].messages[:-1] + (Message("user", (TextPart("Actually, read the README instead."),)),)
    p = plan(state, replace(reqs[1], messages=rewind), splicer)
    assert (p.reason, p.parent_call_id) == ("extends", "c0")
    assert p.prompt_ids == splicer.renderer.render(replace(reqs[1], messages=rewind)).prompt_ids


def test_sampled_ids_are_kept_even_when_they_differ_from_the_text_tokenisation(splicer: SpliceRenderer) -> None:
    tok = splicer.renderer.tokenizer
    state = SessionState("s")
    req = ModelRequest("chat", "m", (Message("user", (TextPart("say hello"),)),))
    comp = Completion("r", "m", text="hello world", finish_reason="stop")
    odd = tuple(tok.convert_tokens_to_ids(list("hello"))) + tuple(tok.encode(" world")) + (splicer.eot_id,)
    assert tok.decode(list(odd[:-1])) == "hello world" and odd != sampled(splicer, comp)
    run_call(state, splicer, "c0", req, comp, ids=odd)
    nxt = ModelRequest("chat", "m", req.messages + (assistant_message(comp), Message("user", (TextPart("again"),))))
    p = plan(state, nxt, splicer)
    assert p.reason == "extends" and p.prompt_ids[: p.reused_tokens] == state.prompt_ids(state.nodes[0]) + odd
    fresh = splicer.renderer.render(nxt).prompt_ids
    assert p.prompt_ids != fresh and tok.decode(list(p.prompt_ids)) == tok.decode(list(fresh))


def test_length_cut_parent_is_closed_or_forked_by_policy(splicer: SpliceRenderer) -> None:
    req = ModelRequest("chat", "m", (Message("user", (TextPart("write a lot"),)),))
    comp = Completion("r", "m", text="Once upon a", finish_reason="length")
    nxt = ModelRequest("chat", "m", req.messages + (assistant_message(comp), Message("user", (TextPart("go on"),))))
    for policy, reason in (("close", "extends"), ("fork", "length_cut")):
        sp = SpliceRenderer(splicer.renderer, SpliceConfig(length_policy=policy))  # type: ignore[arg-type]
        state = SessionState("s")
        run_call(state, sp, "c0", req, comp, ids=sampled(sp, comp, end=False))
        p = plan(state, nxt, sp)
        assert p.reason == reason
        if reason == "extends":
            # The cut turn is closed by the template's end-of-turn, which the model never sampled (a prompt id).
            assert p.suffix_text.startswith("<|im_end|>\n<|im_start|>user\ngo on")
            assert p.prompt_ids == splicer.renderer.render(nxt).prompt_ids
        else:
            assert (p.parent_call_id, p.reused_tokens) == ("c0", 0)


def test_template_that_rewrites_history_forks(smollm2_tokenizer_dir: Path) -> None:
    tok = PromptRenderer.from_pretrained(smollm2_tokenizer_dir).tokenizer
    counting = (
        "{{ '<|im_start|>system\\n' + (messages|length|string) + ' messages<|im_end|>\\n' }}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    sp = SpliceRenderer(PromptRenderer(tok, chat_template=counting))
    assert not sp.local
    state = SessionState("s")
    req = ModelRequest("chat", "m", (Message("user", (TextPart("hi"),)),))
    comp = Completion("r", "m", text="Hello.", finish_reason="stop")
    assert sp.eot_id is not None
    run_call(state, sp, "c0", req, comp, ids=tok.encode("Hello.") + [sp.eot_id])
    nxt = ModelRequest("chat", "m", req.messages + (assistant_message(comp), Message("user", (TextPart("bye"),))))
    p = plan(state, nxt, sp)
    assert (p.reason, p.parent_call_id, p.fork_reason) == ("template_not_prefix", "c0", "template_not_prefix")


def test_full_render_check_agrees_with_the_local_one(splicer: SpliceRenderer) -> None:
    full = SpliceRenderer(splicer.renderer, SpliceConfig(full_render=True))
    _, local_plans, _, _ = tool_loop("gemini", splicer, turns=3)
    _, full_plans, _, _ = tool_loop("gemini", full, turns=3)
    assert local_plans == full_plans


def test_session_graphs_evict_idle_sessions_then_by_token_cap(splicer: SpliceRenderer) -> None:
    graphs = SessionGraphs(idle_s=100, max_tokens=200)
    req = ModelRequest("chat", "m", (Message("user", (TextPart("hi " * 50),)),))
    comp = Completion("r", "m", text="ok", finish_reason="stop")
    for i, sid in enumerate(["a", "b", "c"]):
        state = graphs.get(sid, now=float(i))
        assert graphs.get(sid, now=float(i)) is state
        with state.lock:
            run_call(state, splicer, f"{sid}0", req, comp)
    held = graphs.get("a", 0.0).tokens_held
    assert 2 * held <= 200 < 3 * held  # three sessions are over the cap, two are not
    assert graphs.evict(now=50.0) == ["a"]  # over the cap: least recently used first ("a" was refreshed at 0)
    assert graphs.evict(now=200.0) == ["b", "c"] and len(graphs) == 0  # idle


def test_dropping_a_session_forgets_its_graph_and_a_new_call_starts_a_new_one(splicer: SpliceRenderer) -> None:
    graphs = SessionGraphs()
    req = ModelRequest("chat", "m", (Message("user", (TextPart("hi"),)),))
    comp = Completion("r", "m", text="ok", finish_reason="stop")
    state = graphs.get("a", now=0.0)
    with state.lock:
        run_call(state, splicer, "a0", req, comp)
    graphs.get("b", now=0.0)
    assert graphs.tokens_held == state.tokens_held > 0
    assert graphs.drop("a") and not graphs.drop("a") and len(graphs) == 1
    assert graphs.tokens_held == 0  # "b" made no call
    fresh = graphs.get("a", now=1.0)
    assert fresh is not state and fresh.nodes == []
    with fresh.lock:
        assert plan(fresh, req, splicer).reason == "first_call"  # rendered in full, not a retry of the dropped call


def test_prompt_ids_are_held_packed_and_a_retry_shares_its_siblings(splicer: SpliceRenderer) -> None:
    state, plans, reqs, _ = tool_loop("chat", splicer, turns=2)
    held = state.tokens_held
    retry = run_call(state, splicer, "c1b", reqs[1], completion(7))
    assert retry.retry_of == "c1" and isinstance(retry.prompt_ids, tuple)
    assert state.tokens_held == held + len(state.nodes[-1].completion_ids)  # the prompt ids are not held twice
    assert [state.prompt_ids(n) for n in state.nodes] == [p.prompt_ids for p in plans] + [plans[1].prompt_ids]
    assert all(type(i) is int for i in state.prompt_ids(state.nodes[-1]))


def test_a_spliced_plan_hands_its_packed_ids_to_the_graph_and_no_node_keeps_them(splicer: SpliceRenderer) -> None:
    state, plans, _, _ = tool_loop("chat", splicer, turns=3)
    last = plans[-1]
    assert last.reason == "extends" and last.packed is not None and tuple(last.packed) == last.prompt_ids
    assert state.packed_ids(state.nodes[-1]) is last.packed  # held as built, not packed a second time
    assert all(n.plan.packed is None and n.plan.prompt_ids == () for n in state.nodes)  # memory stays linear


def test_a_new_root_is_packed_on_the_planning_side_like_a_splice(splicer: SpliceRenderer) -> None:
    # the engine request and the engine prompt's JSON list take it without packing or formatting on the event loop
    state, plans, _, _ = tool_loop("chat", splicer, turns=1)
    (root,) = plans
    assert root.reason == "first_call" and root.packed is not None
    assert isinstance(root.prompt_ids, token_ids.FrozenIds) and root.prompt_ids.packed is root.packed
    assert root.prompt_ids == tuple(root.packed) and len(root.packed) > 0
    assert state.packed_ids(state.nodes[0]) is root.packed  # the graph holds the array as built
    assert token_ids.pack(root.prompt_ids) is root.packed  # what the engine request does: no copy, no check


def test_record_refuses_a_duplicate_call_id(splicer: SpliceRenderer) -> None:
    state = SessionState("s")
    req = ModelRequest("chat", "m", (Message("user", (TextPart("hi"),)),))
    comp = Completion("r", "m", text="ok", finish_reason="stop")
    p = run_call(state, splicer, "c0", req, comp)
    with pytest.raises(ValueError, match="already in session"):
        record(state, "c0", req, p, comp, (1,), "stop")


# ------------------------------------------------------------------------------------------------ property

words = st.text(alphabet="abcdefgh ijklm.,:=()\u00e9\u4e2d0123456789\n", min_size=1, max_size=40).map(str.strip)
words = words.filter(bool)
TOOL = ToolSpec("run", "Run a command.", {"type": "object", "properties": {"cmd": {"type": "string"}}})


@st.composite
def conversations(draw: st.DrawFn) -> list[Message | Completion]:
    """User turns, assistant turns (as completions: text and/or calls), and tool turns answering the calls."""
    out: list[Message | Completion] = [Message("user", (TextPart(draw(words)),))]
    for turn in range(draw(st.integers(1, 5))):
        calls = tuple(
            ToolCall(f"call_{turn}_{i}", "run", json.dumps({"cmd": draw(words)}))
            for i in range(draw(st.integers(0, 2)))
        )
        text = draw(st.one_of(st.just(""), words)) if calls else draw(words)
        out.append(Completion(f"r{turn}", "m", text=text, tool_calls=calls, finish_reason="stop"))
        if calls:
            out.append(Message("tool", tuple(ToolResultPart(c.id, (TextPart(draw(words)),)) for c in calls)))
        if not calls or draw(st.booleans()):
            out.append(Message("user", (TextPart(draw(words)),)))
    return out


@pytest.mark.parametrize("which", ["splicer", "native_splicer"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=conversations(), system=st.booleans())
def test_spliced_ids_equal_a_fresh_render_for_an_append_only_template(
    request: pytest.FixtureRequest, which: str, steps: list[Message | Completion], system: bool
) -> None:
    splicer: SpliceRenderer = request.getfixturevalue(which)
    state = SessionState("s")
    history: list[Message] = [Message("system", (TextPart("be brief"),))] if system else []
    n = 0
    for step in steps:
        if isinstance(step, Message):
            history.append(step)
            continue
        req = ModelRequest("chat", "m", tuple(history), tools=(TOOL,))
        p = plan(state, req, splicer)
        assert p.reason == ("first_call" if n == 0 else "extends")
        assert p.prompt_ids == splicer.renderer.render(req).prompt_ids
        record(state, f"c{n}", req, p, step, sampled(splicer, step), "stop")
        history.append(assistant_message(step))
        n += 1


def test_assistant_message_orders_reasoning_text_and_calls() -> None:
    comp = Completion("r", "m", text="t", reasoning="why", tool_calls=(ToolCall("c1", "run", '{"a": 1}'),))
    msg = assistant_message(comp)
    assert msg == Message("assistant", (ReasoningPart("why"), TextPart("t"), ToolCallPart("c1", "run", '{"a": 1}')))
    assert assistant_message(Completion("r", "m")) == Message("assistant", ())


def test_a_session_holds_one_copy_of_its_history(splicer: SpliceRenderer) -> None:
    """Regression (the soak's memory grew with the square of session length): each request is parsed anew, so each
    node held its own copy of the whole history; an extended node now shares its child's message objects."""
    state, plans, reqs, _ = tool_loop("anthropic", splicer, turns=5)
    assert [p.reason for p in plans] == ["first_call"] + ["extends"] * 4
    newest = state.nodes[-1].messages
    for node, req in zip(state.nodes, reqs, strict=True):
        assert [message_key(m) for m in node.messages] == [message_key(m) for m in req.messages]  # same content
        assert all(m is newest[i] for i, m in enumerate(node.messages))  # one object per message, shared
    again = plan(state, reqs[2], splicer)  # matching still finds the same parent
    assert (again.reason, again.parent_call_id) == ("extends", "c1")


def test_a_history_already_shared_leaves_the_nodes_as_they_are(splicer: SpliceRenderer) -> None:
    """The delta parse hands a call the previous request's unchanged message objects: the nodes already share
    them, so none is rebuilt (re-pointing every node on every call made a call O(session length))."""
    state, _, reqs, _ = tool_loop("anthropic", splicer, turns=1)
    req = reqs[0]
    for i in range(1, 5):
        before = list(state.nodes)
        comp = completion(i)
        req = replace(
            req,
            messages=(*req.messages, assistant_message(completion(i - 1)), Message("user", (TextPart(f"go on {i}"),))),
        )
        assert run_call(state, splicer, f"c{i}", req, comp).reason == "extends"
        assert all(a is b for a, b in zip(before, state.nodes[: len(before)], strict=True))  # not copies
    newest = state.nodes[-1].messages
    assert all(m is newest[i] for node in state.nodes for i, m in enumerate(node.messages))


def test_an_edited_old_message_re_points_only_the_nodes_that_reach_it(splicer: SpliceRenderer) -> None:
    """A harness that edits an old message (Claude Code moves its cache_control marker) makes the delta parse hand
    a call new objects from that message on: only the nodes whose history reaches it are rebuilt, onto the call's
    objects, and the session still holds one copy of its history."""
    state, _, reqs, _ = tool_loop("anthropic", splicer, turns=1)
    req = reqs[0]
    for i in range(1, 5):
        req = replace(
            req,
            messages=(*req.messages, assistant_message(completion(i - 1)), Message("user", (TextPart(f"go on {i}"),))),
        )
        run_call(state, splicer, f"c{i}", req, completion(i))
    edited = len(state.nodes[2].messages)  # the first message that node 3 added, re-parsed as an equal new object
    before = list(state.nodes)
    fresh = tuple(replace(m) if k >= edited else m for k, m in enumerate(req.messages))
    req = replace(req, messages=(*fresh, assistant_message(completion(4)), Message("user", (TextPart("go on 5"),))))
    assert run_call(state, splicer, "c5", req, completion(5)).reason == "extends"
    kept = [a is b for a, b in zip(before, state.nodes, strict=False)]
    assert kept == [len(n.messages) <= edited for n in before] == [True, True, True, False, False]
    newest = state.nodes[-1].messages
    assert all(m is newest[i] for node in state.nodes for i, m in enumerate(node.messages))

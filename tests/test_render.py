"""Tests for addon.generation.render with the real SmolLM2 tokenizer, and with a tool-aware template written here."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from addon.generation.parser import OutputParser, seeded_call_ids
from addon.generation.render import (
    FALLBACK_TOOL_PROMPT,
    MID_SYSTEM_MARKER,
    PromptRenderer,
    TemplateCapabilities,
    tool_schema,
)
from converters.canonical import (
    ConversionError,
    ImagePart,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallDelta,
    ToolCallPart,
    ToolCallStarted,
    ToolChoiceMode,
    ToolChoiceNamed,
    ToolResultPart,
    ToolSpec,
    Usage,
)

SHELL = ToolSpec(
    "shell",
    "Run a shell command and return its output.",
    {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)
READ = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
EXEC = ToolSpec("exec", "Run a snippet of JavaScript.", kind="custom")
SEARCH = ToolSpec("web_search", kind="builtin")
NAMESPACE = ToolSpec("functions", kind="namespace", tools=(EXEC,))


def msg(role: Any, *parts: Any) -> Message:
    return Message(role, tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


def request(*messages: Message, **kw: Any) -> ModelRequest:
    return ModelRequest(format="chat", model="default", messages=messages, **kw)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))


@pytest.fixture(scope="module")
def renderer(smollm2_tokenizer_dir: Path) -> PromptRenderer:
    return PromptRenderer.from_pretrained(smollm2_tokenizer_dir)


def assert_faithful_ids(renderer: PromptRenderer, tokenizer: Any, req: ModelRequest) -> None:
    out = renderer.render(req)
    assert list(out.prompt_ids) == tokenizer(out.prompt_text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    assert out.prompt_ids[0] == bos and out.prompt_ids[1] != bos  # the template's BOS, once
    assert out.prompt_ids.count(bos) == out.prompt_text.count(tokenizer.bos_token)
    assert renderer.count_tokens(req) == len(out.prompt_ids)


# --------------------------------------------------------------------------------------------- SmolLM2 template


def test_smollm2_template_capabilities(renderer: PromptRenderer) -> None:
    assert renderer.capabilities == TemplateCapabilities(
        tools=False, tool_calls=False, reasoning=False, mid_system=True
    )
    assert renderer.supports_images is False


def test_plain_chat(renderer: PromptRenderer, tokenizer: Any) -> None:
    req = request(msg("system", "Be brief."), msg("user", "Hi there"))
    out = renderer.render(req)
    assert out.prompt_text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (out.mode, out.num_tools, out.tool_kinds) == ("fallback", 0, ())
    assert_faithful_ids(renderer, tokenizer, req)


def test_without_system_the_template_default_is_kept(renderer: PromptRenderer, tokenizer: Any) -> None:
    req = request(msg("user", "Hi"))
    out = renderer.render(req)
    assert out.prompt_text.startswith("<|im_start|>system\n") and "SmolLM" in out.prompt_text
    assert out.prompt_text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert_faithful_ids(renderer, tokenizer, req)


def test_instructions_merge_and_mid_conversation_system_stays_in_place(renderer: PromptRenderer) -> None:
    req = request(
        msg("system", "Rule one."),
        msg("developer", "Rule two.", "Rule three."),
        msg("user", "Part A", "Part B"),
        msg("assistant", "Ok", " then."),
        msg("developer", "New rule."),
        msg("user", "Go"),
    )
    text = renderer.render(req).prompt_text
    assert text.startswith("<|im_start|>system\nRule one.\n\nRule two.\n\nRule three.<|im_end|>\n")
    assert "<|im_start|>user\nPart A\n\nPart B<|im_end|>\n<|im_start|>assistant\nOk then.<|im_end|>\n" in text
    assert "<|im_start|>system\nNew rule.<|im_end|>\n<|im_start|>user\nGo<|im_end|>" in text
    assert text.count("<|im_start|>system") == 2


def test_tools_through_fallback_prompt(renderer: PromptRenderer, tokenizer: Any) -> None:
    req = request(msg("system", "You code."), msg("user", "List files"), tools=(SHELL, READ, SEARCH, NAMESPACE))
    out = renderer.render(req)
    assert out.mode == "fallback"
    assert out.num_tools == 3
    assert out.allowed_tools() == {"shell": "function", "read_file": "function", "exec": "custom"}
    system = out.prompt_text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou code.\n\n# Tools\n")
    lines = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in lines] == [tool_schema(t) for t in (SHELL, READ, EXEC)]
    assert json.loads(lines[2])["parameters"]["properties"]["input"]["type"] == "string"
    assert "web_search" not in out.prompt_text  # provider-hosted: cannot run here
    assert "<tool_call>\n" in system and "\n</tool_call>" in system
    assert_faithful_ids(renderer, tokenizer, req)


def test_tool_choice(renderer: PromptRenderer) -> None:
    base = (msg("user", "Hi"),)
    none = renderer.render(request(*base, tools=(SHELL,), tool_choice=ToolChoiceMode("none")))
    assert none.num_tools == 0 and "# Tools" not in none.prompt_text and "SmolLM" in none.prompt_text
    required = renderer.render(request(*base, tools=(SHELL,), tool_choice=ToolChoiceMode("required")))
    assert "you must call at least one tool" in required.prompt_text
    named = renderer.render(request(*base, tools=(SHELL, READ), tool_choice=ToolChoiceNamed("read_file")))
    assert "you must call the tool read_file" in named.prompt_text


HISTORY = (
    msg("system", "You code."),
    msg("user", "What is here?"),
    msg(
        "assistant",
        ReasoningPart("Listing is the first step."),
        ReasoningPart(""),  # redacted reasoning: nothing to show the model
        TextPart("Let me look."),
        ToolCallPart("c1", "shell", '{"cmd": "ls"}'),
        ToolCallPart("c2", "exec", "console.log(1)", kind="custom"),
    ),
    msg("tool", ToolResultPart("c1", (TextPart("a.py\nb.py"),))),
    msg("tool", ToolResultPart("c2", (TextPart("boom"),), is_error=True)),
    msg("assistant", "Two files."),
    msg("user", ToolResultPart("c9", (TextPart("late"),)), TextPart("Now read a.py")),
)


def test_tool_call_history_and_results(renderer: PromptRenderer, tokenizer: Any) -> None:
    req = request(*HISTORY, tools=(SHELL, NAMESPACE))
    text = renderer.render(req).prompt_text
    assert (
        "<|im_start|>assistant\n<think>\nListing is the first step.\n</think>\n\nLet me look.\n"
        '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "exec", "arguments": {"input": "console.log(1)"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nError: boom\n</tool_response><|im_end|>\n" in text
    assert "<|im_start|>user\n<tool_response>\nlate\n</tool_response>\n\nNow read a.py<|im_end|>\n" in text
    assert "<|im_start|>tool" not in text
    assert_faithful_ids(renderer, tokenizer, req)


def test_history_calls_are_what_the_parser_reads(renderer: PromptRenderer) -> None:
    """The renderer shows past calls in exactly the form the output parser turns back into calls."""
    text = renderer.render(request(*HISTORY, tools=(SHELL, NAMESPACE))).prompt_text
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parser = OutputParser(renderer.spec, allowed={"shell": "function", "exec": "custom"}, call_ids=seeded_call_ids(0))
    events = parser.feed(turn) + parser.finish("stop", Usage())
    started = [(e.name, e.kind) for e in events if isinstance(e, ToolCallStarted)]
    args = [e.arguments for e in events if isinstance(e, ToolCallDelta)]
    assert started == [("shell", "function"), ("exec", "custom")]
    assert args == ['{"cmd":"ls"}', "console.log(1)"]
    assert parser.malformed_tool_calls == 0


def test_prefix_stability(renderer: PromptRenderer, tokenizer: Any) -> None:
    req = request(*HISTORY, tools=(SHELL, NAMESPACE))
    full = renderer.render(req)
    checked = 0
    for k, m in enumerate(HISTORY):
        if m.role != "assistant":
            continue
        head = renderer.render(request(*HISTORY[:k], tools=(SHELL, NAMESPACE)))
        assert full.prompt_text.startswith(head.prompt_text)
        assert full.prompt_ids[: len(head.prompt_ids)] == head.prompt_ids
        checked += 1
    assert checked == 2


@pytest.mark.parametrize(
    "bad",
    [
        msg("user", "Look:", ImagePart("base64", "iVBORw0KGgo=", "image/png")),
        msg("tool", ToolResultPart("c1", (ImagePart("url", "https://example.invalid/a.png"),))),
    ],
)
def test_images_are_rejected(renderer: PromptRenderer, bad: Message) -> None:
    with pytest.raises(ConversionError) as err:
        renderer.render(request(msg("user", "Hi"), bad))
    assert err.value.kind == "invalid_request" and err.value.status == 400
    assert "text-only" in err.value.message and "messages[1]" in err.value.message


def test_misplaced_parts_are_rejected(renderer: PromptRenderer) -> None:
    with pytest.raises(ConversionError, match="user message cannot hold a tool_call"):
        renderer.render(request(msg("user", ToolCallPart("c1", "shell", "{}"))))
    with pytest.raises(ConversionError, match="system message may hold only text"):
        renderer.render(request(msg("system", ReasoningPart("x")), msg("user", "Hi")))


def test_render_is_safe_from_worker_threads(renderer: PromptRenderer) -> None:
    reqs = [request(*HISTORY[: k + 2], tools=(SHELL,)) for k in range(len(HISTORY) - 1)] * 8
    expected = [renderer.render(r) for r in reqs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(renderer.render, reqs)) == expected


# --------------------------------------------------------------------------------------------- a tool-aware template

# Our own small template: it lists tools, shows calls and reasoning, and refuses a late system message.
TOOL_TEMPLATE = """\
{%- if tools %}<|im_start|>system
Available functions:
{% for t in tools %}* {{ t.function.name }} - {{ t.function.description }} {{ t.function.parameters | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and not loop.first %}{{ raise_exception('system messages go first') }}{% endif %}
<|im_start|>{{ m.role }}
{% if m.reasoning_content %}(thought: {{ m.reasoning_content }})
{% endif %}{{ m.content }}
{%- if m.tool_calls %}{% for c in m.tool_calls %}
=> {{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{% endif %}
{%- if m.role == 'tool' %} [reply to {{ m.tool_call_id }} from {{ m.name }}]{% endif %}<|im_end|>
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def tool_renderer(smollm2_tokenizer_dir: Path) -> PromptRenderer:
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    tok.chat_template = TOOL_TEMPLATE
    return PromptRenderer(tok)


def test_tool_template_capabilities(tool_renderer: PromptRenderer) -> None:
    assert tool_renderer.capabilities == TemplateCapabilities(
        tools=True, tool_calls=True, reasoning=True, mid_system=False
    )


def test_tools_reach_a_tool_aware_template(tool_renderer: PromptRenderer) -> None:
    history = (*HISTORY[:-1], msg("developer", "Be careful."), msg("user", "Next"))
    out = tool_renderer.render(request(*history, tools=(SHELL, NAMESPACE, SEARCH)))
    text = out.prompt_text
    assert out.mode == "native" and out.num_tools == 2
    assert f"* shell - {SHELL.description} {json.dumps(SHELL.parameters)}" in text
    assert "* exec - Run a snippet of JavaScript." in text
    assert FALLBACK_TOOL_PROMPT.splitlines()[0] not in text and "<tool_call>" not in text
    assert "(thought: Listing is the first step.)\nLet me look.=> shell(" in text and "<think>" not in text
    assert '=> shell({"cmd": "ls"})=> exec({"input": "console.log(1)"})<|im_end|>' in text
    assert "<|im_start|>tool\na.py\nb.py [reply to c1 from shell]<|im_end|>" in text
    assert "<|im_start|>tool\nError: boom [reply to c2 from exec]<|im_end|>" in text
    # The template refuses a late system message, so the instruction arrives as a marked user message.
    assert f"<|im_start|>user\n{MID_SYSTEM_MARKER}Be careful.<|im_end|>" in text
    assert list(out.prompt_ids) == tool_renderer.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_template_refusal_is_a_client_error(smollm2_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    tok.chat_template = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    r = PromptRenderer(tok)
    assert r.render(request(msg("user", "Hi"))).prompt_text == "ok"
    with pytest.raises(ConversionError, match="user first") as err:
        r.render(request(msg("assistant", "Hi")))
    assert err.value.kind == "invalid_request"


def test_tokenizer_without_template_is_refused(smollm2_tokenizer_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        PromptRenderer(tok)

"""Token-faithful multi-turn prompts: a per-session prefix graph of calls, and the splice decision for a new call.

Contract
--------
Sans-IO and synchronous. One :class:`SessionState` per session holds a node per recorded call; the caller holds
``state.lock`` around :func:`plan` and around :func:`record` (they may run in a worker thread; the lock is not
held while the engine generates). :class:`SessionGraphs` maps session ids to states and evicts them by idle time
and by a cap on the token ids held. Those three live in :mod:`addon.generation.session_graph` (re-exported here).
Build one
:class:`SpliceRenderer` per :class:`~addon.generation.render.PromptRenderer`.

``plan(state, request, splicer)`` finds the *parent*: the most recent earlier call (same leading instructions,
same tools) whose request messages followed by the assistant message the proxy returned
(:func:`assistant_message`) are a prefix of the new request's messages. Then::

    prompt_ids = parent.prompt_ids + parent.completion_ids + encode(suffix_text)

so the model sees exactly the ids it sampled, and only the suffix (the rest of the template's close of the
assistant turn, the new messages, the generation prompt) is tokenised. ``record(...)`` adds the finished call.

Matching is canonical, robust to each format's round trip (:func:`message_key`): provider state (signatures,
``cache_control``, item ids) is ignored, tool arguments compare as parsed JSON, ``developer`` equals ``system``,
an assistant turn's text fragments are joined and the order between reasoning, text and calls is ignored; text
and tool call ids compare exactly. A turn sent back without its reasoning forks (``reasoning_dropped``) unless the
template shows no earlier reasoning (:attr:`SpliceRenderer.renders_reasoning`), when it is no change.

The suffix is checked at string level: the template must render the history ending with the parent's assistant
turn as a prefix of the new conversation, and its generation prompt must open that turn; else the call forks
(``template_not_prefix``). When the template was probed to render each turn independently of the earlier ones
(:attr:`SpliceRenderer.local`; ChatML templates such as SmolLM2's are), only the leading instructions, the message
before the turn, the turn and the new messages are rendered, so the cost follows the suffix, not the history;
otherwise (or with ``SpliceConfig(full_render=True)``) the whole conversation is rendered as text, never tokenised.

End of turn: when the sampled ids end with the template's end-of-turn token they already hold it and only the rest
of the close (ChatML: ``"\\n"``) is added. Otherwise (``finish_reason == "length"``, a stop string) the whole
close (``"<|im_end|>\\n"``) is appended as prompt ids, which is what the model is then shown after its cut turn;
with ``SpliceConfig(length_policy="fork")`` such a parent is not extended (``length_cut``). A call with no sampled
ids (a budget stop's canned answer) is never extended: no ids stand for its turn.

Anything else is a new root rendered in full; :data:`SpliceReason` says why. Its ``parent_call_id`` names the call
it most likely replaces or follows (the matched call for ``reasoning_dropped`` / ``length_cut`` /
``template_not_prefix``, else the latest non-auxiliary call), with ``fork_reason`` set, so a link with a fork
reason never means "extends"; the first call has neither (``CallRecord`` allows a fork reason only with a parent).
A retry (the same messages as an earlier call) is a sibling: that call's prompt ids, parent and reason again.

Memory is linear in a session's length (see :mod:`addon.generation.session_graph`: one copy of the history and of the
prompt
ids per session, packed); :class:`SplicePlan` still hands out tuples of ints. :meth:`SessionGraphs.drop` forgets a
session when the collector closes it; a closed session that sends again starts a new graph (its next call renders
in full).
Correctness property (tested): with an append-only template and sampled ids equal to the tokenisation of the
turn's text plus the end-of-turn id, the spliced ids equal a fresh render of the conversation.

Organisation: reasons, config and plan; canonical keys and the shared context; the template probe
(:class:`SpliceRenderer`); :func:`plan` and :func:`record`.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from addon.generation.lead_cache import LeadCache
from addon.generation.lineage import (
    FORK_REASONS,
    Context,
    ForkReason,
    SplicePlan,
    SpliceReason,
    assistant_key,
    assistant_message,
    message_key,
    same_message,
)
from addon.generation.parser import CallKind
from addon.generation.render import (
    PromptRenderer,
    TemplateMessage,
    ToolMode,
    convert_message,
)
from addon.generation.session_graph import CallNode, SessionGraphs, SessionState
from addon.records import token_ids
from converters.canonical import (
    Completion,
    FinishReason,
    Message,
    ModelRequest,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolSpec,
)


@dataclass(frozen=True)
class SpliceConfig:
    length_policy: Literal["close", "fork"] = "close"
    """``close``: extend a parent cut by max tokens, appending the template's end-of-turn ids; ``fork``: do not."""
    full_render: bool = False
    """Render the whole conversation as text to check the suffix even when the template is message-local."""


# --------------------------------------------------------------------------------------------- template probe

_MARK = "splice_probe_q7"


class SpliceRenderer:
    """A :class:`PromptRenderer` plus what splicing needs to know about its template, probed once.

    * ``close_text``: what the template writes after an assistant turn's content (ChatML ``"<|im_end|>\\n"``);
      ``eot_id``: its first token when that is a special token (the end-of-turn the model samples), else None.
    * ``local``: the template renders a suffix the same whatever history precedes it (checked on probes).
    * ``renders_reasoning``: reasoning of an earlier turn appears in the rendered history.
    * ``leads``: a full render (a first call, a fork, a side request) takes the ids of its leading turn from the
      process-wide :class:`~addon.generation.lead_cache.LeadCache` and tokenises only the rest (a long rest in
      pieces cut after end-of-turn tokens, in parallel on the Rust tokenizer's thread pool).
    """

    def __init__(self, renderer: PromptRenderer, config: SpliceConfig | None = None) -> None:
        self.renderer = renderer
        self.config = config or SpliceConfig()
        user = {"role": "user", "content": "hello"}
        turn = self.apply([user, {"role": "assistant", "content": _MARK}], generation=False)
        if _MARK not in turn:
            raise ValueError("the chat template does not render an assistant turn's content")
        self.close_text = turn[turn.index(_MARK) + len(_MARK) :]
        tok = renderer.tokenizer
        close_ids = renderer.encode(self.close_text) if self.close_text else ()
        special = set(tok.all_special_ids)
        self.eot_id: int | None = close_ids[0] if close_ids and close_ids[0] in special else None
        eot_text = tok.decode([self.eot_id]) if self.eot_id is not None else ""
        self.close_rest = self.close_text[len(eot_text) :] if self.close_text.startswith(eot_text) else None
        # the ids of a rendered prompt's leading turn (instructions, tools), shared by the process's sessions
        self.leads = LeadCache(renderer.encode, eot_text, encode_batch=renderer.token_encoder.encode_batch)
        self.renders_reasoning = self._probe_reasoning()
        self.local = self._probe_local()

    @property
    def mode(self) -> ToolMode:
        return "native" if self.renderer.capabilities.native_tools else "fallback"

    def apply(self, messages: Sequence[TemplateMessage], generation: bool, tools: Any = None) -> str:
        r = self.renderer
        text = r.tokenizer.apply_chat_template(
            list(messages), tools=tools, chat_template=r.template, tokenize=False, add_generation_prompt=generation
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def convert(self, msg: Message, names: dict[str, str]) -> list[TemplateMessage]:
        r = self.renderer
        return convert_message(msg, r.capabilities, self.mode, r.spec, names)

    def _probe_reasoning(self) -> bool:
        turn = Message("assistant", (ReasoningPart(_MARK), TextPart("ok")))
        messages = [{"role": "user", "content": "a"}, *self.convert(turn, {}), {"role": "user", "content": "b"}]
        try:
            return _MARK in self.apply(messages, generation=True)
        except Exception:  # a template refusing the probe renders nothing we could compare: be conservative
            return True

    def _probe_local(self) -> bool:
        """Suffixes rendered after a short and a long history (with and without a system message) agree."""
        sys = [{"role": "system", "content": "rules"}]
        turn = [{"role": "assistant", "content": "done"}]
        short = [{"role": "user", "content": "go"}, *turn]
        long = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, *short]
        nxt = {"role": "user", "content": "next"}
        suffixes = ([nxt], [{"role": "system", "content": "mid"}, nxt])
        try:
            for tail in suffixes:
                got = {self._suffix(h, tail) for h in (short, long, sys + short, sys + long)}
                if len(got) != 1 or None in got:
                    return False
        except Exception:
            return False
        return True

    def _suffix(self, history: list[TemplateMessage], tail: list[TemplateMessage]) -> str | None:
        before = self.apply(history, generation=False)
        after = self.apply(history + tail, generation=True)
        return after[len(before) :] if after.startswith(before) else None


# --------------------------------------------------------------------------------------------- plan and record


def plan(state: SessionState, request: ModelRequest, splicer: SpliceRenderer, *, auxiliary: bool = False) -> SplicePlan:
    """The prompt ids for ``request`` (see the module docstring). Raises ConversionError as rendering does."""
    decided = _decide(state, request, splicer, auxiliary)
    return decided if isinstance(decided, SplicePlan) else _root(request, splicer, *decided)


def plan_without_root(state: SessionState, request: ModelRequest, splicer: SpliceRenderer) -> SplicePlan | None:
    """:func:`plan` of a call that extends or retries an earlier one; None when it needs a new root (a full render
    of the conversation, tens of milliseconds at 32k tokens), which the caller makes elsewhere with :func:`plan`."""
    decided = _decide(state, request, splicer, False)
    return decided if isinstance(decided, SplicePlan) else None


def _decide(
    state: SessionState, request: ModelRequest, splicer: SpliceRenderer, auxiliary: bool
) -> SplicePlan | tuple[ForkReason, CallNode | None]:
    """The plan of a call that extends or retries an earlier one, else why it is a new root and its parent."""
    predecessor = next((n for n in reversed(state.nodes) if not n.auxiliary), None)
    if auxiliary:
        return "auxiliary", predecessor
    if predecessor is None:
        return "first_call", None
    context = Context.of(request)
    near: tuple[ForkReason, CallNode] | None = None  # a call the request follows, but that cannot be extended
    for node in reversed(state.nodes):
        if node.auxiliary or not node.context.same(context):
            continue
        match = _match(node, request.messages, splicer)
        if match == "retry":
            return replace(node.plan, prompt_ids=state.prompt_ids(node), retry_of=node.call_id, packed=None)
        if match == "extends":
            if not node.completion_ids:
                continue  # nothing was sampled (a budget stop's canned answer): no ids stand for the turn
            if node.finish_reason == "length" and splicer.config.length_policy == "fork":
                near = near or ("length_cut", node)
                continue
            spliced = _splice(node, state.packed_ids(node), request, splicer)
            if spliced is not None:
                return spliced
            near = near or ("template_not_prefix", node)
        elif match == "reasoning_dropped":
            near = near or ("reasoning_dropped", node)
    if near is not None:
        return near
    if not context.same_instructions(predecessor.context):
        return "instructions_changed", predecessor
    if not context.same_tools(predecessor.context):
        return "tools_changed", predecessor
    return "history_rewritten", predecessor


def _match(
    node: CallNode, messages: tuple[Message, ...], splicer: SpliceRenderer
) -> Literal["retry", "extends", "reasoning_dropped", "none"]:
    """How ``messages`` relate to ``node``: strictly, then with reasoning ignored (a harness dropped it)."""
    k = len(node.messages)
    if len(messages) < k or (k < len(messages) and messages[k].role != "assistant") or len(messages) == k + 1:
        return "none"  # shorter, the turn missing, or nothing new after it
    ours = node.messages + (node.assistant,) if len(messages) > k else node.messages
    for keep in (True, False):
        # Equal as parsed (one tuple comparison, the common case), else message by message canonically.
        same = keep and ours[:k] == messages[:k] and all(map(same_message, ours[k:], messages[k : len(ours)]))
        if same or all(same_message(a, b, keep_reasoning=keep) for a, b in zip(ours, messages, strict=False)):
            retry_or_extend: Literal["retry", "extends"] = "retry" if len(messages) == k else "extends"
            if keep or not splicer.renders_reasoning:  # no earlier reasoning shows: dropping it changes nothing
                return retry_or_extend
            return "reasoning_dropped"
    return "none"


def _splice(
    node: CallNode, prompt_ids: array[int], request: ModelRequest, splicer: SpliceRenderer
) -> SplicePlan | None:
    """Extend ``node``: its ids, then the tokenised suffix; None when the template check fails."""
    head = node.context.head(splicer.renderer, request)
    messages = request.messages
    k = len(node.messages)
    lead = len(node.context.lead)
    names = _call_names(messages) if head.mode == "native" else {}
    if splicer.local and not splicer.config.full_render:
        context = [m for msg in messages[max(lead, k - 1) : k] for m in splicer.convert(msg, names)]
    else:
        context = [m for msg in messages[lead:k] for m in splicer.convert(msg, names)]
    base = list(head.messages) + context
    turn = splicer.convert(messages[k], names)
    new = [m for msg in messages[k + 1 :] for m in splicer.convert(msg, names)]
    tools = list(head.tools) if head.tools else None
    try:
        opened = splicer.apply(base, generation=True, tools=tools)
        closed = splicer.apply(base + turn, generation=False, tools=tools)
        full = splicer.apply(base + turn + new, generation=True, tools=tools)
    except Exception:  # the template refused this shape (e.g. role order checks): a fresh render decides
        return None
    if not (closed.startswith(opened) and full.startswith(closed) and closed.endswith(splicer.close_text)):
        return None
    ended = splicer.eot_id is not None and node.completion_ids[-1:] == (splicer.eot_id,)
    if ended and splicer.close_rest is None:
        return None  # the end-of-turn token's text does not start the close: the glue is unknown
    glue = splicer.close_rest if ended and splicer.close_rest is not None else splicer.close_text
    suffix = glue + full[len(closed) :]
    kinds = tuple((t.name, _kind(t)) for t in head.offered)
    packed = prompt_ids + array("i", node.completion_ids + splicer.renderer.encode(suffix))  # one copy of the long part
    # the ids as a sequence over that same array: a tuple of them cost 3 ms per call at 131k tokens
    ids = token_ids.FrozenIds.adopt(packed)
    return SplicePlan(ids, "extends", node.call_id, node.tokens, suffix, head.mode, kinds, packed=packed)


def _root(request: ModelRequest, splicer: SpliceRenderer, reason: ForkReason, parent: CallNode | None) -> SplicePlan:
    rendered = splicer.renderer.render(request, encode=splicer.leads.encode)
    parent_id = parent.call_id if parent is not None else None
    # packed here, on the planning thread, as a splice packs its ids: the engine request, the engine prompt's JSON
    # list and the session graph then take the array as it is (a tuple left the packing, its check and the JSON
    # list of the whole prompt to the event loop: 0.8 / 2.1 / 8.9 ms per new root at 11k / 35k / 131k ids)
    ids = token_ids.FrozenIds(rendered.prompt_ids, "rendered prompt ids")
    return SplicePlan(
        ids, reason, parent_id, 0, rendered.prompt_text, rendered.mode, rendered.tool_kinds, packed=ids.packed
    )


def _call_names(messages: Sequence[Message]) -> dict[str, str]:
    return {p.id: p.name for m in messages for p in m.parts if isinstance(p, ToolCallPart)}


def _kind(tool: ToolSpec) -> CallKind:
    return "custom" if tool.kind == "custom" else "function"


def record(
    state: SessionState,
    call_id: str,
    request: ModelRequest,
    plan: SplicePlan,
    completion: Completion,
    completion_ids: Sequence[int],
    finish_reason: FinishReason | None,
) -> CallNode:
    """Add the finished call as a node (a later call may extend it). ``completion`` is what the proxy returned,
    ``completion_ids`` what the engine sampled."""
    context = Context.of(request)
    parent = state.node(plan.parent_call_id) if plan.reason == "extends" and plan.parent_call_id else None
    node = CallNode(
        call_id=call_id,
        messages=request.messages,
        assistant=assistant_message(completion),
        # A call that extends its parent has its instructions and tools (checked): share the object and its caches.
        context=parent.context if parent is not None else context,
        prompt_len=len(plan.prompt_ids),
        completion_ids=tuple(completion_ids),
        finish_reason=finish_reason,
        plan=replace(plan, prompt_ids=(), packed=None),
    )
    packed = plan.packed if plan.packed is not None and len(plan.packed) == len(plan.prompt_ids) else None
    state.add(node, packed if packed is not None else plan.prompt_ids)
    return node


__all__ = [
    "FORK_REASONS",
    "CallNode",
    "Context",
    "ForkReason",
    "SessionGraphs",
    "SessionState",
    "SpliceConfig",
    "SplicePlan",
    "SpliceReason",
    "SpliceRenderer",
    "assistant_key",
    "assistant_message",
    "message_key",
    "plan",
    "plan_without_root",
    "record",
    "same_message",
]

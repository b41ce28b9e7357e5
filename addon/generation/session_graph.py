"""A session's prefix graph: the calls recorded so far (:class:`CallNode`), their prompt ids held packed
(:class:`SessionState`), and the map of live sessions with its eviction and explicit drop (:class:`SessionGraphs`).

Contract
--------
Pure data, no I/O. :mod:`addon.generation.splice` decides what a new call extends (``plan``) and adds finished calls
(``record``); this module only holds them. The caller holds ``SessionState.lock`` around both (they may run in a
worker thread). ``SessionGraphs`` is thread-safe (its own lock).

Memory is linear in a session's length: a node's prompt ids are kept only until a call extends it (they are the
head of that child's prompt, and are sliced from it in the rare case they are needed again), and the parent's
messages then point at the child's (one copy of the history per session). Held ids are packed (``array('i')``, 4
bytes per id instead of a tuple slot and an int object, ~36); :meth:`SessionState.prompt_ids` hands out a tuple.

Lifetime: a graph lives until :meth:`SessionGraphs.drop` (the collector closed the session: the generator registers
it with :meth:`addon.generation.sessions.SessionRegistry.on_close`), until it is idle for ``idle_s``, or until the cap
on token
ids held evicts it (least recently used first). A session that calls again after that starts a new graph: its next
call is rendered in full.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from addon.generation.lineage import Context, SplicePlan
from addon.records import token_ids
from converters.delta import ListMemo, same_objects

if TYPE_CHECKING:
    from converters.canonical import FinishReason, Message


@dataclass(frozen=True)
class CallNode:
    call_id: str
    messages: tuple[Message, ...]  # the request's messages, as parsed
    assistant: Message  # what the proxy returned (assistant_message of the completion)
    context: Context
    prompt_len: int  # the prompt ids live in the session state (see SessionState.prompt_ids)
    completion_ids: tuple[int, ...]
    finish_reason: FinishReason | None  # "length": the sampled ids lack the end-of-turn token
    plan: SplicePlan  # as planned, with prompt_ids left out

    @property
    def auxiliary(self) -> bool:
        return self.plan.reason == "auxiliary"

    @property
    def tokens(self) -> int:
        return self.prompt_len + len(self.completion_ids)


@dataclass
class SessionState:
    """One session's graph. Hold ``lock`` around :func:`plan` and :func:`record`.

    Memory stays linear in the session's length: a node's prompt ids are kept only until a call extends it; then
    they are the head of that child's prompt (and are sliced from it in the rare case they are needed again). They
    are held packed (``array('i')``): a long session's prompt is most of what a proxy keeps in memory.
    """

    session_id: str
    last_used: float = 0.0
    nodes: list[CallNode] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ids: dict[str, array[int]] = field(default_factory=dict, repr=False)  # nodes not extended yet, packed
    _extended_by: dict[str, str] = field(default_factory=dict, repr=False)  # node -> a child that extends it
    # The last prompt sent to the engine and its JSON list, so the next call formats only its new ids
    # (token_ids.JsonIds.extending): ~6 bytes of text per id, dropped with the graph.
    engine_prompt: token_ids.JsonIds | None = field(default=None, repr=False)
    # The last main request's body and its conversation items as parsed, so the next call decodes and parses only
    # the items after the first byte that changed (converters.delta): about the conversation's size in bytes.
    request_memo: ListMemo | None = field(default=None, repr=False)
    # The completion ids all nodes hold, kept as nodes are added: the memory cap's once-a-second sum over every
    # session (SessionGraphs.evict, on the event loop) walked every node of every session (2 ms at 384 x 100 nodes).
    _completion_tokens: int = field(default=0, repr=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False)  # call id -> its node's place in ``nodes``

    def node(self, call_id: str) -> CallNode | None:
        # by index: a scan of the nodes, newest first, went through all of them for each new call's duplicate check
        k = self._index.get(call_id)
        return None if k is None else self.nodes[k]

    def prompt_ids(self, node: CallNode) -> tuple[int, ...]:
        return tuple(self.packed_ids(node))

    def packed_ids(self, node: CallNode) -> array[int]:
        """The node's prompt ids as held (read-only: may be the held array itself)."""
        call_id = node.call_id
        while call_id not in self._ids:
            call_id = self._extended_by[call_id]
        ids = self._ids[call_id]
        return ids if len(ids) == node.prompt_len else ids[: node.prompt_len]

    def add(self, node: CallNode, prompt_ids: Sequence[int]) -> None:
        if self.node(node.call_id) is not None:
            raise ValueError(f"call {node.call_id} is already in session {self.session_id}")
        sibling = self._ids.get(node.plan.retry_of) if node.plan.retry_of else None
        if sibling is not None and len(sibling) == len(prompt_ids):
            packed = sibling
        elif isinstance(prompt_ids, array) and prompt_ids.typecode == "i":
            packed = prompt_ids  # already packed by the splice (held as is: nobody writes to it)
        else:
            packed = array("i", prompt_ids)
        self._index[node.call_id] = len(self.nodes)
        self.nodes.append(node)
        self._completion_tokens += len(node.completion_ids)
        self._ids[node.call_id] = packed  # a retry shares its sibling's array while that one is held
        parent = node.plan.parent_call_id
        if node.plan.reason == "extends" and parent is not None:
            self._share_history(parent, node)
            if parent not in self._extended_by:
                self._extended_by[parent] = node.call_id
                self._ids.pop(parent, None)

    def _share_history(self, parent_id: str, child: CallNode) -> None:
        """The child extends the parent, so :func:`plan` found the parent's messages equal (by :func:`message_key`,
        all that matching reads) to the child's first ones: point the parent — and every node sharing its message
        objects, its ancestors — at the child's objects. A session then holds one copy of its history, not one per
        call (each request is parsed anew; found by benchmarks/soak.py, whose memory grew with the square of the
        session length). Identity checks keep this O(nodes) per call; the records keep what each call was sent."""
        parent = self.node(parent_id)
        assert parent is not None
        old, head = parent.messages, child.messages[: len(parent.messages)]
        if len(head) != len(old):
            return
        # The first message that is another object in the child. The delta parse (converters.delta) hands the
        # child the parent's unchanged message objects, so this is usually the end (one copy already) or near it:
        # a harness that edits an old message (Claude Code moves its cache_control marker) re-parses from there.
        same = same_objects(old, head)
        if same == len(old):
            return
        # Only the nodes whose history reaches past ``same`` hold objects the child does not: re-pointing the
        # others would swap a tuple of the very same objects (a dataclasses.replace per node per call: O(session
        # length) per call, ~0.25 ms at 250 calls).
        for k, n in enumerate(self.nodes):
            m = n.messages
            if same < len(m) <= len(old) and m[-1] is old[len(m) - 1]:
                self.nodes[k] = replace(n, messages=head[: len(m)])

    @property
    def tokens_held(self) -> int:
        unique = {id(ids): len(ids) for ids in self._ids.values()}  # a retry shares its sibling's array
        return sum(unique.values()) + self._completion_tokens


class SessionGraphs:
    """Session id -> :class:`SessionState`, evicted after ``idle_s`` unused or, least recently used first, while
    more than ``max_tokens`` token ids are held in all."""

    def __init__(self, *, idle_s: float = 3600.0, max_tokens: int = 20_000_000) -> None:
        self.idle_s = idle_s
        self.max_tokens = max_tokens
        self._states: dict[str, SessionState] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str, now: float) -> SessionState:
        with self._lock:
            state = self._states.get(session_id)
            if state is None:
                state = self._states[session_id] = SessionState(session_id)
            state.last_used = now
            return state

    def drop(self, session_id: str) -> bool:
        """Forget a session's graph (the collector closed it); True when there was one. A call of that session
        still in flight records into the dropped state, which then goes away with it."""
        with self._lock:
            return self._states.pop(session_id, None) is not None

    def __len__(self) -> int:
        return len(self._states)

    @property
    def tokens_held(self) -> int:
        """Token ids held by all the graphs (what ``max_tokens`` caps)."""
        with self._lock:
            return sum(s.tokens_held for s in self._states.values())

    @property
    def nodes_held(self) -> int:
        with self._lock:
            return sum(len(s.nodes) for s in self._states.values())

    def evict(self, now: float) -> list[str]:
        """Drop idle sessions, then the least recently used until under the cap; returns the evicted ids."""
        with self._lock:
            gone = [sid for sid, s in self._states.items() if now - s.last_used > self.idle_s]
            for sid in gone:
                del self._states[sid]
            held = {sid: s.tokens_held for sid, s in self._states.items()}
            total = sum(held.values())
            for sid in sorted(self._states, key=lambda k: self._states[k].last_used):
                if total <= self.max_tokens:
                    break
                total -= held[sid]
                del self._states[sid]
                gone.append(sid)
            return gone


__all__ = ["CallNode", "SessionGraphs", "SessionState"]

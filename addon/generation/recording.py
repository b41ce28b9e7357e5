"""A call's state while it runs, and its :class:`~addon.records.schema.CallRecord`, built in two halves.

Contract
--------
:class:`CallInfo` is who made a call (filled in by the proxy); :class:`Turn` is the call's mutable state while the
engine streams. :func:`build_record` makes the call's row from a turn and its completion.

Why two halves: most of a row is known before the engine samples a token — the canonical request's JSON and its
zstd blob, the prompt ids packed as an Arrow array, the identity hints — and at a long context it is most of the
row's cost (milliseconds at 128k tokens). :func:`prelude` builds that half; the generator runs it in a worker thread
while the engine generates, so after the engine's last token only the sampled part is packed before the durable
append (:func:`build_record` with ``prepared=``). Without a prelude (a call refused before it was planned, a
benchmark timing the whole build) :func:`build_record` builds everything itself; the row is the same.

Pure and synchronous: no I/O, safe to run in a worker thread (``CanonicalJson`` is thread-safe).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from addon.generation.lineage import SplicePlan
from addon.records.blob_frames import RequestFrames
from addon.records.blobs import CanonicalJson, dumps_json, pack_json_text, plain
from addon.records.schema import MALFORMED_TOOL_CALLS, CallRecord, TurnTokens
from converters.accumulate import Accumulator
from converters.base import Route
from converters.canonical import Completion, JsonObjectFormat, JsonSchemaFormat, ModelRequest


@dataclass(frozen=True)
class CallInfo:
    """Who made the call and when; filled in by the proxy before generation."""

    run_id: str
    session_id: str
    route: Route
    headers: Mapping[str, str]
    received_at: datetime
    harness: str = "unknown"
    harness_version: str | None = None
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class RecordPrelude:
    """The half of a call's row known before the engine answers (see the module docstring)."""

    request_canonical: bytes
    tokens: TurnTokens  # the prompt ids, packed; no completion yet
    identity_hints: dict[str, str]
    auxiliary_reason: str | None
    sampling_requested: Mapping[str, Any]


@dataclass
class Turn:
    """Mutable per-call state while the engine streams."""

    request: ModelRequest
    info: CallInfo
    call_index: int
    prompt_ids: Sequence[int] = ()
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    applied: dict[str, Any] = field(default_factory=dict)
    first_token_at: datetime | None = None
    engine_started: float = 0.0
    engine_done: float = 0.0
    error: str | None = None
    incomplete: bool = False
    policy_version: int | None = None
    engine_wait_ms: int | None = None  # set when the call had to wait for an engine that could take it
    malformed: int = 0
    recorded: bool = False
    plan: SplicePlan | None = None
    acc: Accumulator | None = None  # the answer so far, once generation started
    prelude: Awaitable[RecordPrelude | None] | None = None  # the row's first half, built while the engine samples
    lone: bool = False  # no other call was in flight when it arrived (addon.generation.planning)


def prelude(
    request: ModelRequest,
    prompt_ids: Sequence[int],
    canonical_json: CanonicalJson | None,
    session: str | None = None,
    frames: RequestFrames | None = None,
) -> RecordPrelude:
    """What :func:`build_record` would compute from the request and the prompt ids alone.

    With ``canonical_json`` (the Generator's, shared by all sessions) its cost follows the new suffix: the request's
    messages and tools are JSON-encoded once per distinct value, and with ``session`` the ones equal to that
    session's previous request are not even hashed (a side call is neither compared with nor remembered as the
    session's previous request: the tool loop's next call compares with the loop's last one); without it the whole
    request is encoded (same text). With ``frames`` too, the blob's zstd also follows the new suffix: the frames of
    the session's previous blob are reused (:mod:`addon.records.blob_frames`; the same content, in several frames).
    Raises ValueError for prompt ids that are not token ids, as the row would."""
    reason = auxiliary_reason(request)
    session = session if reason is None else None
    if canonical_json is None:
        blob = pack_json_text(dumps_json(plain(request)))
    elif frames is None or session is None:
        blob = pack_json_text(canonical_json.request(request, session))
    else:
        blob = frames.pack(*canonical_json.request_layout(request, session), session)
    return RecordPrelude(
        request_canonical=blob,
        tokens=TurnTokens(prompt_ids),  # packed ids (FrozenIds) are held as they are, not as a tuple
        identity_hints=_identity(request),
        auxiliary_reason=reason,
        sampling_requested=plain(request.sampling),
    )


def build_record(
    turn: Turn,
    completion: Completion | None,
    served_model: str,
    budget_stop: str | None,
    canonical_json: CanonicalJson | None = None,
    prepared: RecordPrelude | None = None,
) -> CallRecord:
    """The call's row; ``prepared`` (:func:`prelude` of this turn's request and prompt ids) saves rebuilding the
    part known before the engine answered."""
    req, info = turn.request, turn.info
    pre = prepared if prepared is not None else prelude(req, turn.prompt_ids, canonical_json)
    names = tuple(c.name for c in completion.tool_calls) if completion else ()
    return CallRecord(
        run_id=info.run_id,
        session_id=info.session_id,
        call_index=turn.call_index,
        call_id=info.call_id,
        harness=info.harness,
        harness_version=info.harness_version,
        wire_format=req.format,
        route=info.route.path,
        model=req.model,
        served_model=served_model,
        policy_version=turn.policy_version,
        received_at=info.received_at,
        first_token_at=turn.first_token_at,
        done_at=datetime.now(UTC),
        tokens=pre.tokens.with_completion(turn.completion_ids, turn.logprobs),
        finish_reason=completion.finish_reason if completion and not turn.incomplete else None,
        tool_call_names=names,
        auxiliary=pre.auxiliary_reason is not None,
        auxiliary_reason=pre.auxiliary_reason,
        sampling_requested=pre.sampling_requested,
        sampling_applied=turn.applied,
        request_canonical=pre.request_canonical,
        completion_canonical=pack_json_text(dumps_json(plain(completion))) if completion else None,
        error=turn.error or (f"{MALFORMED_TOOL_CALLS}{turn.malformed}" if turn.malformed else None),
        budget_stop=budget_stop,
        incomplete=turn.incomplete,
        identity_hints=pre.identity_hints,
        parent_call_id=turn.plan.parent_call_id if turn.plan else None,
        fork_reason=turn.plan.fork_reason if turn.plan else None,
        prompt_reused_tokens=turn.plan.reused_tokens if turn.plan else 0,
        engine_wait_ms=turn.engine_wait_ms,
    )


def auxiliary_reason(request: ModelRequest) -> str | None:
    """A side request (title generation, classifiers, memory extraction) asks for structured output and offers no
    tools; it is recorded but excluded from training by default. Detected from the request, never the model name."""
    if isinstance(request.output_format, JsonSchemaFormat | JsonObjectFormat) and not request.tools:
        return "structured_output"
    return None


def _identity(req: ModelRequest) -> dict[str, str]:
    ident = req.identity
    out = {f"header:{k}": v for k, v in ident.headers.items()}
    for name in ("user_id", "session_id", "prompt_cache_key", "user_agent"):
        value = getattr(ident, name)
        if value:
            out[name] = value
    return out


__all__ = ["CallInfo", "RecordPrelude", "Turn", "auxiliary_reason", "build_record", "prelude"]

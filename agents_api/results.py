"""What a turn runner returns (:class:`TurnResult`), what a run's stop handler sees and answers
(:class:`RunStop`, :class:`StopVerdict`), and what the loop returns (:class:`LoopResult`).

The models cross the boundary between user code and the loop: a runner or a stop handler
returning the wrong shape gets a clear error instead of a ``KeyError`` three turns later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.errors import InvalidTurnResult
from agents_api.message import Message
from agents_api.records import LoopStatus

__all__ = ["Decision", "LoopResult", "LoopStatus", "RunStop", "StopVerdict", "TurnAnswer",
           "TurnResult", "coerce_turn_result", "empty_usage", "terminal_payload"]


def empty_usage() -> dict[str, Any]:
    """The usage of a run that made no provider call."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


class TurnResult(BaseModel):
    """One provider turn as the turn runner saw it.

    ``tool_calls`` are ``{"id", "name", "parameters"}`` dicts; the loop (not the runner) executes
    them. ``continuation_messages`` are appended after the tool results (a completion nudge, for
    example) and keep the loop going. ``complete=True`` ends the run after this turn even when
    there were tool calls.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    content: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    request_metadata: dict[str, Any] = Field(default_factory=dict)
    complete: bool = False
    continuation_messages: list[Message] = Field(default_factory=list)
    # Pause the run after this turn, before its tool calls run (see agents_api.pause): what
    # the run waits for; the calls wait with it.
    pause: dict[str, Any] | None = None


@dataclass(slots=True)
class TurnAnswer:
    """A turn's answer as the loop keeps it: :class:`TurnResult`'s fields, already checked.

    The loop turns whatever a runner returns into one of these. A runner that makes every value
    itself (datamachine's provider runner) may return one directly: it is taken as it is, with
    no validation, which saves building and checking a pydantic model every turn. Anything a
    runner cannot vouch for belongs in a :class:`TurnResult` or a dict. Not changed after the
    loop receives it.
    """

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    request_metadata: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    continuation_messages: list[Message] = field(default_factory=list)
    pause: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: TurnResult) -> TurnAnswer:
        """The answer a validated ``TurnResult`` holds."""
        return cls(result.content, result.tool_calls, result.usage, result.request_metadata,
                   result.complete, result.continuation_messages, result.pause)

    def to_turn_result(self) -> TurnResult:
        """The answer as the public model (what ``should_continue`` receives)."""
        return TurnResult(content=self.content, tool_calls=self.tool_calls, usage=self.usage,
                          request_metadata=self.request_metadata, complete=self.complete,
                          continuation_messages=self.continuation_messages, pause=self.pause)


def coerce_turn_result(value: object, turn: int) -> TurnAnswer:
    """Accept a TurnAnswer, a TurnResult or a mapping of its fields; anything else is an
    InvalidTurnResult."""
    if type(value) is TurnAnswer:
        return value
    if isinstance(value, TurnResult):
        return TurnAnswer.of(value)
    if isinstance(value, Mapping):
        try:
            return TurnAnswer.of(TurnResult(**dict(value)))
        except ValidationError as exc:
            fields = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidTurnResult(f"turn {turn}: the turn runner returned {fields}") from None
    raise InvalidTurnResult(
        f"turn {turn}: the turn runner must return a TurnResult or a dict of its fields, "
        f"got {type(value).__name__}."
    )


class Decision(BaseModel):
    """A completion policy's verdict: stop now (``complete``) or keep going, optionally with a
    ``message`` appended as a user turn before the next request."""

    model_config = ConfigDict(defer_build=True)

    complete: bool
    message: str = ""
    context: dict[str, Any] = Field(default_factory=dict)


# Never changed by the loop once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class RunStop:
    """What a run's stop handler (``on_stop``) sees: the run as the loop stopped it.

    ``status``, ``budget``, ``error`` and ``error_code`` are the loop's verdict; ``messages`` the
    transcript so far (read it, do not change it: a handler adds messages through its
    :class:`StopVerdict`); ``budgets`` a snapshot per budget.
    """

    status: LoopStatus
    budget: str | None
    error: str | None
    error_code: str | None
    messages: list[Message]
    final_content: str
    turn_count: int
    usage: dict[str, Any]
    budgets: dict[str, dict[str, Any]]
    last_tool_calls: list[dict[str, Any]]
    tool_execution_results: list[dict[str, Any]]
    session_id: str | None
    flags: list[str] = field(default_factory=list)
    warning: str | None = None
    pending: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: LoopResult) -> RunStop:
        """The stop a finished result describes (for a product deciding after the loop)."""
        return cls(
            status=result.status, budget=result.budget, error=result.error,
            error_code=result.error_code, messages=result.messages,
            final_content=result.final_content, turn_count=result.turn_count,
            usage=dict(result.usage), budgets=result.budgets,
            last_tool_calls=result.last_tool_calls,
            tool_execution_results=result.tool_execution_results,
            session_id=result.transcript_session_id, flags=list(result.flags),
            warning=result.warning, pending=result.pending)


class StopVerdict(BaseModel):
    """A stop handler's answer, applied to the result once, before it is stored or reported.

    Fields it sets replace the loop's (``status``, ``budget``, ``flags``, ``warning``,
    ``error``, ``error_code``, ``final_content``, ``pending``); fields it leaves out keep the
    loop's.
    ``messages`` are appended to the transcript (a final summary), ``usage`` is added to the
    run's usage (a call made after the last turn), ``warnings`` are appended and ``metadata``
    (product diagnostics that persisters store) is merged.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    status: LoopStatus | None = None
    budget: str | None = None
    flags: list[str] = Field(default_factory=list)
    warning: str | None = None
    error: str | None = None
    error_code: str | None = None
    final_content: str = ""
    messages: list[Message] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    pending: dict[str, Any] | None = None


class LoopResult(BaseModel):
    """The normalized outcome of one run of the generic loop; built once, never changed.

    ``status`` says why the run stopped; ``budget`` names the budget that stopped it (with its
    ``max_<name>_reached`` flag in ``flags``); ``budgets`` snapshots every budget of the run.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    messages: list[Message]
    final_content: str = ""
    turn_count: int = 0
    completed: bool = False
    status: LoopStatus = "completed"
    budget: str | None = None
    flags: list[str] = Field(default_factory=list)
    warning: str | None = None
    error: str | None = None
    error_code: str | None = None
    usage: dict[str, Any] = Field(default_factory=empty_usage)
    tool_execution_results: list[dict[str, Any]] = Field(default_factory=list)
    last_tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    request_metadata: dict[str, Any] = Field(default_factory=dict)
    budgets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    transcript_session_id: str | None = None
    warnings: list[str] = Field(default_factory=list)
    # Product diagnostics a stop handler adds (a blocker, completion diagnostics); persisters
    # store them with the transcript.
    metadata: dict[str, Any] = Field(default_factory=dict)
    # What an ``awaiting_confirmation`` run waits for (see agents_api.pause); else None.
    pending: dict[str, Any] | None = None


def terminal_payload(result: Any) -> dict[str, Any]:
    """The payload of a run's terminal event (``completed`` or ``failed``) from its result (a
    ``LoopResult`` or anything with its fields): every emitter of that event uses this one."""
    return {
        "status": result.status, "turn": result.turn_count, "turn_count": result.turn_count,
        "message_count": len(result.messages),
        "tool_results": len(result.tool_execution_results), "budget": result.budget,
        "budgets": result.budgets, "error": result.error, "error_code": result.error_code,
        "pending": getattr(result, "pending", None),
    }

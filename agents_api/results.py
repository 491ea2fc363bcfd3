"""What a turn runner returns (:class:`TurnResult`) and what the loop returns (:class:`LoopResult`).

Both are pydantic models because they cross the boundary between user code and the loop: a
runner returning the wrong shape gets a clear error instead of a ``KeyError`` three turns later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.errors import InvalidTurnResult
from agents_api.message import Message

__all__ = ["Decision", "LoopResult", "LoopStatus", "TurnResult", "coerce_turn_result"]

LoopStatus = Literal[
    "completed", "incomplete", "budget_exceeded", "aborted", "error", "transcript_lock_contention"
]


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


def coerce_turn_result(value: object, turn: int) -> TurnResult:
    """Accept a TurnResult or a mapping of its fields; anything else is an InvalidTurnResult."""
    if isinstance(value, TurnResult):
        return value
    if isinstance(value, Mapping):
        try:
            return TurnResult(**dict(value))
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


class LoopResult(BaseModel):
    """The normalized outcome of one run of the generic loop.

    ``status`` says why the run stopped; ``budget`` names the budget that stopped it (with its
    ``max_<name>_reached`` flag in ``flags``); ``budgets`` snapshots every budget of the run.
    """

    model_config = ConfigDict(defer_build=True)

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
    usage: dict[str, Any] = Field(
        default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    )
    tool_execution_results: list[dict[str, Any]] = Field(default_factory=list)
    last_tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    request_metadata: dict[str, Any] = Field(default_factory=dict)
    budgets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    transcript_session_id: str | None = None
    warnings: list[str] = Field(default_factory=list)
    # Product diagnostics a stop handler adds (a blocker, completion diagnostics); persisters
    # store them with the transcript.
    metadata: dict[str, Any] = Field(default_factory=dict)

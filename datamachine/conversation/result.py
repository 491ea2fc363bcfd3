"""The one result every run returns: :class:`ConversationResult`.

A pydantic model so hosts get attribute access and ``.model_dump()`` gives the plain dict that the
CLI prints and the ``/chat`` endpoint returns. ``status`` is the honest answer to "why did it
stop"; the budget, flags and warning say which limit, in words a user can act on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents_api import Message

__all__ = ["ConversationResult", "ConversationStatus", "empty_usage"]

ConversationStatus = Literal[
    "completed", "incomplete", "budget_exceeded", "aborted", "error", "transcript_lock_contention",
    "awaiting_confirmation",
]


def empty_usage() -> dict[str, Any]:
    """The usage of a run that made no provider call."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


class ConversationResult(BaseModel):
    """What ``run_conversation`` returns (DESIGN.md section 5.4)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    messages: list[Message] = Field(default_factory=list)
    final_content: str = ""
    turn_count: int = 0
    cumulative_turn_count: int = 0
    completed: bool = False
    status: ConversationStatus = "completed"
    budget: str | None = None
    flags: list[str] = Field(default_factory=list)
    max_turns_reached: bool = False
    warning: str | None = None
    error: str | None = None
    error_code: str | None = None
    usage: dict[str, Any] = Field(default_factory=empty_usage)
    tool_execution_results: list[dict[str, Any]] = Field(default_factory=list)
    last_tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    request_metadata: dict[str, Any] = Field(default_factory=dict)
    completion_nudge_count: int = 0
    completion_nudge: str | None = None
    completion_assertions_required: dict[str, Any] = Field(default_factory=dict)
    completion_assertions_missing: dict[str, Any] = Field(default_factory=dict)
    completion_assertions_satisfied: dict[str, Any] = Field(default_factory=dict)
    completion_assertions_complete: bool | None = None
    unavailable_required_tool_names: list[str] = Field(default_factory=list)
    available_tool_names: list[str] = Field(default_factory=list)
    transcript_session_id: str | None = None
    budgets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    blocker: str | None = None
    # Configured pipeline handlers that never fired (configured_handler_slugs).
    remaining_handlers: list[str] = Field(default_factory=list)
    mode: str = "pipeline"
    provider: str = ""
    model: str = ""
    # The validated final answer of a run with output_type (a model instance, or the decoded
    # JSON for a schema); None otherwise, and whenever the run is not completed.
    output: Any = None
    # What an ``awaiting_confirmation`` run waits for (DESIGN.md 16): ``kind`` ("budget",
    # "chat_turn_limit" or "tool_approval"), ``budget``, ``tool_call``, and the calls waiting
    # with it (``tool_calls``); None for every other status. ``host.resume`` answers it.
    pending: dict[str, Any] | None = None

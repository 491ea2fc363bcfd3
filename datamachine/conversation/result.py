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
    # Times the run made its requests smaller than its history to fit the model's context
    # window (DESIGN.md 21; each also a ``context_compacted`` event).
    compactions: int = 0

    def _repr_markdown_(self) -> str:
        """How a notebook shows a result: the status, why the run stopped, its budgets and the
        answer (rendered as the Markdown the model wrote)."""
        turns = f"{self.turn_count} turn{'s' if self.turn_count != 1 else ''}"
        head = f"**Run {self.status.replace('_', ' ')}** (`{self.status}`) · {turns}"
        if self.transcript_session_id:
            head += f" · transcript `{self.transcript_session_id}`"
        lines = [head, "", f"**Stopped:** {_why_stopped(self)}", ""]
        if self.budgets:
            lines += ["| budget | used | ceiling | left |", "|---|---|---|---|"]
            for name, snap in self.budgets.items():
                mark = " (spent)" if snap.get("exceeded") else ""
                lines.append(f"| {_cell(name)}{mark} | {_cell(snap.get('current'))} | "
                             f"{_cell(snap.get('ceiling'))} | {_cell(snap.get('remaining'))} |")
            lines.append("")
        lines += ["**Answer**", "", self.final_content.strip() or "_(no final answer)_"]
        return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    # None is a budget without that number (an unlimited one); "|" would end the cell.
    return "-" if value is None else str(value).replace("|", "\\|")


def _why_stopped(result: ConversationResult) -> str:
    """One sentence, for a person reading the result in Python (a notebook)."""
    if result.status == "completed":
        return "the model gave its final answer."
    if result.status == "budget_exceeded":
        snap = result.budgets.get(result.budget or "", {})
        return (f"budget `{result.budget}` ran out ({snap.get('current')}/"
                f"{snap.get('ceiling')}). {result.warning or ''}").strip()
    if result.status == "error":
        return f"error `{result.error_code}`: {result.error}"
    if result.status == "awaiting_confirmation":
        return (f"paused: {result.warning or 'waiting for a person'} Answer with "
                f"`host.resume({result.transcript_session_id!r}, approve=True)` (or False).")
    if result.status == "transcript_lock_contention":
        return "another run holds this transcript's lock; nothing ran."
    if result.status == "incomplete":
        return f"incomplete: {result.blocker or result.warning or 'the task is not done'}"
    return result.warning or result.status

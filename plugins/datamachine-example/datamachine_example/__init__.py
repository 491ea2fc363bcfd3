"""datamachine-example: the plugin template, a note-taking tool bounded by its own budget.

Copy this distribution to start a plugin. It shows the two halves every bounded extension has:

- a budget the plugin owns, registered through ``register_budgets()``: ``notes_written``
  (default 5 per run, clamp [1, 50], setting ``max_notes_written``);
- a typed tool that consumes it through ``ToolContext.budget(name)``: ``write_note(text,
  kind)`` (the model's arguments checked by pydantic against the type hints) appends the note
  to the run's engine data (``engine_data["notes"]``) and spends one unit.

The loop checks every budget of the run after each tool call, so the note that reaches the
ceiling is the last one: the run stops with ``status="budget_exceeded"`` and
``budget="notes_written"``. The tool also refuses on its own once the budget is spent, so it
stays bounded when it is called outside ``run_conversation`` (a bare loop, a direct executor).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from datamachine import BudgetSpec, hookimpl
from datamachine.tools import Tool, ToolContext, tool

__all__ = ["NOTES_WRITTEN", "register_budgets", "register_tools", "write_note"]

NOTES_WRITTEN = BudgetSpec(
    name="notes_written",
    default=5,
    min=1,
    max=50,
    setting="max_notes_written",
    description="Notes the write_note tool may write in one run.",
)


@tool
def write_note(
    text: Annotated[str, Field(max_length=500)],
    context: ToolContext,
    kind: Literal["fact", "todo", "question"] = "fact",
) -> dict[str, Any]:
    """Write down a short note to keep for the rest of the task.

    Each note uses one unit of this run's notes_written budget, so note only what matters.

    Args:
        text: The note, one or two sentences.
        kind: What the note is: a fact found, something still to do, or an open question.
    """
    note = text.strip()
    if not note:
        # Refused before spending budget: an empty note is a mistake, not work.
        return {"success": False, "error_type": "empty_note",
                "error": "write_note needs some text; nothing was written."}
    budget = context.budget(NOTES_WRITTEN.name)
    if budget.exceeded():
        return {"success": False, "error_type": "budget_exceeded",
                "error": (f"The notes_written budget for this run is spent ({budget.current()} "
                          f"of {budget.ceiling()}); answer with the notes you have.")}
    budget.increment()
    notes = context.engine_data.setdefault("notes", [])
    notes.append({"kind": kind, "text": note})
    return {"note_number": len(notes), "notes_left": budget.remaining()}


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    """The budget this plugin owns."""
    return [NOTES_WRITTEN]


@hookimpl
def register_tools() -> list[Tool]:
    """The tools this plugin offers."""
    return [write_note]

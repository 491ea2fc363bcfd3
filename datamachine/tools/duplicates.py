"""Rejecting a tool call that already succeeded with the same arguments.

Models repeat themselves: they call ``search("x")`` again because they lost track, then again.
Each repeat costs a turn and often a side effect (a second post, a second email). A call whose
tool and arguments (compared as canonical JSON, so key order never matters) already succeeded
earlier in the conversation is rejected with a correction the model can act on. A call whose
earlier twin failed, or never got a result, may run again: retrying is legitimate. Tools whose
runtime says ``duplicate_policy: "repeatable"`` (a clock, a random number, a poll) are never
rejected.

The correction depends on what the model should do next, which depends on the mode: in a
pipeline it moves to the next pipeline action, in chat (and in extension modes, which behave
like chat) it answers the user, and in a system task it finishes the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from datamachine.tools.definition import Tool
from datamachine.tools.history import TranscriptIndex
from datamachine.tools.results import rejected_result

__all__ = [
    "DUPLICATE_ERROR_TYPE",
    "DUPLICATE_PREFIX",
    "check_duplicate",
    "duplicate_message",
    "duplicate_mode",
]

DUPLICATE_ERROR_TYPE = "duplicate_tool_call"
DUPLICATE_PREFIX = "DUPLICATE REJECTED:"

DuplicateMode = Literal["pipeline", "chat", "system"]

_NEXT_STEP: dict[DuplicateMode, str] = {
    "pipeline": "Use the result you already have and move on to the next required pipeline "
                "action.",
    "chat": "Continue your response to the user using the result you already have.",
    "system": "Finish the task with the result you already have.",
}


def duplicate_mode(mode: str | Sequence[str]) -> DuplicateMode:
    """Which correction a run's mode gets: ``pipeline``, ``system`` or (everything else) ``chat``.

    A run may carry several modes (a list, or a comma-separated string such as
    ``"sandbox,pipeline"``): ``pipeline`` wins over ``system``, which wins over the rest, because
    a pipeline step must never be told to stop and talk to a user who is not there.
    """
    if isinstance(mode, str):
        modes = {part.strip().lower() for part in mode.split(",")}
    else:
        modes = {str(part).strip().lower() for part in mode}
    if "pipeline" in modes:
        return "pipeline"
    if "system" in modes:
        return "system"
    return "chat"


def duplicate_message(tool_name: str, mode: str | Sequence[str]) -> str:
    """The correction the model reads, starting ``DUPLICATE REJECTED:``."""
    return (
        f"{DUPLICATE_PREFIX} {tool_name} already succeeded with these exact parameters earlier "
        "in this conversation, so it was not run again. Do not call it again with the same "
        f"parameters. {_NEXT_STEP[duplicate_mode(mode)]}"
    )


def check_duplicate(
    tool: Tool,
    key: str,
    parameters: Mapping[str, Any],
    index: TranscriptIndex,
    mode: str | Sequence[str],
) -> dict[str, Any] | None:
    """The rejection result for a repeated successful call, or None when the call may run.

    ``key`` is the canonical JSON of ``parameters``; ``index`` must already have read the
    transcript up to (not including a result for) the current call. The result is a failed
    tool result marked rejected (``results.REJECTED``) so the adapter can leave it out of
    ``tool_execution_results`` while the transcript keeps it.
    """
    if tool.repeatable or not index.succeeded(tool.name, key):
        return None
    return rejected_result(tool.name, parameters, duplicate_message(tool.name, mode),
                           DUPLICATE_ERROR_TYPE)

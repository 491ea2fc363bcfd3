"""What the loop guard sees of a turn (:class:`GuardTurn`, :class:`GuardCall`, also what the
``detect_stuck`` hook is given) and the built-in signals' names and words."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALTERNATING_CALLS",
    "BUILTIN_SIGNALS",
    "HIDDEN_TOOL_CALLED",
    "REPEATED_FAILURE",
    "REPEATED_TEXT",
    "GuardCall",
    "GuardTurn",
    "nudge_text",
]

# A call (its name and canonical arguments) that failed or was refused, made again later.
REPEATED_FAILURE = "repeated_failure"
# Two calls alternating A, B, A, B with no new successful result between them.
ALTERNATING_CALLS = "alternating_calls"
# The same assistant text as the turn before, with no tool call.
REPEATED_TEXT = "repeated_text"
# A tool the guard took away, called anyway.
HIDDEN_TOOL_CALLED = "hidden_tool_called"
BUILTIN_SIGNALS = (REPEATED_FAILURE, ALTERNATING_CALLS, REPEATED_TEXT, HIDDEN_TOOL_CALLED)


@dataclass(frozen=True, slots=True)
class GuardCall:
    """One tool call of a turn as the guard saw it: ``name``, ``arguments``, ``key`` (the name
    and canonical arguments: equal keys are the same call), ``success`` (None: refused before
    it ran, a duplicate, a runtime rule, an approval not given, a hidden tool; False: it ran
    and failed), ``error_type`` of a failed or refused one, and ``new_result``: it succeeded
    with a result the run had not had from that call before (progress)."""

    name: str
    arguments: dict[str, Any]
    key: str
    success: bool | None
    error_type: str | None = None
    new_result: bool = False

    @property
    def failed(self) -> bool:
        """It failed or was refused."""
        return self.success is not True


@dataclass(frozen=True, slots=True)
class GuardTurn:
    """One completed turn: its number, the assistant's ``text`` and its ``calls`` in order."""

    turn: int
    text: str
    calls: tuple[GuardCall, ...]


def nudge_text(signal: str, tool: str | None, times: int) -> str:
    """The ephemeral message the next request carries after a signalled turn: what repeated,
    and what to do instead."""
    if signal == REPEATED_FAILURE:
        what = (f"you called {tool!r} again with the same arguments after it failed or was "
                "refused")
    elif signal == ALTERNATING_CALLS:
        what = "you keep alternating between the same two tool calls without new results"
    elif signal == REPEATED_TEXT:
        what = "you gave the same answer as in your previous turn"
    elif signal == HIDDEN_TOOL_CALLED:
        what = f"you called {tool!r}, which was taken away because it kept repeating"
    else:
        what = f"you appear stuck ({signal}{f', tool {tool!r}' if tool else ''})"
    return (f"[LOOP GUARD: {what} ({times} turn(s) in a row without progress). Do not repeat "
            "it: read the results above, change your approach or your arguments, or give your "
            "final answer with what you have.]")

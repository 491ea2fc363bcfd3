"""The budget names the generic loop itself knows: the one home of these strings.

Every other budget is just a name to the loop. These two are special: ``tool_calls`` is checked
before each tool call (and ``tool_calls_<tool>`` per tool name), and ``wall_clock_seconds`` is
set from the clock before each turn and bounds how long a provider or tool call may run.
"""

from __future__ import annotations

__all__ = ["TOOL_CALLS", "WALL_CLOCK", "per_tool_budget"]

TOOL_CALLS = "tool_calls"
WALL_CLOCK = "wall_clock_seconds"


def per_tool_budget(tool_name: str) -> str:
    """The name of the budget that counts calls of one tool: ``tool_calls_<tool_name>``."""
    return f"{TOOL_CALLS}_{tool_name}"

"""What the loop guard does at each signalled turn: ``loop_guard`` (payload, else setting), a
list of steps climbed one per signalled turn, the last repeated (default ``["nudge",
"hide_tool", "stop"]``), or ``"off"``."""

from __future__ import annotations

from typing import Literal, cast

from agents_api.errors import brief_repr
from datamachine.errors import UsageError

__all__ = ["DEFAULT_LADDER", "STEPS", "Step", "parse_ladder"]

Step = Literal["nudge", "hide_tool", "stop"]
STEPS: tuple[Step, ...] = ("nudge", "hide_tool", "stop")
DEFAULT_LADDER: tuple[Step, ...] = ("nudge", "hide_tool", "stop")


def parse_ladder(value: object, where: str) -> tuple[Step, ...] | None:
    """``value`` as the steps to climb (None: ``"off"``, no guard); a UsageError naming
    ``where`` and the steps otherwise. None as ``value`` is the default ladder."""
    if value is None:
        return DEFAULT_LADDER
    if value == "off":
        return None
    if (not isinstance(value, list | tuple) or not value
            or any(step not in STEPS for step in value)):
        raise UsageError(f"{where} must be \"off\" or a non-empty list of steps from "
                         f"{list(STEPS)} (in the order they run; the last repeats), got "
                         f"{brief_repr(value)}.")
    return tuple(cast(Step, step) for step in value)

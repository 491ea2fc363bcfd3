"""The model-facing text of completion nudges, and the diagnostic copy users read.

A nudge tells the model to keep going; it never says *why* in assertion terms. Naming the
missing tool or the assertion group invites the model to satisfy the check rather than the
task (and leaks configuration into the transcript), so the text is the same for every missing
assertion: a generic push plus the user's original request, which is what the model should
be working towards anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from agents_api import Message
from agents_api.jsontext import compact_json

__all__ = [
    "DESCRIBED_ACTION_PATTERN",
    "DESCRIBED_ACTION_TEXT",
    "DIAGNOSTIC_LIMIT",
    "GOAL_LIMIT",
    "NUDGE_TEXT",
    "build_nudge",
    "describes_tool_action",
    "diagnostic_copy",
    "original_request",
    "truncate",
]

NUDGE_TEXT = (
    "Please continue. The task is not complete yet. Use the available tools to inspect or "
    "update the project as needed, then finish once the requested outcome is in place."
)
# Sent when the model wrote out a tool action as prose instead of calling the tool.
DESCRIBED_ACTION_TEXT = (
    "Your previous response described a tool action but did not make a valid tool call. Use "
    "the available tool call format for the action, or provide a final answer if no tool is "
    "needed."
)
DESCRIBED_ACTION_PATTERN = re.compile(r"^\s*AI ACTION\s*\(Turn\s+\d+\):\s*Executing\s+",
                                      re.IGNORECASE)
GOAL_LIMIT = 300
DIAGNOSTIC_LIMIT = 2000


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last three being ``...`` when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 3)] + "..."


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    # Multi-part content (images, parts lists) is shown as JSON rather than dropped.
    return compact_json(content)


def original_request(messages: Iterable[Message]) -> str:
    """The first non-empty user text message, cut at :data:`GOAL_LIMIT` characters."""
    for message in messages:
        if message.role != "user" or message.type != "text":
            continue
        text = _as_text(message.content)
        if text and text not in ("[]", '""'):
            return truncate(text, GOAL_LIMIT)
    return ""


def build_nudge(messages: Iterable[Message]) -> str:
    """The continuation message for a model that stopped before the outcome was in place."""
    goal = original_request(messages)
    return f"{NUDGE_TEXT} Original request: {goal}" if goal else NUDGE_TEXT


def describes_tool_action(content: str) -> bool:
    """True for an answer like "AI ACTION (Turn 4): Executing publish(...)": the model narrated
    a tool call instead of making one, so the answer is not a completion."""
    return bool(DESCRIBED_ACTION_PATTERN.match(content or ""))


def diagnostic_copy(text: str) -> str:
    """The nudge as stored in results, events and job engine data (bounded)."""
    return truncate(text, DIAGNOSTIC_LIMIT)

"""The built-in ``report_blocker(reason)`` tool: an honest way out for a stuck model.

With completion assertions configured, a model that cannot finish (a required tool keeps
failing, the request is impossible) would otherwise be nudged again and again until the turns
run out, and the user would learn only that the turn budget was spent. Offering this tool lets
the model say why it is stuck: the run ends with ``status="incomplete"`` and the reason in
``result.blocker``, at the cost of one tool call instead of the remaining turns.

The tool is offered only when assertions are configured (elsewhere the model can simply stop)
and only when the run's own tools do not already define a tool of that name.
"""

from __future__ import annotations

from typing import Any

from datamachine.tools import Tool

__all__ = ["BLOCKER_TOOL", "BLOCKER_TOOL_NAME", "blocker_reason", "is_blocker_tool"]

BLOCKER_TOOL_NAME = "report_blocker"
_REASON_LIMIT = 2000


def _report_blocker(reason: str) -> dict[str, Any]:
    text = reason.strip()
    if not text:
        return {"success": False, "error": "Give the reason you cannot finish the task.",
                "error_type": "invalid_arguments"}
    return {"success": True,
            "result": {"blocker": text[:_REASON_LIMIT],
                       "message": "Blocker recorded. The run stops here and the reason is "
                                  "reported to the user."}}


BLOCKER_TOOL = Tool(
    name=BLOCKER_TOOL_NAME,
    description=(
        "Stop and report that the task cannot be completed. Call this only when you are "
        "blocked (for example a required action keeps failing, or the request is impossible "
        "with the tools you have); explain the reason so the user can fix it. Do not call it "
        "when you can still make progress."
    ),
    parameters={
        "type": "object",
        "properties": {
            "reason": {"type": "string",
                       "description": "What blocks you, in one or two sentences."},
        },
        "required": ["reason"],
    },
    function=_report_blocker,
    runtime={"duplicate_policy": "repeatable"},
)


def is_blocker_tool(tool: object) -> bool:
    """True for this module's tool (a user's own ``report_blocker`` is an ordinary tool)."""
    return tool is BLOCKER_TOOL


def blocker_reason(result: dict[str, Any]) -> str | None:
    """The recorded reason from a successful ``report_blocker`` result, else None."""
    if result.get("success") is not True:
        return None
    body = result.get("result")
    if isinstance(body, dict) and isinstance(body.get("blocker"), str):
        return str(body["blocker"])
    return None

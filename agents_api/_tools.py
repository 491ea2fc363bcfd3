"""Tool calls inside the loop: normalizing results, and running one call.

The loop, not the turn runner, runs tools: it appends the ``tool_call`` envelope, hands the call
to the executor (under the run's deadline when it has one), and appends the ``tool_result``
envelope the model will read. A failing tool never ends a run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agents_api.drive import DeadlineReached, Steps, ThreadCall, awaitable
from agents_api.jsontext import compact_json
from agents_api.message import Message
from agents_api.pause import Pause
from agents_api.records import ToolCall, ToolOutcome

__all__ = ["Emit", "normalize_tool_result", "run_tool", "tool_result_content"]

logger = logging.getLogger("agents_api.loop")

ToolExecutor = Callable[[dict[str, Any], dict[str, Any]], Any]
Emit = Callable[[str, dict[str, Any]], None]


def normalize_tool_result(raw: Any) -> dict[str, Any]:
    """``{"success": bool, "result"| "error": ...}`` from whatever an executor returned."""
    if (type(raw) is dict or isinstance(raw, Mapping)) and type(raw.get("success")) is bool:
        result = dict(raw)  # the executor's dict stays its own
        if not result["success"]:
            error = result.get("error")
            result["error"] = str(error) if error not in (None, "") else "Tool execution failed."
        return result
    return {"success": True, "result": raw}


def tool_result_content(result: Mapping[str, Any]) -> str:
    """What the model reads for a tool result: the JSON of ``result``, or the error text."""
    if not result.get("success"):
        return str(result.get("error", "Tool execution failed."))
    value = result.get("result")
    if isinstance(value, str):
        return value
    try:
        return compact_json(value)
    except (TypeError, ValueError):
        return str(value)


def _failure(error: str, error_type: str) -> dict[str, Any]:
    return {"success": False, "error": error, "error_type": error_type}


def run_tool(call: ToolCall, turn: int, turn_context: dict[str, Any],
             executor: ToolExecutor | None, messages: list[Message], emit: Emit,
             listening: bool, deadline: float | None = None) -> Steps[ToolOutcome | Pause]:
    """Run one call through the executor and append its two envelopes to ``messages``.

    Every way the call can fail (no executor, an exception, the run's time limit) becomes a
    failed result the model reads; it never ends the run. An executor that answers with a
    :class:`~agents_api.pause.Pause` did not run the call: its envelope is taken back (the
    call waits, see :mod:`agents_api.pause`) and the pause is returned.
    """
    messages.append(Message.tool_call(call.name, call.parameters, turn, call.id))
    if listening:
        emit("tool_call", {"turn": turn, "tool_name": call.name, "tool_call_id": call.id,
                           "parameters": call.parameters})
    result: dict[str, Any]
    if executor is None:
        result = _failure(f"Tool '{call.name}' cannot run: no tool executor is configured for "
                          "this loop.", "executor_unavailable")
    else:
        context = {**turn_context, "messages": messages, "tool_call_id": call.id}
        try:
            if deadline is None:
                raw = executor(call.mapping, context)
                if awaitable(raw):
                    raw = yield raw
            else:
                # Under a wall-clock rail a tool runs where the run can stop waiting for it: a
                # sync tool in a daemon thread, an async one under a timeout.
                raw = yield ThreadCall(executor, (call.mapping, context), deadline)
            if type(raw) is Pause:
                messages.pop()
                return raw
            result = normalize_tool_result(raw)
        except DeadlineReached:
            logger.warning("agents_api: tool %r outlived the run's time limit; its late "
                           "result will be discarded", call.name)
            result = _failure(f"Tool '{call.name}' did not finish before the run's time limit.",
                              "deadline_exceeded")
        except Exception as exc:
            result = _failure(f"Tool '{call.name}' raised: {exc}", "executor_exception")
    messages.append(Message.tool_result(call.name, result, turn, call.id,
                                        tool_result_content(result)))
    if listening:
        emit("tool_result", {"turn": turn, "tool_name": call.name, "tool_call_id": call.id,
                             "success": result["success"], "result": result})
    return ToolOutcome(call, turn, result)

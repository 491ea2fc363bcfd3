"""Tool calls inside the loop: normalizing calls and results, and running one call.

The loop, not the turn runner, runs tools: it appends the ``tool_call`` envelope, hands the call
to the executor (under the run's deadline when it has one), and appends the ``tool_result``
envelope the model will read. A failing tool never ends a run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, Protocol

from agents_api._drive import DeadlineReached, ThreadCall, awaitable
from agents_api.jsontext import json_encoder
from agents_api.message import Message

__all__ = ["normalize_tool_call", "normalize_tool_result", "run_tool", "tool_result_content"]

logger = logging.getLogger("agents_api.loop")

_result_json = json_encoder(ensure_ascii=False, default=str)

ToolExecutor = Callable[[dict[str, Any], dict[str, Any]], Any]
class Emit(Protocol):
    """The loop's event emitter: callable, and ``active`` when anyone listens."""

    active: bool

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        """Send one event."""


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
        return _result_json(value)
    except (TypeError, ValueError):
        return str(value)


def normalize_tool_call(call: Any, turn: int, index: int) -> dict[str, Any] | None:
    """``{"id", "name", "parameters"}`` from a model's call, or None when it has no name."""
    if type(call) is not dict and not isinstance(call, Mapping):
        return None
    name = call.get("name") or call.get("tool_name")
    if not isinstance(name, str) or not name.strip():
        return None
    params = call.get("parameters")
    if params is None:
        params = call.get("arguments", {})
    call_id = call.get("id") or call.get("tool_call_id") or f"call_{turn}_{index}"
    return {"id": str(call_id), "name": name.strip(), "parameters": params}


def run_tool(
    call: dict[str, Any],
    turn: int,
    turn_context: dict[str, Any],
    executor: ToolExecutor | None,
    msgs: list[Message],
    tool_results: list[dict[str, Any]],
    emit: Emit,
    deadline: float | None = None,
) -> Generator[Awaitable[Any], Any, dict[str, Any]]:
    """Run one call through the executor and record it; returns the normalized result."""
    name, call_id, params = call["name"], call["id"], call["parameters"]
    msgs.append(Message.tool_call(name, params, turn, call_id))
    if emit.active:
        emit("tool_call", {"turn": turn, "tool_name": name, "tool_call_id": call_id,
                           "parameters": params})
    if executor is None:
        result: dict[str, Any] = {
            "success": False,
            "error": f"Tool '{name}' cannot run: no tool executor is configured for this loop.",
            "error_type": "executor_unavailable",
        }
    else:
        context = {**turn_context, "messages": msgs, "tool_call_id": call_id}
        try:
            if deadline is None:
                raw = executor(call, context)
                if awaitable(raw):
                    raw = yield raw
            else:
                # Under a wall-clock rail a tool runs where the run can stop waiting for it: a
                # sync tool in a daemon thread, an async one under a timeout.
                raw = yield ThreadCall(executor, (call, context), deadline)
            result = normalize_tool_result(raw)
        except DeadlineReached:
            logger.warning("agents_api: tool %r outlived the run's time limit; its late result "
                           "will be discarded", name)
            result = {"success": False,
                      "error": f"Tool '{name}' did not finish before the run's time limit.",
                      "error_type": "deadline_exceeded"}
        except Exception as exc:
            # One tool failing never ends the run: the model reads the error and may recover.
            result = {"success": False, "error": f"Tool '{name}' raised: {exc}",
                      "error_type": "executor_exception"}
    msgs.append(Message.tool_result(name, result, turn, call_id, tool_result_content(result)))
    if emit.active:
        emit("tool_result", {"turn": turn, "tool_name": name, "tool_call_id": call_id,
                             "success": result["success"]})
    tool_results.append({"tool_name": name, "tool_call_id": call_id, "parameters": params,
                               "success": result["success"], "result": result, "turn": turn})
    return result

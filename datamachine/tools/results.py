"""The one shape every tool outcome takes before the loop sees it.

Tools return whatever is natural (a string, a list, a dict, a pydantic model) or say
``{"success": False, "error": ...}`` themselves. Everything is normalized here to
``{"success", "result" | "error", "error_type"?, "tool_name", "parameters"}`` so the transcript,
completion assertions and ``tool_execution_results`` read one shape. The parameters are kept
because completion assertions ask "was X called with Y?" long after the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from agents_api.jsontext import compact_json

__all__ = ["failed_result", "normalize_return"]

_PRIMITIVES = (str, int, float, bool, type(None))


def failed_result(
    tool_name: str,
    parameters: Mapping[str, Any] | None,
    error: str,
    error_type: str,
    **extra: Any,
) -> dict[str, Any]:
    """A failed tool result the model can read; ``error_type`` lets code tell failures apart."""
    result: dict[str, Any] = {"success": False, "error": error, "error_type": error_type}
    result.update(extra)
    result["tool_name"] = tool_name
    result["parameters"] = dict(parameters) if parameters is not None else {}
    return result


def _json_ready(value: Any) -> Any:
    """``value`` as JSON reads it back: a stray datetime or set (or any object) must not turn
    a tool's work into a failure, and a stored result must read back the same."""
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(compact_json(value))


def normalize_return(
    value: Any, tool_name: str, parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """Turn a tool function's return value into a tool result.

    A mapping with a boolean ``success`` is the tool speaking for itself: on success its
    ``result`` (or, without one, the other keys) is the result; on failure its ``error``, else
    its ``message`` (else ``"Tool execution failed."``) is what the model reads, and
    ``error_type`` defaults to ``tool_error``. Anything else is a successful result as is.
    """
    if type(value) in _PRIMITIVES:
        # The common case (a number, a string): nothing to convert.
        return {"success": True, "result": value, "tool_name": tool_name,
                "parameters": dict(parameters)}
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping) and isinstance(value.get("success"), bool):
        body = {key: val for key, val in value.items() if key != "success"}
        if value["success"]:
            if "result" in body:
                out: dict[str, Any] = {"success": True, **body,
                                       "result": _json_ready(body["result"])}
            else:
                out = {"success": True, "result": _json_ready(body)}
        else:
            # The tool's own words reach the model: its error, else its message.
            error = body.get("error")
            if error in (None, ""):
                error = body.get("message")
            out = {"success": False, **{k: _json_ready(v) for k, v in body.items()}}
            out["error"] = str(error) if error not in (None, "") else "Tool execution failed."
            out.setdefault("error_type", "tool_error")
    else:
        out = {"success": True, "result": _json_ready(value)}
    out["tool_name"] = tool_name
    out["parameters"] = dict(parameters)
    return out

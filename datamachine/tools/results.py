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

__all__ = ["REJECTED", "RESERVED_PREFIX", "failed_result", "is_rejected", "normalize_return",
           "rejected_result"]

_PRIMITIVES = (str, int, float, bool, type(None))

# Keys of a tool result that only datamachine writes. A tool's own return value never carries
# one (normalize_return drops them), so a tool cannot pass for something the executor decided.
RESERVED_PREFIX = "_dm_"
# The executor's mark on a call it refused to run (a duplicate, a runtime rule, an approval not
# given, tools closed by wrap-up, a session aborted at its limit): such a result is kept in the
# transcript but is not a result (``tool_execution_results``), not a success (completion
# assertions) and not a call that ran (runtime rules, the final summary). It used to be the
# plain key ``rejected``, which any tool could return to hide its result.
REJECTED = "_dm_rejected"


def is_rejected(result: Mapping[str, Any]) -> bool:
    """Whether a tool result is a call the executor refused to run (see ``REJECTED``)."""
    return result.get(REJECTED) is True


def rejected_result(tool_name: str, parameters: Mapping[str, Any] | None, error: str,
                    error_type: str, **extra: Any) -> dict[str, Any]:
    """A refused call's result: a failed result the model reads, marked ``REJECTED``."""
    return failed_result(tool_name, parameters, error, error_type, **extra, **{REJECTED: True})


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
    Top-level keys in datamachine's reserved namespace (``_dm_...``, see ``REJECTED``) are
    dropped from what the tool said: only the executor writes them.
    """
    if type(value) in _PRIMITIVES:
        # The common case (a number, a string): nothing to convert.
        return {"success": True, "result": value, "tool_name": tool_name,
                "parameters": dict(parameters)}
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping) and isinstance(value.get("success"), bool):
        # The keys are walked here anyway; dropping reserved ones adds one check per key.
        body = {key: val for key, val in value.items() if key != "success"
                and not (type(key) is str and key.startswith(RESERVED_PREFIX))}
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

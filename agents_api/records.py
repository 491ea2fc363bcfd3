"""The loop's internal records: typed, immutable, and converted to dicts only at the edges.

The loop hands user callables the documented dict shapes (a tool call is ``{"id", "name",
"parameters"}``); inside, a call, its outcome and the run's stop are dataclasses, so the code
that moves them around is checked by mypy instead of trusting string keys.

Records made per run or per turn are slotted dataclasses that are never changed once made, but
not ``frozen``: a frozen dataclass sets each field through ``object.__setattr__``, about five
times the cost of a plain one (1.6 k against 0.3 k instructions per field), and a run makes
dozens of them. The same rule holds for datamachine's per-run records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from agents_api.budget import IterationBudget

__all__ = ["LoopStatus", "Outcome", "ToolCall", "ToolCallDict", "ToolOutcome", "ToolRecord"]

LoopStatus = Literal[
    "completed", "incomplete", "budget_exceeded", "aborted", "error", "transcript_lock_contention",
    "awaiting_confirmation",
]


class ToolCallDict(TypedDict):
    """A tool call as user callables and results see it (DESIGN.md section 10): the call's
    ``id``, the tool's ``name``, and the ``parameters`` as the model sent them (usually a JSON
    object; the loop passes them through unchecked)."""

    id: str
    name: str
    parameters: object


class ToolRecord(TypedDict):
    """One entry of a run's ``tool_execution_results``: a call and its normalized result."""

    tool_name: str
    tool_call_id: str
    parameters: object
    success: bool
    result: dict[str, object]
    turn: int


@dataclass(slots=True)
class ToolCall:
    """One tool call the model asked for: ``id``, ``name`` and ``parameters`` as it sent them.

    Never changed after it is made (not frozen only because a frozen dataclass costs a
    microsecond more per call on the loop's hot path). ``mapping`` is the documented dict shape
    user callables receive (a :class:`ToolCallDict`), made once; typed as the plain dict they
    are given, which they may annotate as ``dict[str, Any]``.
    """

    id: str
    name: str
    parameters: object
    mapping: dict[str, object]

    @classmethod
    def from_model(cls, raw: object, turn: int, index: int) -> ToolCall | None:
        """The call in a turn runner's ``tool_calls`` entry, or None when it names no tool.

        Accepts ``tool_name``/``arguments``/``tool_call_id`` as aliases; a call without an id
        gets ``call_<turn>_<index>``.
        """
        if type(raw) is not dict and not isinstance(raw, Mapping):  # the common case first
            return None
        name = raw.get("name") or raw.get("tool_name")
        if not isinstance(name, str) or not name.strip():
            return None
        params = raw.get("parameters")
        if params is None:
            params = raw.get("arguments", {})
        call_id = str(raw.get("id") or raw.get("tool_call_id") or f"call_{turn}_{index}")
        name = name.strip()
        return cls(call_id, name, params, {"id": call_id, "name": name, "parameters": params})


@dataclass(slots=True)
class ToolOutcome:
    """A call the loop ran (or refused to run) and its normalized result (never changed)."""

    call: ToolCall
    turn: int
    result: dict[str, object]

    @property
    def success(self) -> bool:
        """Whether the tool reported success."""
        return self.result["success"] is True

    def record(self) -> ToolRecord:
        """The entry of ``tool_execution_results``."""
        return {"tool_name": self.call.name, "tool_call_id": self.call.id,
                "parameters": self.call.parameters, "success": self.success,
                "result": self.result, "turn": self.turn}


@dataclass(frozen=True, slots=True)
class Outcome:
    """Why a run stopped, decided once (``LoopRun._stop``): the status, the budget that stopped
    it, or the error."""

    status: LoopStatus
    budget: IterationBudget | None = None
    error: str | None = None
    error_code: str | None = None

    @classmethod
    def failure(cls, code: str, exc: BaseException) -> Outcome:
        """An ``error`` outcome; an exception's own ``code`` attribute wins over ``code``."""
        return cls("error", error=str(exc) or type(exc).__name__,
                   error_code=str(getattr(exc, "code", "") or code))

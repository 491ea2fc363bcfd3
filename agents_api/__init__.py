"""agents_api: the generic bounded conversation loop.

It sequences turns, enforces budgets, runs tools, emits events, holds the transcript lock and
calls the persister. It never imports ``datamachine``: a product implements :class:`LoopHooks`
(or passes ``run_loop`` its callables) and gets one :class:`RunStop` back.

Public names are loaded on first use (PEP 562): a host that only registers budgets at boot needs
``IterationBudget``, not the loop and its pydantic result models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents_api._lazy import lazy_exports

if TYPE_CHECKING:
    from agents_api.api import CallableHooks, arun_loop, hooked_steps, run_loop
    from agents_api.budget import BudgetSpent, IterationBudget
    from agents_api.errors import (
        AgentsAPIError,
        InvalidBudget,
        InvalidLoopArgument,
        InvalidMessage,
        InvalidTurnResult,
        LockLost,
    )
    from agents_api.hooks import LoopHooks, LoopSettings, TurnContext
    from agents_api.loop import normalize_tool_result, tool_result_content
    from agents_api.message import Message, normalize_message, normalize_messages
    from agents_api.pause import Pause
    from agents_api.results import (
        Decision,
        LoopResult,
        RunStop,
        StopVerdict,
        TurnAnswer,
        TurnResult,
    )
    from agents_api.transcript import (
        HeldLock,
        TranscriptLock,
        TranscriptPersister,
        TranscriptWriter,
    )

_EXPORTS: dict[str, str] = {
    "AgentsAPIError": "agents_api.errors",
    "InvalidBudget": "agents_api.errors",
    "InvalidLoopArgument": "agents_api.errors",
    "InvalidMessage": "agents_api.errors",
    "InvalidTurnResult": "agents_api.errors",
    "LockLost": "agents_api.errors",
    "BudgetSpent": "agents_api.budget",
    "IterationBudget": "agents_api.budget",
    "HeldLock": "agents_api.transcript",
    "TranscriptLock": "agents_api.transcript",
    "TranscriptPersister": "agents_api.transcript",
    "TranscriptWriter": "agents_api.transcript",
    "CallableHooks": "agents_api.api",
    "arun_loop": "agents_api.api",
    "hooked_steps": "agents_api.api",
    "run_loop": "agents_api.api",
    "LoopHooks": "agents_api.hooks",
    "LoopSettings": "agents_api.hooks",
    "TurnContext": "agents_api.hooks",
    "normalize_tool_result": "agents_api.loop",
    "tool_result_content": "agents_api.loop",
    "Message": "agents_api.message",
    "normalize_message": "agents_api.message",
    "normalize_messages": "agents_api.message",
    "Pause": "agents_api.pause",
    "Decision": "agents_api.results",
    "LoopResult": "agents_api.results",
    "RunStop": "agents_api.results",
    "StopVerdict": "agents_api.results",
    "TurnAnswer": "agents_api.results",
    "TurnResult": "agents_api.results",
}

__all__ = [
    "AgentsAPIError",
    "BudgetSpent",
    "CallableHooks",
    "Decision",
    "HeldLock",
    "InvalidBudget",
    "InvalidLoopArgument",
    "InvalidMessage",
    "InvalidTurnResult",
    "IterationBudget",
    "LockLost",
    "LoopHooks",
    "LoopResult",
    "LoopSettings",
    "Message",
    "Pause",
    "RunStop",
    "StopVerdict",
    "TranscriptLock",
    "TranscriptPersister",
    "TranscriptWriter",
    "TurnAnswer",
    "TurnContext",
    "TurnResult",
    "arun_loop",
    "hooked_steps",
    "normalize_message",
    "normalize_messages",
    "normalize_tool_result",
    "run_loop",
    "tool_result_content",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)

"""agents_api: the generic bounded conversation loop.

It sequences turns, enforces budgets, runs tools through an executor, emits events, holds the
transcript lock and calls the persister. It never imports ``datamachine``: products adapt their
own concepts onto it through callables.
"""

from agents_api.budget import IterationBudget
from agents_api.errors import (
    AgentsAPIError,
    InvalidBudget,
    InvalidLoopArgument,
    InvalidMessage,
    InvalidTurnResult,
)
from agents_api.loop import (
    TranscriptLock,
    TranscriptPersister,
    arun_loop,
    normalize_tool_result,
    run_loop,
    tool_result_content,
)
from agents_api.message import Message, normalize_message, normalize_messages
from agents_api.results import Decision, LoopResult, TurnResult

__all__ = [
    "AgentsAPIError",
    "Decision",
    "InvalidBudget",
    "InvalidLoopArgument",
    "InvalidMessage",
    "InvalidTurnResult",
    "IterationBudget",
    "LoopResult",
    "Message",
    "TranscriptLock",
    "TranscriptPersister",
    "TurnResult",
    "arun_loop",
    "normalize_message",
    "normalize_messages",
    "normalize_tool_result",
    "run_loop",
    "tool_result_content",
]

"""The budgets every host has, registered by ``bootstrap.py`` before any plugin's, and the one
home of every budget name the product itself uses."""

from __future__ import annotations

from agents_api.names import TOOL_CALLS, WALL_CLOCK
from datamachine.registry import BudgetSpec

__all__ = ["BUILTIN_BUDGETS", "BUILTIN_OWNER", "CHAIN_DEPTH", "CHAT_TURNS", "CONVERSATION_TURNS",
           "TOOL_CALLS", "WALL_CLOCK"]

BUILTIN_OWNER = "bootstrap"

CONVERSATION_TURNS = "conversation_turns"
CHAIN_DEPTH = "chain_depth"
# A chat session's own turn count, shown to confirm_continuation at the session's limit (not a
# registry budget: the limit is the session's).
CHAT_TURNS = "chat_turns"

BUILTIN_BUDGETS: tuple[BudgetSpec, ...] = (
    BudgetSpec(
        name=CONVERSATION_TURNS, default=25, min=1, max=200, setting="max_turns",
        description="Provider turns in one run_conversation call.",
    ),
    BudgetSpec(
        name=CHAIN_DEPTH, default=3, min=1, max=10, setting="max_chain_depth",
        description="Agent-to-agent hops a /chat request may land at.",
    ),
    BudgetSpec(
        name=TOOL_CALLS, default=100, min=1, max=1000, setting="max_tool_calls",
        description="Tool calls in one run_conversation call.",
    ),
)

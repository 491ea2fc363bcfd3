"""The budgets every host has, registered by ``bootstrap.py`` before any plugin's, and the one
home of every budget name the product itself uses."""

from __future__ import annotations

from agents_api.budget import TOOL_CALLS, WALL_CLOCK
from datamachine.registry import BudgetSpec

__all__ = ["BUILTIN_BUDGETS", "BUILTIN_OWNER", "CHAIN_DEPTH", "CHAT_TURNS", "CONTEXT_TOKENS",
           "CONVERSATION_TURNS", "COST", "METERED_BUDGETS", "TOOL_CALLS", "TOTAL_TOKENS",
           "WALL_CLOCK"]

BUILTIN_OWNER = "bootstrap"

CONVERSATION_TURNS = "conversation_turns"
CHAIN_DEPTH = "chain_depth"
# A chat session's own turn count, shown to confirm_continuation at the session's limit (not a
# registry budget: the limit is the session's).
CHAT_TURNS = "chat_turns"
# What a run's requests spend, fed from the usage each answer reports: they join a run only
# when a ceiling is set for it (their setting or payload budget_ceilings).
TOTAL_TOKENS = "total_tokens"
COST = "cost"
METERED_BUDGETS = (TOTAL_TOKENS, COST)
# The model's context window: the latest request's prompt tokens against it (DESIGN.md 21); it
# joins a run only when the window is known.
CONTEXT_TOKENS = "context_tokens"

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
    BudgetSpec(
        name=TOTAL_TOKENS, default=10**12, min=1, max=10**12, setting="max_total_tokens",
        unit="tokens",
        description="Prompt and completion tokens in one run (only when a ceiling is set).",
    ),
    BudgetSpec(
        name=COST, default=10**12, min=1, max=10**12, setting="max_cost_usd",
        unit="microdollars",
        description="What one run's requests cost, from the prices setting (only when a "
                    "ceiling is set; the setting is in dollars).",
    ),
    BudgetSpec(
        name=CONTEXT_TOKENS, default=10**8, min=256, max=10**8, setting="max_context_tokens",
        unit="tokens",
        description="The model's context window: the latest request's prompt tokens, which "
                    "compaction keeps under it (only when the window is known).",
    ),
)

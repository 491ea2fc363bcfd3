"""The three budgets every host has, registered by ``bootstrap.py`` before any plugin's."""

from __future__ import annotations

from datamachine.registry import BudgetSpec

__all__ = ["BUILTIN_BUDGETS", "BUILTIN_OWNER"]

BUILTIN_OWNER = "bootstrap"

BUILTIN_BUDGETS: tuple[BudgetSpec, ...] = (
    BudgetSpec(
        name="conversation_turns", default=25, min=1, max=200, setting="max_turns",
        description="Provider turns in one run_conversation call.",
    ),
    BudgetSpec(
        name="chain_depth", default=3, min=1, max=10, setting="max_chain_depth",
        description="Agent-to-agent hops a /chat request may land at.",
    ),
    BudgetSpec(
        name="tool_calls", default=100, min=1, max=1000, setting="max_tool_calls",
        description="Tool calls in one run_conversation call.",
    ),
)

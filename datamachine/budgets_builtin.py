"""The budgets every host has, registered by ``bootstrap.py`` before any plugin's, and the one
home of every budget name the product itself uses."""

from __future__ import annotations

from agents_api.budget import TOOL_CALLS, WALL_CLOCK
from datamachine.registry import BudgetSpec

__all__ = ["BUILTIN_BUDGETS", "BUILTIN_OWNER", "CHAIN_DEPTH", "CHAT_TURNS",
           "COMPLETION_NUDGES", "CONTEXT_TOKENS", "CONVERSATION_TURNS", "COST", "JOB_ATTEMPTS",
           "METERED_BUDGETS", "OUTPUT_RETRIES", "PROVIDER_RETRIES", "STUCK_TURNS", "TOOL_CALLS",
           "TOTAL_TOKENS", "WALL_CLOCK"]

BUILTIN_OWNER = "bootstrap"

CONVERSATION_TURNS = "conversation_turns"
CHAIN_DEPTH = "chain_depth"
# A chat session's turns (DESIGN 6): the session stores its limit, resolved here when the
# session is made.
CHAT_TURNS = "chat_turns"
# Repeat counters (min 0: a ceiling of 0 allows no repeat; a ceiling N allows N, and the loop
# stops when an (N+1)th would be needed).
PROVIDER_RETRIES = "provider_retries"
COMPLETION_NUDGES = "completion_nudges"
OUTPUT_RETRIES = "output_retries"
JOB_ATTEMPTS = "job_attempts"
# Turns in a row the loop guard saw the model repeat itself (DESIGN 23).
STUCK_TURNS = "stuck_turns"
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
        name=CHAIN_DEPTH, default=3, min=1, max=10, setting="max_chain_depth", scope="chain",
        description="Agent-to-agent hops a /chat request may land at.",
    ),
    BudgetSpec(
        name=TOOL_CALLS, default=100, min=1, max=1000, setting="max_tool_calls",
        description="Tool calls in one run_conversation call.",
    ),
    BudgetSpec(
        name=TOTAL_TOKENS, default=None, min=1, max=10**12, setting="max_total_tokens",
        unit="tokens",
        description="Prompt and completion tokens in one run (only when a ceiling is set).",
    ),
    BudgetSpec(
        name=COST, default=None, min=1, max=10**12, setting="max_cost_usd",
        unit="microdollars",
        description="What one run's requests cost, from the prices setting (only when a "
                    "ceiling is set; the setting is in dollars).",
    ),
    BudgetSpec(
        name=CONTEXT_TOKENS, default=None, min=256, max=10**8, setting="max_context_tokens",
        unit="tokens",
        description="The model's context window: the latest request's prompt tokens, which "
                    "compaction keeps under it (only when the window is known).",
    ),
    BudgetSpec(
        name=PROVIDER_RETRIES, default=3, min=0, max=10, setting="provider_max_retries",
        scope="request",
        description="Retries of one provider request after the first; spent, the run ends "
                    "with status error.",
    ),
    BudgetSpec(
        name=JOB_ATTEMPTS, default=5, min=1, max=100, setting="job_max_attempts", scope="job",
        description="Attempts of one queued job, counted when one ends in an outage (a "
                    "worker that died or a busy transcript costs none); the attempt that "
                    "spends them fails the job.",
    ),
    BudgetSpec(
        name=COMPLETION_NUDGES, default=5, min=0, max=50, setting="max_completion_nudges",
        description="Nudges one run gives a model that stops before its task is done; "
                    "spent, the run ends incomplete.",
    ),
    BudgetSpec(
        name=OUTPUT_RETRIES, default=3, min=0, max=20, setting="max_output_retries",
        description="Re-asks for a structured answer that did not validate; spent, the run "
                    "ends incomplete.",
    ),
    BudgetSpec(
        name=CHAT_TURNS, default=25, min=1, max=10_000, setting="chat_max_turns",
        scope="session", unlimited=True,
        description="Turns of one chat session before a person is asked to go on (a new "
                    "session's limit).",
    ),
    BudgetSpec(
        name=WALL_CLOCK, default=None, min=1, max=86_400, setting="max_run_seconds",
        unit="seconds",
        description="Seconds one run may take (only when set; fractions round up in the "
                    "ceiling, the time rail keeps them).",
    ),
    BudgetSpec(
        name=STUCK_TURNS, default=3, min=1, max=20, setting="max_stuck_turns",
        description="Turns in a row the loop guard saw the model repeat itself; progress "
                    "resets it.",
    ),
)

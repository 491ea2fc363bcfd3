"""datamachine-fetch: an HTTP fetch tool for agents, bounded by its own budget.

Agents that browse tend to fetch page after page. This plugin owns the ``http_fetches`` budget
(default 10 per run, clamp [1, 100], setting ``max_http_fetches``) so a host can bound fetching
separately from turns and tool calls.
"""

from __future__ import annotations

from datamachine import BudgetSpec, hookimpl

__all__ = ["HTTP_FETCHES", "register_budgets"]

HTTP_FETCHES = BudgetSpec(
    name="http_fetches",
    default=10,
    min=1,
    max=100,
    setting="max_http_fetches",
    description="HTTP fetches by the fetch_url tool in one run.",
)


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    """The budget this plugin owns."""
    return [HTTP_FETCHES]

"""Test plugin: claims the built-in `conversation_turns` name."""

from datamachine import BudgetSpec, hookimpl


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    return [BudgetSpec(name="conversation_turns", default=5, min=1, max=10)]

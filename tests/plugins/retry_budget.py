"""Test plugin: owns a `retries` budget fed by the `max_retries` setting."""

from datamachine import BudgetSpec, hookimpl


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    return [BudgetSpec(name="retries", default=3, min=1, max=8, setting="max_retries")]

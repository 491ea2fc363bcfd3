"""Test plugin: claims the built-in `job_attempts` name, with a wider clamp."""

from datamachine import BudgetSpec, hookimpl


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    return [BudgetSpec(name="job_attempts", default=5, min=1, max=200,
                       setting="job_max_attempts", scope="job")]

"""Test plugin: registers a budget whose default is above its max."""

from typing import Any

from datamachine import hookimpl


@hookimpl
def register_budgets() -> list[tuple[str, dict[str, Any]]]:
    return [("broken", {"default": 50, "min": 1, "max": 10})]

"""Test plugin: claims `retries` too, in the (name, config) form, to provoke a boot error."""

from typing import Any

from datamachine import hookimpl


@hookimpl
def register_budgets() -> list[tuple[str, dict[str, Any]]]:
    return [("retries", {"default": 2, "min": 1, "max": 5})]

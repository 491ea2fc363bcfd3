"""Test plugin: a hookimpl with a typo in its name; boot must refuse it."""

from datamachine import hookimpl


@hookimpl
def register_budget() -> list[object]:
    return []

"""The prompt and the one tool the continuation, exhaustion and pressure tests share."""

from __future__ import annotations

from datamachine import tool

USER = [{"role": "user", "content": "work"}]


@tool
def step(n: int) -> int:
    """One unit of work.

    Args:
        n: The step number.
    """
    return n

"""Test plugin: narrows the built-in ``chat_turns`` budget's clamp to [1, 50].

A plugin cannot claim a built-in name through ``register_budgets`` (two owners of one name stop
the boot), so it re-registers the budget once the host is up, which overwrites it.
"""

from typing import Any

from datamachine import BudgetSpec, hookimpl

CHAT_TURNS_50 = BudgetSpec(
    name="chat_turns", default=25, min=1, max=50, setting="chat_max_turns", scope="session",
    unlimited=True, description="Turns of one chat session, at most 50 on this site.")


@hookimpl
def host_started(host: Any) -> None:
    host.budgets.register(CHAT_TURNS_50, owner="tests.plugins.chat_turns_50")

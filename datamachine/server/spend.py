"""``/chat`` under a spent window: 429 with ``Retry-After`` until the window resets.

Checked before the run, with the scopes the request has (the site, its bearer token, the
session it continues), so nothing is stored for a refused request. A window not spent but too
full for the run's first request stops that run like any budget: 200, ``budget_exceeded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datamachine.conversation.spending import (
    SPEND_LIMITS_KEY,
    SpendLimit,
    parse_spend_limits,
    retry_after,
    scopes_of,
    spent_windows,
)
from datamachine.server.errors import Problem

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["SPEND_LIMIT_CODE", "refuse_if_spent"]

SPEND_LIMIT_CODE = "spend_limit_reached"
_ADJECTIVE = {"hour": "hourly", "day": "daily", "month": "monthly"}


def _limits(host: Host) -> list[SpendLimit]:
    return parse_spend_limits(host.settings.get(SPEND_LIMITS_KEY))


def refuse_if_spent(host: Host, token: str | None, session: str | None) -> None:
    """Raise a 429 :class:`Problem` when a window this request counts against is spent."""
    limits = _limits(host)
    if not limits:
        return
    spent = spent_windows(host.spend, limits, scopes_of({}, token, session))
    if not spent:
        return
    limit, use, _ = spent[0]
    raise _problem(limit, use.used, [reset for _, _, reset in spent])


def _problem(limit: SpendLimit, used: int, resets: list[float],
             data: dict[str, Any] | None = None) -> Problem:
    wait = retry_after(resets)
    unit = "microdollars" if limit.budget == "cost" else "tokens"
    return Problem(
        429, SPEND_LIMIT_CODE,
        f"The {_ADJECTIVE[limit.window]} spend limit {limit.name!r} ({limit.ceiling:,} {unit} per "
        f"{limit.scope}) is used up ({used:,}); retry after {wait} seconds, when the window "
        "resets.",
        {**(data or {}), "limit": limit.name, "window": limit.window, "scope": limit.scope,
         "used": used, "ceiling": limit.ceiling, "retry_after": wait},
        headers={"Retry-After": str(wait)})

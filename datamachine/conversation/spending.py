"""Spend limits across runs: the ``spend_limits`` setting, calendar windows in UTC, and
:class:`SpendWindows`, the windows one run spends in (DESIGN.md section 15).

A limit is ``{"name", "budget": "total_tokens" | "cost", "window": "hour" | "day" | "month",
"limit" (tokens or microdollars) or "limit_usd" (cost), "scope": "site" | "agent" | "token" |
"session"}``. A run counts against every limit whose scope it has: every run has the site;
``agent`` needs the payload's ``agent_slug``, ``token`` a ``/chat`` bearer token, ``session``
a transcript or chat session. Each limit is one of the run's budgets, named as the limit:
its count is the window's use (settled plus reserved), its ceiling the limit, and it is never
extended. A run under a spent window therefore stops ``budget_exceeded`` on it before any
provider call, with the flag ``max_<name>_reached``.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents_api import IterationBudget, clock
from agents_api.errors import brief_repr
from datamachine.budgets_builtin import COST, TOTAL_TOKENS
from datamachine.errors import DatabaseError, InvalidSetting
from datamachine.registry import MAX_METERED_VALUE, usd_to_microdollars
from datamachine.storage.spend import SpendStore, WindowKey, WindowUse

__all__ = ["SPEND_LIMITS_KEY", "RunScopes", "SpendLimit", "SpendWindows", "applicable_windows",
           "parse_spend_limits", "retry_after", "scopes_of", "spent_windows", "window_bounds"]

logger = logging.getLogger("datamachine.spend")

SPEND_LIMITS_KEY = "spend_limits"
Window = Literal["hour", "day", "month"]
Scope = Literal["site", "agent", "token", "session"]
_RESERVED_NAMES = frozenset({"conversation_turns", "tool_calls", "chain_depth",
                             "wall_clock_seconds", TOTAL_TOKENS, COST})


class SpendLimit(BaseModel):
    """One entry of the ``spend_limits`` setting (``limit`` in the budget's unit)."""

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", strict=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)
    budget: Literal["total_tokens", "cost"]
    window: Window
    limit: int | None = Field(default=None, ge=1, le=MAX_METERED_VALUE)
    limit_usd: float | int | None = None
    scope: Scope = "site"

    @model_validator(mode="after")
    def _one_limit(self) -> SpendLimit:
        if (self.limit is None) == (self.limit_usd is None):
            raise ValueError("give exactly one of 'limit' (in the budget's unit) and "
                             "'limit_usd'")
        if self.limit_usd is not None and self.budget != COST:
            raise ValueError("'limit_usd' is for a 'cost' limit; a token limit takes 'limit'")
        if self.name in _RESERVED_NAMES:
            raise ValueError(f"name {self.name!r} is a built-in budget's; choose another")
        return self

    @property
    def ceiling(self) -> int:
        """The limit in the budget's unit (tokens or microdollars)."""
        if self.limit is not None:
            return self.limit
        return usd_to_microdollars(f"spend limit {self.name!r} limit_usd", self.limit_usd)

    @property
    def unit(self) -> str:
        """``tokens`` or ``microdollars``."""
        return "tokens" if self.budget == TOTAL_TOKENS else "microdollars"


def parse_spend_limits(value: object, knob: str = f"setting {SPEND_LIMITS_KEY!r}"
                       ) -> list[SpendLimit]:
    """The ``spend_limits`` setting checked: a list of limits with distinct names; a bad entry
    raises :class:`InvalidSetting` naming its index and field."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidSetting(f"{knob} must be a list of {{'name', 'budget', 'window', 'limit' "
                             f"or 'limit_usd', 'scope'}}, got {type(value).__name__}.")
    limits: list[SpendLimit] = []
    for index, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise InvalidSetting(f"{knob}[{index}] must be an object, got {brief_repr(entry)}.")
        try:
            limit = SpendLimit(**dict(entry))
            limit.ceiling  # noqa: B018  (a limit_usd out of range fails here)
        except (ValidationError, ValueError) as exc:
            raise InvalidSetting(f"{knob}[{index}]: {_reason(exc)}.") from None
        if any(other.name == limit.name for other in limits):
            raise InvalidSetting(f"{knob}[{index}]: the name {limit.name!r} is used twice.")
        limits.append(limit)
    return limits


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc).rstrip(".")


def window_bounds(window: str, now: float) -> tuple[str, float]:
    """The start of the calendar window (UTC) holding ``now``, as ISO 8601, and the epoch
    second it resets at."""
    moment = datetime.fromtimestamp(now, UTC)
    if window == "hour":
        start = moment.replace(minute=0, second=0, microsecond=0)
        reset = start.timestamp() + 3600
    elif window == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        reset = start.timestamp() + 86_400
    else:
        start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = (start.replace(year=start.year + 1, month=1) if start.month == 12
                     else start.replace(month=start.month + 1))
        reset = following.timestamp()
    return start.strftime("%Y-%m-%dT%H:%M:%SZ"), reset


@dataclass(frozen=True, slots=True)
class RunScopes:
    """The scope keys a run has (None: the run has no such scope)."""

    agent: str | None = None
    token: str | None = None
    session: str | None = None

    def key(self, scope: str) -> str | None:
        """The scope key of ``scope`` for this run."""
        if scope == "site":
            return "site"
        value: str | None = getattr(self, scope)
        return value


def applicable_windows(limits: list[SpendLimit], scopes: RunScopes, now: float
                       ) -> list[tuple[SpendLimit, WindowKey, float]]:
    """The windows a run with ``scopes`` counts against now: (limit, key, reset time)."""
    found = []
    for limit in limits:
        scope_key = scopes.key(limit.scope)
        if scope_key is None:
            continue
        start, reset = window_bounds(limit.window, now)
        found.append((limit, WindowKey(limit.name, scope_key, start), reset))
    return found


def spent_windows(store: SpendStore, limits: list[SpendLimit], scopes: RunScopes
                  ) -> list[tuple[SpendLimit, WindowUse, float]]:
    """The windows of a run with ``scopes`` that are spent now, each with its reset time."""
    windows = applicable_windows(limits, scopes, clock.now())
    if not windows:
        return []
    uses = store.use([key for _, key, _ in windows])
    return [(limit, use, reset) for (limit, _, reset), use in zip(windows, uses, strict=True)
            if use.used >= limit.ceiling]


class SpendWindows:
    """The spend windows one run counts against, and its open reservation (the meter's
    :class:`~datamachine.conversation.metering.SpendGuard`)."""

    def __init__(self, store: SpendStore, limits: list[SpendLimit], scopes: RunScopes,
                 ttl: float) -> None:
        self.store = store
        self.limits = limits
        self.scopes = scopes
        self.ttl = ttl
        now = clock.now()
        windows = applicable_windows(limits, scopes, now)
        uses = store.use([key for _, key, _ in windows])
        self.budgets = [IterationBudget(limit.name, limit.ceiling, use.used,
                                        hard_ceiling=limit.ceiling)
                        for (limit, _, _), use in zip(windows, uses, strict=True)]
        self._reservation: str | None = None
        self._keys: list[WindowKey] = []

    def _windows(self) -> list[tuple[SpendLimit, WindowKey, IterationBudget]]:
        """The windows now (a run that crosses midnight counts in the new day)."""
        windows = applicable_windows(self.limits, self.scopes, clock.now())
        by_name = {budget.name(): budget for budget in self.budgets}
        return [(limit, key, by_name[limit.name]) for limit, key, _ in windows]

    def reserve(self, tokens: int, microdollars: int) -> dict[str, int]:
        """Reserve one request's estimate in every window (all or none); each window's budget
        is set to its use before this reservation."""
        windows = self._windows()
        amounts = [tokens if limit.budget == TOTAL_TOKENS else microdollars
                   for limit, _, _ in windows]
        reservation = uuid.uuid4().hex
        ok, uses = self.store.reserve(
            reservation, [(key, amount, limit.ceiling)
                          for (limit, key, _), amount in zip(windows, amounts, strict=True)],
            self.ttl)
        for (_, _, budget), use in zip(windows, uses, strict=True):
            budget.set_current(use)
        if ok:
            self._reservation, self._keys = reservation, [key for _, key, _ in windows]
        return {limit.name: amount for (limit, _, _), amount in zip(windows, amounts,
                                                                    strict=True)}

    def settle(self, tokens: int, microdollars: int) -> None:
        """Replace the open reservation by what the request spent."""
        reservation, keys = self._reservation, self._keys
        if reservation is None:
            return
        by_name = {limit.name: limit for limit in self.limits}
        budgets = {budget.name(): budget for budget in self.budgets}
        items = [(key, tokens if by_name[key.limit].budget == TOTAL_TOKENS else microdollars)
                 for key in keys]
        try:
            self.store.settle(reservation, items)
        except DatabaseError:
            # The answer is paid for and stays the run's; its reservation (the estimate) keeps
            # counting until it expires. Failing the run would throw the answer away.
            logger.error("datamachine: could not settle spend %s", reservation, exc_info=True)
            return
        finally:
            self._reservation = None
        for key, amount in items:
            budget = budgets[key.limit]
            budget.set_current(budget.current() + amount)

    def release(self) -> None:
        """Drop the open reservation."""
        reservation = self._reservation
        if reservation is not None:
            self._reservation = None
            self.store.release(reservation)

    def room(self) -> tuple[int | None, int | None]:
        """(tokens, microdollars) the tightest window has left."""
        tokens: int | None = None
        micro: int | None = None
        units = {limit.name: limit.budget for limit in self.limits}
        for budget in self.budgets:
            left = budget.remaining()
            if units[budget.name()] == TOTAL_TOKENS:
                tokens = left if tokens is None else min(tokens, left)
            else:
                micro = left if micro is None else min(micro, left)
        return tokens, micro


def retry_after(resets: list[float]) -> int:
    """Seconds until the last of the windows that refused a run resets (at least 1)."""
    return max(1, math.ceil(max(resets) - clock.now()))


def scopes_of(payload: Mapping[str, Any], token: str | None, session: str | None) -> RunScopes:
    """The scope keys of a run from its payload (``agent_slug``), token and session."""
    agent = payload.get("agent_slug")
    return RunScopes(agent=agent if isinstance(agent, str) and agent else None,
                     token=token or None, session=session or None)

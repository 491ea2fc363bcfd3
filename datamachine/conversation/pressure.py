"""Budget pressure: warn the model in the request as any budget runs low, never in the transcript.

Tiers are computed from the budget's numbers before each request (DESIGN.md section 10,
"Pressure tiers"), so they scale with small ceilings. From the request a tier is reached, every
request carries the highest tier's message with current numbers; the ``budget_pressure`` event
fires once per tier per run. The message is added to the *copy* of the messages sent to the
provider: stored transcripts and ``result.messages`` are identical with and without pressure.
At the warning tier a budget may opt into wrap-up: only allowed tools are offered, and a model
that ignores the warning (tool calls, no text) gets one stronger message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api import IterationBudget
from agents_api.errors import brief_repr
from datamachine.budgets_builtin import CONVERSATION_TURNS, TOOL_CALLS, WALL_CLOCK
from datamachine.conversation.inputs import TextRole
from datamachine.errors import UsageError

__all__ = ["BudgetPressure", "PressureTracker", "default_tier", "metered_tier",
           "parse_budget_pressure"]

CAUTION = "caution"
WARNING = "warning"
ESCALATION = "final_warning"

_UNITS = {CONVERSATION_TURNS: "turn", "turns": "turn", TOOL_CALLS: "tool call",
          WALL_CLOCK: "second"}
_CAUTION_TEXT = ("[BUDGET: {unit} {current}/{ceiling}. {remaining} left. Start consolidating "
                 "your work.]")
_WARNING_TEXT = ("[BUDGET WARNING: {unit} {current}/{ceiling}. {remaining} left. Give your final "
                 "answer now; call a tool only if it is essential.]")
_ESCALATION_TEXT = ("[BUDGET FINAL WARNING: {unit} {current}/{ceiling}. {remaining} left. Stop "
                    "calling tools and write your final answer with what you have.]")
# Token and cost budgets speak in what they count: "7,200 tokens of 10,000 tokens", "$0.72 of
# $1.00" ({label}: the budget's name in words).
_METERED_CAUTION = ("[BUDGET: {current} of {ceiling} used ({label}). {remaining} left. Start "
                    "consolidating your work.]")
_METERED_WARNING = ("[BUDGET WARNING: {current} of {ceiling} used ({label}). {remaining} left. "
                    "Give your final answer now; call a tool only if it is essential.]")
_METERED_ESCALATION = ("[BUDGET FINAL WARNING: {current} of {ceiling} used ({label}). "
                       "{remaining} left. Stop calling tools and write your final answer with "
                       "what you have.]")
# Token and cost budgets: a tier by the fraction already spent.
METERED_CAUTION_AT = 0.7
METERED_WARNING_AT = 0.9


class TierConfig(BaseModel):
    """A custom tier: fires from the first request k with k / ceiling >= ``at``."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    at: float = Field(gt=0, le=1)
    message: str = Field(min_length=1)
    name: str | None = None


class WrapUpConfig(BaseModel):
    """Wrap-up at the warning tier: offer only ``allowed_tools`` (none by default)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    allowed_tools: list[str] = Field(default_factory=list)


class BudgetPressureConfig(BaseModel):
    """Pressure settings for one budget (payload ``budget_pressure[name]``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    tiers: list[TierConfig] | None = None
    # A role a provider takes for a text message (any other failed the request mid-run).
    role: TextRole = "user"
    wrap_up: bool | WrapUpConfig = False


@dataclass
class BudgetPressure:
    """The resolved pressure rules of one budget in one run."""

    name: str
    tiers: list[TierConfig] | None = None
    role: str = "user"
    wrap_up: WrapUpConfig | None = None


def parse_budget_pressure(
    value: object, setting: object = None
) -> dict[str, BudgetPressure] | bool:
    """Resolve the payload's ``budget_pressure`` (and the ``budget_pressure`` setting).

    Returns ``True`` for default tiers on every budget, a mapping of per-budget rules, or
    ``False`` when pressure is off. Bad shapes raise :class:`UsageError` naming the key.
    """
    if value is None:
        value = bool(setting) if isinstance(setting, bool) else False
    if isinstance(value, bool):
        return value
    if not isinstance(value, Mapping):
        raise UsageError("payload['budget_pressure'] must be True/False or a dict of "
                         "{budget_name: {'tiers': [...], 'role': ..., 'wrap_up': ...}}.")
    resolved: dict[str, BudgetPressure] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"payload['budget_pressure'] keys must be budget names, got "
                             f"{brief_repr(name)}.")
        try:
            # model_validate, not **raw: a key that is not a string is a field error too.
            config = BudgetPressureConfig.model_validate(raw if isinstance(raw, Mapping) else {})
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise UsageError(
                f"payload['budget_pressure'][{brief_repr(name)}].{where}: {error['msg']}."
            ) from None
        if raw is not True and not isinstance(raw, Mapping):
            raise UsageError(f"payload['budget_pressure'][{brief_repr(name)}] must be True or "
                             "a dict.")
        wrap = config.wrap_up
        resolved[str(name)] = BudgetPressure(
            name=str(name), tiers=config.tiers, role=config.role,
            wrap_up=(wrap if isinstance(wrap, WrapUpConfig) else WrapUpConfig()) if wrap else None,
        )
    return resolved


def metered_tier(spent: int, ceiling: int) -> str | None:
    """The default tier of a token or cost budget with ``spent`` of ``ceiling`` used."""
    fraction = spent / ceiling
    if fraction >= METERED_WARNING_AT:
        return WARNING
    if fraction >= METERED_CAUTION_AT:
        return CAUTION
    return None


def _shown(unit: str, amount: int) -> str:
    if unit == "microdollars":
        from datamachine.conversation.metering import format_usd

        return format_usd(amount)
    return f"{amount:,} tokens"


def default_tier(current: int, ceiling: int) -> str | None:
    """The default tier before the request of unit ``current`` (1-based) of ``ceiling``."""
    left = ceiling - current
    if left <= max(1, round(0.1 * ceiling)):
        return WARNING
    if left <= max(2, round(0.3 * ceiling)):
        return CAUTION
    return None


@dataclass
class PressureTracker:
    """Per-run pressure state: which tiers fired, and whether wrap-up must escalate."""

    rules: dict[str, BudgetPressure] | bool
    emit: Callable[[str, dict[str, Any]], None]
    # The unit of each token or cost budget ("tokens", "microdollars"); others count.
    units: Mapping[str, str] = field(default_factory=dict)
    # Budgets that never take part (the context window while compaction keeps it in check).
    skip: frozenset[str] = frozenset()
    fired: set[tuple[str, str]] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)
    _escalate: set[str] = field(default_factory=set)
    _escalated: set[str] = field(default_factory=set)

    def _rule(self, name: str) -> BudgetPressure | None:
        if self.rules is True:
            return BudgetPressure(name=name)
        if isinstance(self.rules, dict):
            return self.rules.get(name)
        return None

    def _tier(self, rule: BudgetPressure, current: int, ceiling: int,
              metered: bool = False) -> tuple[str, str] | None:
        if rule.tiers is None:
            tier = metered_tier(current, ceiling) if metered else default_tier(current, ceiling)
            if tier is None:
                return None
            if metered:
                return tier, _METERED_WARNING if tier == WARNING else _METERED_CAUTION
            return tier, _WARNING_TEXT if tier == WARNING else _CAUTION_TEXT
        reached = [t for t in rule.tiers if current / ceiling >= t.at]
        if not reached:
            return None
        best = max(reached, key=lambda t: t.at)
        index = rule.tiers.index(best) + 1
        return best.name or f"tier_{index}", best.message

    def apply(
        self, tools: list[dict[str, Any]], budgets: Mapping[str, IterationBudget],
    ) -> tuple[list[dict[str, str]] | None, list[dict[str, Any]]]:
        """The pressure notices this request carries after the transcript's messages (None
        when there are none), and the tools it offers (``tools`` itself when wrap-up took
        none away)."""
        if self.rules is False:
            return None, tools
        notices: list[tuple[str, str]] = []
        offered = tools
        # A copy: a tool thread abandoned at the deadline may still add a budget to the run.
        for name, budget in list(budgets.items()):
            rule = self._rule(name) if name not in self.skip else None
            if rule is None:
                continue
            ceiling = budget.ceiling()
            unit = self.units.get(name)
            # A count's tier looks at the unit the coming request uses; a token or cost
            # budget's at what is already spent (the coming request's spend is unknown).
            current = (min(budget.current(), ceiling) if unit is not None
                       else min(budget.current() + 1, ceiling))
            found = self._tier(rule, current, ceiling, metered=unit is not None)
            if found is None:
                continue
            tier, template = found
            if (name, tier) not in self.fired:
                self.fired.add((name, tier))
                self.emit("budget_pressure", {"budget": name, "tier": tier, "current": current,
                                              "ceiling": ceiling})
            if rule.wrap_up is not None and tier == WARNING:
                allowed = set(rule.wrap_up.allowed_tools)
                offered = [t for t in offered if t["name"] in allowed]
                self._warned.add(name)
                if name in self._escalate and name not in self._escalated:
                    self._escalated.add(name)
                    template = _METERED_ESCALATION if unit is not None else _ESCALATION_TEXT
                    self.emit("budget_pressure", {"budget": name, "tier": ESCALATION,
                                                  "current": current, "ceiling": ceiling})
            values: dict[str, Any] = {
                "unit": _UNITS.get(name, name.replace("_", " ")), "budget": name,
                "label": name.replace("_", " "), "current": current, "ceiling": ceiling,
                "remaining": max(0, ceiling - current)}
            if unit is not None:
                for key in ("current", "ceiling", "remaining"):
                    values[key] = _shown(unit, values[key])
            try:
                text = template.format_map(values)
            except (KeyError, ValueError, IndexError):
                text = template
            notices.append((rule.role, text))
        if not notices:
            return None, offered
        return [{"role": role, "content": text} for role, text in notices], offered

    def observe(self, content: str, tool_calls: list[dict[str, Any]]) -> None:
        """A model that answered a warning with tool calls only gets one stronger message."""
        if tool_calls and not content.strip():
            self._escalate |= self._warned - self._escalated
        self._warned.clear()

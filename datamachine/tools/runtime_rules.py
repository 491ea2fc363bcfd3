"""Tool runtime rules: ordering constraints a run puts on its tool calls.

A workflow often knows what a sensible order is even when the model does not: look at a few
files and then act, read the draft before publishing it, verify after publishing before
publishing again. ``payload["tool_runtime_rules"]`` states such constraints as data; they are
validated before the run starts (a bad rule is a :class:`InvalidToolRuntimeRule` naming its
index and field) and checked before every call, in order, the first rejection winning. A
rejection is a failed tool result starting ``TOOL POLICY REJECTED:`` that tells the model what
to do instead.

Three rule types:

- inspection budget (no ``type``, or ``"inspection_budget"``): after ``after_tool``, at most
  ``max_calls`` calls of ``limited_tools``; then the next tool must be one of
  ``then_require_one_of`` (once one of those succeeds, the limit is lifted until the next
  ``after_tool``).
- ``require_prior_tool``: ``before_tool`` runs only after one of ``require_prior_tool``
  succeeded, optionally with given argument values (``require_prior_tool_parameters``).
- ``block_until_tool``: after ``after_tool``, ``blocked_tools`` are refused until one of
  ``until_one_of`` succeeds.

Rules read the calls that actually ran: a rejected call never counts. Triggers and requirements
are met only by calls that succeeded (a failed publish must not block its own retry, and a failed
review is no review). The inspection budget counts every limited call that ran, successful or
not, because each one cost a turn. Each rule keeps its own small state, updated from the
transcript index as results arrive, so checking costs the same on turn 50 as on turn 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from agents_api.jsontext import compact_json
from datamachine.errors import InvalidToolRuntimeRule
from datamachine.tools.history import CompletedCall
from datamachine.tools.results import rejected_result

__all__ = [
    "POLICY_PREFIX",
    "RULE_ERROR_TYPE",
    "BlockUntilToolRule",
    "InspectionBudgetRule",
    "RequirePriorToolRule",
    "RuntimeRule",
    "RuntimeRuleSet",
    "parse_runtime_rules",
]

POLICY_PREFIX = "TOOL POLICY REJECTED:"
RULE_ERROR_TYPE = "tool_runtime_rule_rejected"
_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _name_list(value: Any) -> Any:
    # "a" and ["a", "b"] both work; a single string is the common case in hand-written rules.
    if isinstance(value, str):
        return [value]
    return value


def _non_empty_names(value: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value)
    if not names or any(not name for name in names):
        raise ValueError("must name at least one tool, with no empty names")
    return names


ToolName = Annotated[str, Field(min_length=1), BeforeValidator(
    lambda v: v.strip() if isinstance(v, str) else v)]
ToolNames = Annotated[tuple[str, ...], BeforeValidator(_name_list),
                     AfterValidator(_non_empty_names)]


class _Rule(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, populate_by_name=True)

    id: str | None = None

    def rule_id(self, index: int) -> str:
        """A log-safe id: the configured one (unsafe characters removed) or one from the index."""
        cleaned = _ID_UNSAFE.sub("", self.id or "")
        return cleaned or f"tool-runtime-rule-{index}"


class InspectionBudgetRule(_Rule):
    """After ``after_tool``: at most ``max_calls`` limited calls, then one of the required tools."""

    type: Literal["inspection_budget"] = "inspection_budget"
    after_tool: ToolName
    limited_tools: ToolNames = Field(
        validation_alias=AliasChoices("limited_tools", "limited_tool_names"))
    max_calls: StrictInt = Field(gt=0)
    then_require_one_of: ToolNames


class RequirePriorToolRule(_Rule):
    """``before_tool`` only after one of ``require_prior_tool`` succeeded (with given values)."""

    type: Literal["require_prior_tool"]
    before_tool: ToolName
    require_prior_tool: ToolNames = Field(
        validation_alias=AliasChoices("require_prior_tool", "require_prior_tools"))
    require_prior_tool_parameters: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("require_prior_tool_parameters")
    @classmethod
    def _conditions_name_required_tools(
        cls, value: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        required = info.data.get("require_prior_tool", ())
        unknown = [name for name in value if name not in required]
        if unknown:
            raise ValueError(
                f"names {', '.join(unknown)}, which is not one of require_prior_tool "
                f"({', '.join(required) or 'none'})"
            )
        return value


class BlockUntilToolRule(_Rule):
    """After ``after_tool``, ``blocked_tools`` wait until one of ``until_one_of`` succeeded."""

    type: Literal["block_until_tool"]
    after_tool: ToolName
    blocked_tools: ToolNames = Field(
        validation_alias=AliasChoices("blocked_tools", "blocked_tool_names"))
    until_one_of: ToolNames = Field(
        validation_alias=AliasChoices("until_one_of", "then_require_one_of"))


RuntimeRule = InspectionBudgetRule | RequirePriorToolRule | BlockUntilToolRule

_RULE_TYPES: dict[
    str | None, type[InspectionBudgetRule] | type[RequirePriorToolRule] | type[BlockUntilToolRule]
] = {
    None: InspectionBudgetRule,
    "inspection_budget": InspectionBudgetRule,
    "require_prior_tool": RequirePriorToolRule,
    "block_until_tool": BlockUntilToolRule,
}


def parse_runtime_rules(raw: Any) -> list[RuntimeRule]:
    """Validate ``payload["tool_runtime_rules"]`` (None or a list of dicts or rule models).

    Raises :class:`InvalidToolRuntimeRule` naming the index and field of the first bad rule.
    """
    if raw is None:
        return []
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Sequence):
        raise InvalidToolRuntimeRule(
            f"tool_runtime_rules must be a list of rule dicts, got {type(raw).__name__}."
        )
    rules: list[RuntimeRule] = []
    for index, item in enumerate(raw):
        where = f"tool_runtime_rules[{index}]"
        if isinstance(item, InspectionBudgetRule | RequirePriorToolRule | BlockUntilToolRule):
            rules.append(item)
            continue
        if not isinstance(item, Mapping):
            raise InvalidToolRuntimeRule(f"{where} must be a dict, got {type(item).__name__}.")
        kind = item.get("type")
        model = _RULE_TYPES.get(kind) if kind is None or isinstance(kind, str) else None
        if model is None:
            known = ", ".join(repr(k) for k in _RULE_TYPES if k is not None)
            raise InvalidToolRuntimeRule(
                f"{where}.type: unknown rule type {kind!r}; use one of {known} (or leave "
                "'type' out for an inspection budget)."
            )
        data = dict(item)
        if data.get("type") is None:
            data.pop("type", None)
        try:
            rule = model.model_validate(data)
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            raise InvalidToolRuntimeRule(
                f"{where}{'.' + field if field else ''}: {message}."
            ) from None
        rules.append(rule)
    return rules


# -- evaluation ------------------------------------------------------------------------------

def _same(a: Any, b: Any) -> bool:
    # Strict: True is not 1, and "1" is not 1.
    if type(a) is not type(b) and not (
        isinstance(a, int | float) and isinstance(b, int | float)
        and not isinstance(a, bool) and not isinstance(b, bool)
    ):
        return False
    return bool(a == b)


def _names(names: Sequence[str]) -> str:
    return ", ".join(names)


class _State:
    """One rule's view of the run so far; updated per completed call."""

    def __init__(self, rule: RuntimeRule, index: int) -> None:
        self.rule = rule
        self.rule_id = rule.rule_id(index)
        self.reset()

    def reset(self) -> None:
        self.triggered = False
        self.satisfied = False
        self.count = 0

    def observe(self, call: CompletedCall) -> None:
        if call.rejected:
            return  # a rejected call never ran
        rule = self.rule
        if isinstance(rule, InspectionBudgetRule):
            if call.name == rule.after_tool:
                if call.success:
                    self.triggered, self.satisfied, self.count = True, False, 0
                return
            if not self.triggered:
                return
            if call.name in rule.then_require_one_of and call.success:
                self.satisfied = True
            if call.name in rule.limited_tools:
                self.count += 1
        elif isinstance(rule, RequirePriorToolRule):
            if call.success and call.name in rule.require_prior_tool and self._conditions_met(
                rule, call
            ):
                self.satisfied = True
        else:
            if call.name == rule.after_tool and call.success:
                self.triggered, self.satisfied = True, False
            elif self.triggered and call.success and call.name in rule.until_one_of:
                self.satisfied = True

    @staticmethod
    def _conditions_met(rule: RequirePriorToolRule, call: CompletedCall) -> bool:
        conditions = rule.require_prior_tool_parameters.get(call.name) or {}
        return all(
            key in call.parameters and _same(call.parameters[key], value)
            for key, value in conditions.items()
        )

    def check(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """``(message, policy context)`` when ``name`` may not run now, else None."""
        rule = self.rule
        if isinstance(rule, InspectionBudgetRule):
            if (not self.triggered or self.satisfied or name in rule.then_require_one_of
                    or self.count < rule.max_calls):
                return None
            message = (
                f"{POLICY_PREFIX} After {rule.after_tool}, you already used {self.count} of "
                f"{rule.max_calls} allowed calls of the inspection tools "
                f"({_names(rule.limited_tools)}). Do not inspect further. The next tool must be "
                f"one of: {_names(rule.then_require_one_of)}."
            )
            return message, {
                "rule_id": self.rule_id, "type": rule.type, "after_tool": rule.after_tool,
                "limited_tools": list(rule.limited_tools), "limited_count": self.count,
                "max_calls": rule.max_calls, "then_require_one_of": list(rule.then_require_one_of),
                "rejected_tool": name,
            }
        if isinstance(rule, RequirePriorToolRule):
            if name != rule.before_tool or self.satisfied:
                return None
            options = []
            for required in rule.require_prior_tool:
                conditions = rule.require_prior_tool_parameters.get(required)
                if conditions:
                    spelled = ", ".join(f"{key}={compact_json(value)}"
                                        for key, value in conditions.items())
                    options.append(f"{required} (with {spelled})")
                else:
                    options.append(required)
            message = (f"{POLICY_PREFIX} Before using {rule.before_tool}, first use one of: "
                       f"{_names(options)}.")
            return message, {
                "rule_id": self.rule_id, "type": rule.type, "before_tool": rule.before_tool,
                "require_prior_tool": list(rule.require_prior_tool),
                "require_prior_tool_parameters": rule.require_prior_tool_parameters,
                "rejected_tool": name,
            }
        if (not self.triggered or self.satisfied or name not in rule.blocked_tools
                or name in rule.until_one_of):
            return None
        message = (
            f"{POLICY_PREFIX} After {rule.after_tool}, do not use {name} again until one of "
            f"these follow-up tools succeeds: {_names(rule.until_one_of)}."
        )
        return message, {
            "rule_id": self.rule_id, "type": rule.type, "after_tool": rule.after_tool,
            "blocked_tools": list(rule.blocked_tools), "until_one_of": list(rule.until_one_of),
            "rejected_tool": name,
        }


class RuntimeRuleSet:
    """A run's rules with their state; plug into a :class:`TranscriptIndex` as its observer."""

    __slots__ = ("_states",)

    def __init__(self, rules: Sequence[RuntimeRule]) -> None:
        self._states = [_State(rule, index) for index, rule in enumerate(rules)]

    def __bool__(self) -> bool:
        return bool(self._states)

    def observe(self, call: CompletedCall) -> None:
        """Update every rule with one completed call (transcript order)."""
        for state in self._states:
            state.observe(call)

    def reset(self) -> None:
        """Forget the run so far (the transcript was replaced)."""
        for state in self._states:
            state.reset()

    def check(self, tool_name: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first rule's rejection result for this call, or None when every rule allows it."""
        for state in self._states:
            verdict = state.check(tool_name)
            if verdict is not None:
                message, policy = verdict
                return rejected_result(tool_name, parameters, message, RULE_ERROR_TYPE,
                                       policy=policy)
        return None

"""Completion assertions: what a run must have achieved before a final answer counts.

A model that stops talking is not always done: it may have looked around and then summarized
instead of publishing. ``payload["completion_assertions"]`` states the outcome as data, checked
against what actually happened in the run:

- ``required_tool_names``: each tool needs at least one *successful* call.
- ``minimum_successful_tool_counts``: ``{tool: n}``, at least ``n`` successful calls.
- ``required_engine_data_keys``: keys that must hold a non-empty value in the run's engine data.
- ``complete_when_any``: named outcomes; the first one whose tools all succeeded (with the
  required outputs, called with the required parameters, often enough) satisfies the group.

The config is parsed once, before the run (a wrong type is an
:class:`~datamachine.errors.InvalidCompletionAssertions` naming the field; an unknown key is a
warning, so a typo never silently disables an assertion). Successful tool results are recorded
as they arrive (:class:`AssertionTracker`) and :meth:`AssertionTracker.evaluate` reports the
required, satisfied and missing entries as plain lists a user (never the model) reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)

from datamachine.errors import InvalidCompletionAssertions
from datamachine.tools.results import REJECTED

__all__ = [
    "COMPLETE_WHEN_ANY",
    "ENGINE_DATA_KEYS",
    "TOOL_COUNTS",
    "TOOL_NAMES",
    "AssertionTracker",
    "CompletionAssertions",
    "Evaluation",
    "Outcome",
    "ToolRequirement",
    "has_value",
    "is_successful",
    "lookup_path",
    "parse_assertions",
    "strict_equal",
]

# The diagnostic groups, as they appear in ``completion_assertions_required`` / ``_missing`` /
# ``_satisfied``.
ENGINE_DATA_KEYS = "engine_data_keys"
TOOL_NAMES = "tool_names"
TOOL_COUNTS = "tool_counts"
COMPLETE_WHEN_ANY = "complete_when_any"

_OUTCOME_UNSAFE = re.compile(r"[^a-z0-9_-]+")
_MISSING: Any = object()


def _name_list(value: Any) -> Any:
    """One name or a list of names -> trimmed, de-duplicated, empties dropped."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ValueError(f"must be a list of names (or one name), got {type(value).__name__}")
    names: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"entries must be strings, got {item!r}")
        name = item.strip()
        if name and name not in names:
            names.append(name)
    return names


NameList = Annotated[list[str], BeforeValidator(_name_list)]
PositiveCount = Annotated[StrictInt, Field(ge=1)]


class _Config(BaseModel):
    # extra="allow" keeps unknown keys visible so they can be reported instead of vanishing.
    # frozen: a parsed config is only read, so every run without assertions shares one.
    model_config = ConfigDict(defer_build=True, extra="allow", frozen=True)

    def _unknown(self, where: str) -> list[str]:
        extra = sorted(self.model_extra or {})
        if not extra:
            return []
        known = ", ".join(sorted(type(self).model_fields))
        keys = ", ".join(repr(k) for k in extra)
        noun = "key" if len(extra) == 1 else "keys"
        return [f"{where}: unknown {noun} {keys} ignored (known keys: {known})."]


class ToolRequirement(_Config):
    """One tool of an outcome: it must succeed ``min_successful_calls`` times, called with
    ``required_parameters`` (dotted path -> expected value, strict equality) and producing every
    ``required_output`` path (non-empty at the result root, under ``data`` or under
    ``result``)."""

    name: str
    required_output: NameList = Field(default_factory=list)
    required_parameters: dict[str, Any] = Field(default_factory=dict)
    min_successful_calls: PositiveCount = 1

    @field_validator("name", mode="before")
    @classmethod
    def _trimmed_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                raise ValueError("a tool name is required")
        return value

    @field_validator("required_parameters", mode="before")
    @classmethod
    def _parameters_mapping(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(
                "must be a dict of parameter path -> expected value, e.g. {'status': 'publish'}"
            )
        return dict(value)

    def to_dict(self) -> dict[str, Any]:
        """The normalized requirement, as reported in ``completion_assertions_required``."""
        return {"name": self.name, "required_output": list(self.required_output),
                "required_parameters": dict(self.required_parameters),
                "min_successful_calls": self.min_successful_calls}


def _tool_entries(value: Any) -> Any:
    # "publish" is shorthand for {"name": "publish"}.
    if isinstance(value, list | tuple):
        return [{"name": item} if isinstance(item, str) else item for item in value]
    return value


class Outcome(_Config):
    """A named way to finish: every listed tool requirement must hold."""

    name: str = ""
    tools: Annotated[list[ToolRequirement], BeforeValidator(_tool_entries)] = Field(min_length=1)

    @field_validator("name", mode="before")
    @classmethod
    def _sanitized(cls, value: Any) -> Any:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {type(value).__name__}")
        return _OUTCOME_UNSAFE.sub("_", value.strip().lower()).strip("_")

    def to_dict(self) -> dict[str, Any]:
        """The normalized outcome, as reported in ``completion_assertions_required``."""
        return {"name": self.name, "tools": [t.to_dict() for t in self.tools]}


def _counts(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be a dict of tool name -> minimum number of successful calls")
    counts: dict[Any, Any] = {}
    for key, count in value.items():
        if not isinstance(key, str):
            raise ValueError(f"tool names must be strings, got {key!r}")
        name = key.strip()
        if name:
            counts[name] = count
    return counts


class CompletionAssertions(_Config):
    """The parsed ``completion_assertions`` of one run (see the module docstring)."""

    required_tool_names: NameList = Field(default_factory=list)
    minimum_successful_tool_counts: Annotated[
        dict[str, PositiveCount], BeforeValidator(_counts)
    ] = Field(default_factory=dict)
    required_engine_data_keys: NameList = Field(default_factory=list)
    complete_when_any: list[Outcome] = Field(default_factory=list)

    @field_validator("complete_when_any", mode="before")
    @classmethod
    def _outcome_list(cls, value: Any) -> Any:
        if value is None:
            return []
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list of outcomes, each {'name': ..., 'tools': [...]}")
        return list(value)

    @field_validator("complete_when_any", mode="after")
    @classmethod
    def _named_outcomes(cls, outcomes: list[Outcome]) -> list[Outcome]:
        seen: set[str] = set()
        named = []
        for index, outcome in enumerate(outcomes, start=1):
            name = outcome.name or f"outcome_{index}"
            if name in seen:
                # Two outcomes reported under one name could not be told apart.
                name = f"{name}_{index}"
            seen.add(name)
            named.append(outcome if name == outcome.name
                         else outcome.model_copy(update={"name": name}))
        return named

    @property
    def configured(self) -> bool:
        """True when at least one assertion is set (an empty config asserts nothing)."""
        return bool(self.required_tool_names or self.minimum_successful_tool_counts
                    or self.required_engine_data_keys or self.complete_when_any)

    def required(self) -> dict[str, list[Any]]:
        """The non-empty assertion groups, normalized (``completion_assertions_required``)."""
        groups: dict[str, list[Any]] = {}
        if self.required_engine_data_keys:
            groups[ENGINE_DATA_KEYS] = list(self.required_engine_data_keys)
        if self.required_tool_names:
            groups[TOOL_NAMES] = list(self.required_tool_names)
        if self.minimum_successful_tool_counts:
            groups[TOOL_COUNTS] = [f"{tool}>={n}" for tool, n
                                   in self.minimum_successful_tool_counts.items()]
        if self.complete_when_any:
            groups[COMPLETE_WHEN_ANY] = [o.to_dict() for o in self.complete_when_any]
        return groups

    def warnings(self) -> list[str]:
        """One notice per object with unknown keys, naming where they are."""
        notes = self._unknown("completion_assertions")
        for i, outcome in enumerate(self.complete_when_any):
            where = f"completion_assertions.complete_when_any[{i}]"
            notes += outcome._unknown(where)
            for j, requirement in enumerate(outcome.tools):
                notes += requirement._unknown(f"{where}.tools[{j}]")
        return notes


# Plain-language replacements for pydantic's messages, keyed by error type.
_FRIENDLY = {
    "missing": "is required",
    "too_short": "must list at least one tool",
    "int_type": "must be a positive integer",
    "greater_than_equal": "must be a positive integer",
    "dict_type": "must be a dict",
    "list_type": "must be a list",
    "string_type": "must be a string",
}


def _location(loc: Sequence[int | str]) -> str:
    text = "completion_assertions"
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


_EMPTY: list[CompletionAssertions] = []


def _empty() -> CompletionAssertions:
    """The config of a run without assertions (made on first use: the model is built lazily)."""
    if not _EMPTY:
        _EMPTY.append(CompletionAssertions())
    return _EMPTY[0]


def parse_assertions(
    raw: Mapping[str, Any] | CompletionAssertions | None,
) -> tuple[CompletionAssertions, list[str]]:
    """Parse a ``completion_assertions`` dict; return the config and its warnings.

    Raises :class:`InvalidCompletionAssertions` naming the first bad field.
    """
    if isinstance(raw, CompletionAssertions):
        return raw, raw.warnings()
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidCompletionAssertions(
            f"completion_assertions must be a dict, got {type(raw).__name__}."
        )
    if not raw:
        return _empty(), []
    try:
        parsed = CompletionAssertions.model_validate(dict(raw))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = _FRIENDLY.get(error["type"]) or str(error["msg"]).removeprefix(
                "Value error, ")
            problems.append(f"{_location(error['loc'])}: {message}")
        raise InvalidCompletionAssertions("; ".join(problems) + ".") from None
    return parsed, parsed.warnings()


# -- evaluation helpers ---------------------------------------------------------------------
def lookup_path(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` (``"post.url"``, ``"items.0.id"``) or a sentinel.

    A literal key containing dots wins over the dotted walk. Use :func:`has_value` on the
    answer; the sentinel never has one.
    """
    if isinstance(data, Mapping) and path in data:
        return data[path]
    current = data
    for part in path.split("."):
        if isinstance(current, Mapping):
            if part not in current:
                return _MISSING
            current = current[part]
        elif isinstance(current, list | tuple) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def has_value(value: Any) -> bool:
    """Non-empty: not missing, not None, not a blank string, not an empty collection.

    ``0`` and ``False`` are values (a count of zero is an answer).
    """
    if value is _MISSING or value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, Mapping | list | tuple | set):
        return bool(value)
    return True


def strict_equal(actual: Any, expected: Any) -> bool:
    """Equality that also requires the same JSON type: ``1 != True``, ``1 != 1.0``, ``"1" != 1``.

    A model that sends ``"true"`` for ``true`` did not call the tool the way the assertion asks.
    """
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        return actual.keys() == expected.keys() and all(
            strict_equal(actual[k], expected[k]) for k in expected
        )
    if isinstance(actual, list | tuple) and isinstance(expected, list | tuple):
        return len(actual) == len(expected) and all(
            strict_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    return type(actual) is type(expected) and bool(actual == expected)


def is_successful(result: Mapping[str, Any]) -> bool:
    """A tool result that counts: ``success`` is True and it was not a call the executor
    refused (``REJECTED``, a key no tool can set)."""
    return result.get("success") is True and result.get(REJECTED) is not True


def _output_roots(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    # What the tool returned sits under the normalized result's "result"; tools put their data
    # at its root, under its "data" or under its own "result" ({"result": {"html_url": ...}}).
    roots: list[Mapping[str, Any]] = [result]
    inner = result.get("result")
    candidates = [result.get("data"), inner]
    if isinstance(inner, Mapping):
        candidates += [inner.get("data"), inner.get("result")]
    for candidate in candidates:
        if isinstance(candidate, Mapping):
            roots.append(candidate)
    return roots


def _has_output(result: Mapping[str, Any], path: str) -> bool:
    return any(has_value(lookup_path(root, path)) for root in _output_roots(result))


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class RecordedCall:
    """One successful call: the parameters it was called with and its result."""

    parameters: Mapping[str, Any]
    result: Mapping[str, Any]


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class Evaluation:
    """Where a run stands against its assertions.

    ``required``, ``satisfied`` and ``missing`` map group names (``tool_names``, ``tool_counts``,
    ``engine_data_keys``, ``complete_when_any``) to lists; empty groups are left out.
    """

    configured: bool
    required: dict[str, list[Any]] = field(default_factory=dict)
    satisfied: dict[str, list[Any]] = field(default_factory=dict)
    missing: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Nothing is missing (always True when no assertion is configured)."""
        return not self.missing


class AssertionTracker:
    """Records one run's successful tool results and evaluates its assertions against them.

    Only successful results count. Results are kept only for tools an outcome inspects
    (outputs, parameters); every other tool is just counted, so a long run does not hold
    every result it ever saw.
    """

    def __init__(self, assertions: CompletionAssertions) -> None:
        self.assertions = assertions
        self._counts: dict[str, int] = {}
        self._calls: dict[str, list[RecordedCall]] = {}
        self._inspected = {t.name for o in assertions.complete_when_any for t in o.tools}

    def record(self, tool_name: str, result: Mapping[str, Any],
               parameters: Mapping[str, Any] | None = None) -> bool:
        """Record ``result`` if it was successful; return whether it was.

        ``parameters`` are the arguments the tool was called with; when omitted, the result's
        own ``parameters`` key (set by the tool executor) is used.
        """
        if not is_successful(result):
            return False
        self._counts[tool_name] = self._counts.get(tool_name, 0) + 1
        if tool_name in self._inspected:
            if parameters is None:
                parameters = result.get("parameters")
            params = dict(parameters) if isinstance(parameters, Mapping) else {}
            self._calls.setdefault(tool_name, []).append(RecordedCall(params, dict(result)))
        return True

    def successful_count(self, tool_name: str) -> int:
        """How many successful results ``tool_name`` has had in this run."""
        return self._counts.get(tool_name, 0)

    def evaluate(self, engine_data: Mapping[str, Any] | None = None) -> Evaluation:
        """Check every assertion now; ``engine_data`` is the run's current engine data."""
        config = self.assertions
        if not config.configured:
            return Evaluation(configured=False)
        satisfied: dict[str, list[Any]] = {}
        missing: dict[str, list[Any]] = {}

        data = engine_data if isinstance(engine_data, Mapping) else {}
        for key in config.required_engine_data_keys:
            group = satisfied if has_value(lookup_path(data, key)) else missing
            group.setdefault(ENGINE_DATA_KEYS, []).append(key)
        for tool in config.required_tool_names:
            group = satisfied if self.successful_count(tool) > 0 else missing
            group.setdefault(TOOL_NAMES, []).append(tool)
        for tool, needed in config.minimum_successful_tool_counts.items():
            actual = self.successful_count(tool)
            if actual >= needed:
                satisfied.setdefault(TOOL_COUNTS, []).append(f"{tool}>={needed}")
            else:
                missing.setdefault(TOOL_COUNTS, []).append(f"{tool}: {actual}/{needed}")
        if config.complete_when_any:
            winner, gaps = self._first_outcome(config.complete_when_any)
            if winner is not None:
                satisfied[COMPLETE_WHEN_ANY] = [winner]
            else:
                missing[COMPLETE_WHEN_ANY] = gaps
        return Evaluation(configured=True, required=config.required(), satisfied=satisfied,
                          missing=missing)

    def _first_outcome(self, outcomes: Sequence[Outcome]) -> tuple[str | None, list[str]]:
        gaps: list[str] = []
        for outcome in outcomes:
            labels = [label for requirement in outcome.tools
                      for label in self._requirement_gaps(requirement)]
            if not labels:
                return outcome.name, []
            gaps.append(f"{outcome.name}: {', '.join(labels)}")
        return None, gaps

    def _requirement_gaps(self, requirement: ToolRequirement) -> list[str]:
        name = requirement.name
        matching = [call for call in self._calls.get(name, ())
                    if all(strict_equal(lookup_path(call.parameters, path), expected)
                           for path, expected in requirement.required_parameters.items())]
        if not matching:
            return [name]
        outputs = requirement.required_output
        absent = [path for path in outputs
                  if not any(_has_output(call.result, path) for call in matching)]
        qualifying = sum(1 for call in matching
                         if all(_has_output(call.result, path) for path in outputs))
        if qualifying >= requirement.min_successful_calls:
            return []
        labels = [f"{name}.{path}" for path in absent]
        if requirement.min_successful_calls > 1 or not labels:
            labels.append(f"{name} x{requirement.min_successful_calls}")
        return labels

    def referenced_tool_names(self) -> list[str]:
        """Every tool name an assertion mentions (for preflight and diagnostics)."""
        return referenced_tool_names(self.assertions)


def referenced_tool_names(config: CompletionAssertions) -> list[str]:
    """Every tool name an assertion mentions, in config order, without repeats."""
    names: list[str] = []
    candidates = [*config.required_tool_names, *config.minimum_successful_tool_counts,
                  *(t.name for o in config.complete_when_any for t in o.tools)]
    for name in candidates:
        if name not in names:
            names.append(name)
    return names

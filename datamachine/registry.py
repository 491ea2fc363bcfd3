"""Named iteration budgets, resolved per run: :class:`IterationBudgetRegistry`.

Budgets are registered once at boot (by ``bootstrap.py`` and by plugins) and instantiated per
run. Resolution is always the same: caller override, else the setting, else the default, then
the clamp, which is non-negotiable. Anything clamped is reported, never silently applied.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from agents_api import IterationBudget
from agents_api.errors import brief_repr
from datamachine.errors import (
    InvalidBudgetSpec,
    InvalidBudgetValue,
    UsageError,
    first_field_error,
)

__all__ = [
    "CLAMPED",
    "MAX_BUDGET_VALUE",
    "MAX_METERED_VALUE",
    "MICRODOLLARS_PER_USD",
    "SCOPES",
    "UNITS",
    "UNLIMITED",
    "UNREGISTERED_SPEC",
    "BudgetSpec",
    "IterationBudgetRegistry",
    "ResolvedCeiling",
    "unit_maximum",
    "usd_to_microdollars",
    "validate_budget_value",
]

MAX_BUDGET_VALUE = 10_000
# Tokens and microdollars run into the millions in one run: their ceilings may go to 10^12.
MAX_METERED_VALUE = 10**12
# Seconds of wall clock a seconds budget may be given at all (about 115 days): the built-in
# wall clock's own clamp is a day, which a plugin may widen.
MAX_SECONDS_VALUE = 10_000_000
BudgetUnit = Literal["count", "tokens", "microdollars", "seconds"]
UNITS: tuple[BudgetUnit, ...] = ("count", "tokens", "microdollars", "seconds")
# What one count of a budget spans: a run (the default), one provider request (its retries), a
# queued job (its attempts), a chat session (its turns), an agent-to-agent chain (its depth).
BudgetScope = Literal["run", "request", "job", "session", "chain"]
SCOPES: tuple[BudgetScope, ...] = ("run", "request", "job", "session", "chain")
# What every clamp notice says (``ResolvedCeiling.warning``): how a report picks them out.
CLAMPED = "is outside its range"
# What a run's warning says of a budget_ceilings name no budget has (see ``meant``); the
# command line shows such a notice even when it shows no report.
MISNAMED = "no budget is named"
# The ceiling of a budget registered with ``unlimited=True`` that is given no limit at all.
UNLIMITED = "unlimited"
MICRODOLLARS_PER_USD = 1_000_000
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def unit_maximum(unit: str) -> int:
    """The largest ceiling a budget of ``unit`` may have: 10,000 counts, 10^7 seconds,
    10^12 tokens or microdollars."""
    if unit == "count":
        return MAX_BUDGET_VALUE
    return MAX_SECONDS_VALUE if unit == "seconds" else MAX_METERED_VALUE


def validate_budget_value(knob: str, value: object, *, maximum: int = MAX_BUDGET_VALUE,
                          minimum: int = 1, note: str = "") -> int:
    """Return ``value`` if it is an integer from ``minimum`` (1; 0 for a budget that counts
    repeats) to ``maximum`` (10,000, the limit of every count; 10^12 for a token or
    microdollar budget).

    Used for every user-supplied ceiling (``max_turns``, ``--max-turns``, a budget setting);
    anything else raises :class:`InvalidBudgetValue` naming ``knob``. Nothing is coerced:
    ``"10"``, ``10.0`` and ``True`` are refused. ``note`` follows the range in the message
    (a budget's clamp).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        kind = "a positive integer" if minimum >= 1 else "a whole number"
        shown = (f"{brief_repr(value)} ({type(value).__name__})"
                 if isinstance(value, bool) or not isinstance(value, int) else brief_repr(value))
        raise InvalidBudgetValue(
            f"{knob} must be {kind} between {minimum} and {maximum:,}{note}, got {shown}.")
    return value


def usd_to_microdollars(knob: str, value: object) -> int:
    """``value`` dollars (a positive finite number, at most 10^6) as whole microdollars,
    rounded up, so a limit never grows by rounding; anything else raises
    :class:`InvalidBudgetValue` naming ``knob``."""
    # Compared before anything converts it: float(10**400) raises OverflowError, NaN compares
    # false both ways.
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value <= MAX_METERED_VALUE / MICRODOLLARS_PER_USD):
        raise InvalidBudgetValue(
            f"{knob} must be a positive number of US dollars, at most "
            f"{MAX_METERED_VALUE // MICRODOLLARS_PER_USD:,}, got {brief_repr(value)}.")
    return max(1, math.ceil(round(value * MICRODOLLARS_PER_USD, 6)))


def budget_value(spec: BudgetSpec, knob: str, value: object, *, dollars: bool = False
                 ) -> int | None:
    """A ceiling someone gave for ``spec`` (a setting, ``budget_ceilings``, a flag) as an
    integer in its unit, or None for ``"unlimited"`` where the budget allows it. Checked only
    against the unit's range (the clamp to ``[min, max]`` comes later, and is reported): a
    count or token budget takes an integer (0 where the budget counts repeats), a seconds
    budget a positive number (fractions round up), a microdollar budget's setting named
    ``*_usd`` dollars (``max_cost_usd: 0.5``, ``dollars=True``). Anything else raises
    :class:`InvalidBudgetValue` naming ``knob`` and what it takes."""
    if value == UNLIMITED and spec.unlimited:
        return None
    if dollars and spec.unit == "microdollars":
        return usd_to_microdollars(knob, value)
    maximum = unit_maximum(spec.unit)
    if spec.unit == "seconds":
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not 0 < value <= maximum):
            raise InvalidBudgetValue(f"{knob} must be a finite positive number of seconds, at most "
                                     f"{maximum:,}, got {brief_repr(value)}.")
        return max(1, math.ceil(value))
    # What is taken is the unit's range; the budget's clamp then narrows it, with a warning:
    # the message says both, so the fix is not a value that is only clamped again.
    clamp = (f" (this budget then clamps it to {spec.min:,} to {spec.max:,}, with a warning)"
             if spec.max < maximum else "")
    try:
        return validate_budget_value(knob, value, maximum=maximum, minimum=min(spec.min, 1),
                                     note=clamp)
    except InvalidBudgetValue as exc:
        if not spec.unlimited:
            raise
        raise InvalidBudgetValue(f'{exc} Use "{UNLIMITED}" for no limit.') from None


def _setting_ceiling(spec: BudgetSpec, key: str, value: object) -> int | None:
    """A budget setting's stored value as a ceiling in the budget's unit (None: unlimited)."""
    return budget_value(spec, f"setting {key!r}", value, dollars=key.endswith("_usd"))


class BudgetSpec(BaseModel):
    """A named budget's registration: default ceiling, clamp ``[min, max]``, setting key,
    ``unit`` (``count``, ``tokens``, ``microdollars`` or ``seconds``) and ``scope`` (what one
    count spans: ``run``, ``request``, ``job``, ``session`` or ``chain``).

    ``default=None`` is an *unset* budget: it counts only where a ceiling is given (a token,
    cost or wall-clock budget). ``min=0`` is for a budget that counts repeats (retries,
    nudges): a ceiling of 0 allows none. ``unlimited=True`` lets its setting and overrides
    say ``"unlimited"`` (a chat session's turns).

    Validated on construction: ``0 <= min <= default <= max``, ``1 <= max <= 10_000`` for a
    count (10^7 seconds, 10^12 tokens or microdollars); a violation raises
    :class:`InvalidBudgetSpec` naming the field.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", strict=True)

    name: str
    default: int | None = 10
    min: int = 1
    max: int = 100
    setting: str | None = None
    description: str = ""
    unit: BudgetUnit = "count"
    scope: BudgetScope = "run"
    unlimited: bool = False

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            field, reason, _ = first_field_error(exc)
            label = data.get("name", "?")
            where = f"invalid {field}: " if field else ""
            raise InvalidBudgetSpec(f"Budget {label!r}: {where}{reason}.") from None

    @model_validator(mode="after")
    def _check_bounds(self) -> BudgetSpec:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(
                f"name {self.name!r} must be lowercase letters, digits and underscores, "
                "starting with a letter"
            )
        maximum = unit_maximum(self.unit)
        for field, lowest in (("default", 0), ("min", 0), ("max", 1)):
            value = getattr(self, field)
            if value is not None and not lowest <= value <= maximum:
                raise ValueError(f"{field}={value} must be between {lowest} and {maximum:,} "
                                 f"(unit {self.unit!r})")
        if self.min > self.max:
            raise ValueError(f"min={self.min} must not be above max={self.max}")
        if self.default is not None and self.min > self.default:
            raise ValueError(f"min={self.min} must not be above default={self.default}")
        if self.default is not None and self.default > self.max:
            raise ValueError(f"default={self.default} must not be above max={self.max}")
        if self.setting is not None and not _NAME_RE.fullmatch(self.setting):
            raise ValueError(f"setting {self.setting!r} must be a lowercase identifier")
        return self

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> BudgetSpec:
        """Build a spec from the source's ``(name, {"default", "min", "max", "setting"})`` form."""
        if not isinstance(config, Mapping):
            raise InvalidBudgetSpec(
                f"Budget {name!r}: config must be a dict with default/min/max/setting, "
                f"got {type(config).__name__}."
            )
        data = dict(config)
        if data.get("setting") == "":
            data["setting"] = None
        return cls(name=name, **data)


UNREGISTERED_SPEC = {"default": 10, "min": 1, "max": 100}


_UNREGISTERED: list[BudgetSpec] = []


def _unregistered() -> BudgetSpec:
    """The numbers of a budget nobody registered (a tool's own, ``tool_calls_<tool>``), made
    once."""
    if not _UNREGISTERED:
        _UNREGISTERED.append(BudgetSpec(name="unregistered", **UNREGISTERED_SPEC))
    return _UNREGISTERED[0]


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class ResolvedCeiling:
    """How a budget's ceiling was chosen: the value, where it came from and any clamp.

    ``limit`` is what a person reads: the ceiling, ``"unlimited"`` (asked for, where the
    budget allows it) or None (*unset*: nothing set for a budget without a default); the
    ``ceiling`` of those two is the budget's ``max``.
    """

    name: str
    ceiling: int
    requested: int
    source: Literal["override", "setting", "default"]
    clamped: bool
    registered: bool
    limit: int | str | None = 0
    low: int = 1
    high: int = MAX_BUDGET_VALUE

    def warning(self) -> str | None:
        """The notice a run reports when the request was clamped, else None."""
        if not self.clamped:
            return None
        return (
            f"Budget {self.name!r}: requested ceiling {brief_repr(self.requested)} (from "
            f"{self.source}) {CLAMPED} [{self.low}, {self.high}]; using "
            f"{self.ceiling}."
        )


SettingsLookup = Callable[[str], Any]


class BudgetSpecs:
    """The registered budgets of one host and who registered each: what settings declarations
    read (a budget's ``setting`` is declared by its budget) before any setting can be read."""

    def __init__(self) -> None:
        self._specs: dict[str, BudgetSpec] = {}
        self._owners: dict[str, str] = {}

    # -- registration ---------------------------------------------------------------------
    def register(
        self,
        name_or_spec: str | BudgetSpec,
        config: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
    ) -> BudgetSpec:
        """Register (or overwrite) a budget; ``register(spec)`` and ``register(name, config)``.

        Overwriting is allowed here on purpose (tests re-register); conflicting claims between
        plugins are caught at boot, where the owners are known.
        """
        if isinstance(name_or_spec, BudgetSpec):
            if config is not None:
                raise InvalidBudgetSpec("Pass either a BudgetSpec or (name, config), not both.")
            spec = name_or_spec
        elif isinstance(name_or_spec, str):
            spec = BudgetSpec.from_config(name_or_spec, config or {})
        else:
            raise InvalidBudgetSpec(
                "register() takes a BudgetSpec or a budget name, "
                f"got {type(name_or_spec).__name__}."
            )
        # One setting feeds one budget: a second claim would make the setting's value decide
        # two limits (at boot, DuplicateSettingError names the plugins of such a clash first;
        # this is the same rule for a budget registered later).
        other = self.reader_of(spec.setting, besides=spec.name)
        if other is not None:
            raise InvalidBudgetSpec(
                f"Budget {spec.name!r} cannot take setting {spec.setting!r}: budget {other!r} "
                f"reads it already. Give {spec.name!r} a setting of its own.")
        self._specs[spec.name] = spec
        if owner is not None:
            self._owners[spec.name] = owner
        return spec

    def is_registered(self, name: str) -> bool:
        """Whether ``name`` has a registration."""
        return name in self._specs

    def get_spec(self, name: str) -> BudgetSpec | None:
        """The registration of ``name``, or None."""
        return self._specs.get(name)

    def get_config(self, name: str) -> dict[str, Any] | None:
        """The source-shaped config dict of ``name`` (``default, min, max, setting``), or None."""
        spec = self._specs.get(name)
        if spec is None:
            return None
        return {"default": spec.default, "min": spec.min, "max": spec.max,
                "setting": spec.setting or "", "description": spec.description,
                "unit": spec.unit, "scope": spec.scope, "unlimited": spec.unlimited}

    def registered_names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self._specs)

    def reader_of(self, setting: str | None, *, besides: str = "") -> str | None:
        """The budget other than ``besides`` whose setting is ``setting`` (None: none)."""
        if setting is None:
            return None
        return next((spec.name for spec in self._specs.values()
                     if spec.setting == setting and spec.name != besides), None)

    def meant(self, name: str) -> str | None:
        """The registered budget an unregistered ``name`` was probably meant to be: the budget
        whose setting is ``name`` (``max_turns``), else the closest name (``context_token``),
        else None. A misspelt ceiling would otherwise limit nothing, without a word."""
        if name in self._specs or name.startswith("tool_calls_"):
            return None  # a per-tool budget (tool_calls_<tool>) joins the run unregistered
        by_setting = self.setting_keys().get(name)
        if by_setting is not None:
            return by_setting
        close = difflib.get_close_matches(name, list(self._specs), n=1, cutoff=0.8)
        return close[0] if close else None

    def owner(self, name: str) -> str | None:
        """The plugin (pluggy name) that registered ``name``; ``bootstrap`` for built-ins."""
        return self._owners.get(name)

    def setting_keys(self) -> dict[str, str]:
        """Map of setting key to the budget it feeds."""
        return {s.setting: s.name for s in self._specs.values() if s.setting}

    def validate_setting(self, key: str, value: object) -> None:
        """Refuse a value for a budget's setting that is not a positive integer within its
        unit's limit (10,000 for a count, 10^12 for tokens and microdollars), or for a
        microdollar budget's ``*_usd`` setting, a positive number of dollars."""
        name = self.setting_keys().get(key)
        if name is not None:
            _setting_ceiling(self._specs[name], key, value)

    def check_ceiling(self, name: str, knob: str, value: object) -> int | None:
        """``value`` as a ceiling of budget ``name`` (see :func:`budget_value`: an integer in
        its unit's range, 0 where it counts repeats, ``"unlimited"`` where allowed: None),
        else :class:`InvalidBudgetValue` naming ``knob``."""
        return budget_value(self._specs.get(name) or _unregistered(), knob, value)

    def unit(self, name: str) -> BudgetUnit:
        """The unit of ``name`` (``count`` for an unregistered budget)."""
        spec = self._specs.get(name)
        return spec.unit if spec is not None else "count"


class IterationBudgetRegistry(BudgetSpecs):
    """Registered budgets, resolved into :class:`agents_api.IterationBudget` objects per run.

    ``settings_lookup``: where a budget's setting is read (a host's ``settings.get``) when the
    caller gives none; a run gives its settings snapshot (``settings=``) instead. ``specs``: the
    registrations to resolve (a host's, which its settings declarations read too); a new,
    empty table by default.
    """

    def __init__(self, settings_lookup: SettingsLookup | None = None, *,
                 specs: BudgetSpecs | None = None) -> None:
        super().__init__()
        if specs is not None:  # one table: registering here is registering there
            self._specs, self._owners = specs._specs, specs._owners
        self.settings_lookup = settings_lookup

    # -- resolution -----------------------------------------------------------------------
    def resolve(self, name: str, ceiling_override: int | str | None = None, *,
                settings: SettingsLookup | None = None) -> ResolvedCeiling:
        """Choose the ceiling for ``name``: override, else setting, else default; then clamp
        to ``[min, max]``. The one place a bounded loop's limit is decided. ``settings``:
        where the setting is read (default: the registry's lookup). An override is checked
        like a setting (an integer in the budget's unit, or ``"unlimited"`` where allowed)."""
        spec = self._specs.get(name)
        if spec is None:
            spec, registered = _unregistered(), False
        else:
            registered = True
        source: Literal["override", "setting", "default"] = "default"
        requested: int | None = spec.default
        unlimited = False
        if ceiling_override is not None:
            if ceiling_override == UNLIMITED and spec.unlimited:
                requested, unlimited = None, True
            elif isinstance(ceiling_override, bool) or not isinstance(ceiling_override, int):
                extra = ' or "unlimited"' if spec.unlimited else ""
                raise InvalidBudgetValue(
                    f"ceiling_override for budget {name!r} must be an integer{extra}, "
                    f"got {brief_repr(ceiling_override)}."
                )
            else:
                requested = ceiling_override  # any integer: the clamp below says what holds
            source = "override"
        elif spec.setting and (lookup := settings or self.settings_lookup):
            stored = lookup(spec.setting)
            if stored is not None:
                requested = _setting_ceiling(spec, spec.setting, stored)
                source, unlimited = "setting", requested is None
        if requested is None:  # unlimited, or unset: nothing holds it below its max
            limit: int | str | None = UNLIMITED if unlimited else None
            return ResolvedCeiling(name=name, ceiling=spec.max, requested=spec.max,
                                   source=source, clamped=False, registered=registered,
                                   limit=limit, low=spec.min, high=spec.max)
        ceiling = max(spec.min, min(spec.max, requested))
        return ResolvedCeiling(name=name, ceiling=ceiling, requested=requested, source=source,
                               clamped=ceiling != requested, registered=registered,
                               limit=ceiling, low=spec.min, high=spec.max)

    def create(
        self,
        name: str,
        current: int = 0,
        ceiling_override: int | str | None = None,
        *,
        warnings: list[str] | None = None,
        max_seconds: float | None = None,
        settings: SettingsLookup | None = None,
    ) -> IterationBudget:
        """A fresh per-run budget; its ``hard_ceiling`` is the spec's ``max``.

        A clamped ceiling is appended to ``warnings`` when a list is given. ``current`` (what
        is used already) is a whole number, 0 or more: a negative one is refused, never
        quietly made 0. ``settings``: where its setting is read (a run's snapshot; default:
        the registry's lookup). A budget whose ``min`` is 0 (it counts repeats) may have a
        ceiling of 0: no repeat at all.
        """
        if isinstance(current, bool) or not isinstance(current, int) or current < 0:
            raise UsageError(f"current must be what the budget has used so far, a whole number "
                             f"0 or more (a new budget starts at 0), got {brief_repr(current)}.")
        if warnings is not None and not isinstance(warnings, list):
            raise UsageError(f"warnings must be a list the clamp notice is appended to, or None, "
                             f"got {brief_repr(warnings)}.")
        resolved = self.resolve(name, ceiling_override, settings=settings)
        if resolved.clamped and warnings is not None:
            warnings.append(str(resolved.warning()))
        return IterationBudget(name, resolved.ceiling, current, hard_ceiling=resolved.high,
                               max_seconds=max_seconds, min_ceiling=min(resolved.low, 1))

    def raw_setting(self, name: str, settings: SettingsLookup | None = None) -> object:
        """What the setting of budget ``name`` holds as stored (None: not set, or no
        setting); for a seconds budget whose time rail keeps fractions."""
        spec = self._specs.get(name)
        lookup = settings or self.settings_lookup
        if spec is None or not spec.setting or lookup is None:
            return None
        return lookup(spec.setting)

    def setting_ceiling(self, name: str, *, settings: SettingsLookup | None = None
                        ) -> int | None:
        """The ceiling the setting of budget ``name`` asks for, in its unit (None when the
        budget has no setting or it is not set). ``settings``: as in :meth:`create`."""
        spec = self._specs.get(name)
        lookup = settings or self.settings_lookup
        if spec is None or not spec.setting or lookup is None:
            return None
        stored = lookup(spec.setting)
        if stored is None:
            return None
        found = _setting_ceiling(spec, spec.setting, stored)
        return spec.max if found is None else found

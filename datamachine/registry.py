"""Named iteration budgets, resolved per run: :class:`IterationBudgetRegistry`.

Budgets are registered once at boot (by ``bootstrap.py`` and by plugins) and instantiated per
run. Resolution is always the same: caller override, else the setting, else the default, then
the clamp, which is non-negotiable. Anything clamped is reported, never silently applied.
"""

from __future__ import annotations

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
    "MAX_BUDGET_VALUE",
    "MAX_METERED_VALUE",
    "MICRODOLLARS_PER_USD",
    "UNITS",
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
BudgetUnit = Literal["count", "tokens", "microdollars"]
UNITS: tuple[BudgetUnit, ...] = ("count", "tokens", "microdollars")
MICRODOLLARS_PER_USD = 1_000_000
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def unit_maximum(unit: str) -> int:
    """The largest ceiling a budget of ``unit`` may have: 10,000 counts, 10^12 otherwise."""
    return MAX_BUDGET_VALUE if unit == "count" else MAX_METERED_VALUE


def validate_budget_value(knob: str, value: object, *, maximum: int = MAX_BUDGET_VALUE) -> int:
    """Return ``value`` if it is a positive integer no larger than ``maximum`` (10,000, the
    limit of every count; 10^12 for a token or microdollar budget).

    Used for every user-supplied ceiling (``max_turns``, ``--max-turns``, a budget setting);
    anything else raises :class:`InvalidBudgetValue` naming ``knob``. Nothing is coerced:
    ``"10"``, ``10.0`` and ``True`` are refused.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidBudgetValue(
            f"{knob} must be a positive integer between 1 and {maximum:,}, "
            f"got {brief_repr(value)} ({type(value).__name__})."
        )
    if not 1 <= value <= maximum:
        raise InvalidBudgetValue(
            f"{knob} must be a positive integer between 1 and {maximum:,}, got "
            f"{brief_repr(value)}."
        )
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


def _setting_ceiling(spec: BudgetSpec, key: str, value: object) -> int:
    """A budget setting's stored value as a ceiling in the budget's unit: a microdollar
    budget's setting named ``*_usd`` holds dollars (``max_cost_usd: 0.5``)."""
    if spec.unit == "microdollars" and key.endswith("_usd"):
        return usd_to_microdollars(f"setting {key!r}", value)
    return validate_budget_value(f"setting {key!r}", value, maximum=unit_maximum(spec.unit))


class BudgetSpec(BaseModel):
    """A named budget's registration: default ceiling, clamp ``[min, max]``, setting key and
    ``unit`` (``count``, ``tokens`` or ``microdollars``).

    Validated on construction: ``1 <= min <= default <= max <= 10_000`` for a count, up to
    10^12 for tokens and microdollars; a violation raises :class:`InvalidBudgetSpec` naming the
    field.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid", strict=True)

    name: str
    default: int = 10
    min: int = 1
    max: int = 100
    setting: str | None = None
    description: str = ""
    unit: BudgetUnit = "count"

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
        for field in ("default", "min", "max"):
            value = getattr(self, field)
            if not 1 <= value <= maximum:
                raise ValueError(f"{field}={value} must be between 1 and {maximum:,} "
                                 f"(unit {self.unit!r})")
        if self.min > self.default:
            raise ValueError(f"min={self.min} must not be above default={self.default}")
        if self.default > self.max:
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


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class ResolvedCeiling:
    """How a budget's ceiling was chosen: the value, where it came from and any clamp."""

    name: str
    ceiling: int
    requested: int
    source: Literal["override", "setting", "default"]
    clamped: bool
    registered: bool

    def warning(self) -> str | None:
        """The notice a run reports when the request was clamped, else None."""
        if not self.clamped:
            return None
        return (
            f"Budget {self.name!r}: requested ceiling {brief_repr(self.requested)} (from "
            f"{self.source}) is outside the allowed range; using {self.ceiling}."
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
                "unit": spec.unit}

    def registered_names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self._specs)

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
    def resolve(self, name: str, ceiling_override: int | None = None, *,
                settings: SettingsLookup | None = None) -> ResolvedCeiling:
        """Choose the ceiling for ``name``: override, else setting, else default; then clamp.
        ``settings``: where the setting is read (default: the registry's lookup)."""
        spec = self._specs.get(name)
        default, low, high = (
            (spec.default, spec.min, spec.max) if spec is not None
            else (UNREGISTERED_SPEC["default"], UNREGISTERED_SPEC["min"], UNREGISTERED_SPEC["max"])
        )
        source: Literal["override", "setting", "default"] = "default"
        requested = default
        if ceiling_override is not None:
            if isinstance(ceiling_override, bool) or not isinstance(ceiling_override, int):
                raise InvalidBudgetValue(
                    f"ceiling_override for budget {name!r} must be an integer, "
                    f"got {brief_repr(ceiling_override)}."
                )
            requested, source = ceiling_override, "override"
        elif spec is not None and spec.setting and (lookup := settings or self.settings_lookup):
            stored = lookup(spec.setting)
            if stored is not None:
                requested = _setting_ceiling(spec, spec.setting, stored)
                source = "setting"
        ceiling = max(low, min(high, requested))
        return ResolvedCeiling(name=name, ceiling=ceiling, requested=requested, source=source,
                               clamped=ceiling != requested, registered=spec is not None)

    def create(
        self,
        name: str,
        current: int = 0,
        ceiling_override: int | None = None,
        *,
        warnings: list[str] | None = None,
        max_seconds: float | None = None,
        settings: SettingsLookup | None = None,
    ) -> IterationBudget:
        """A fresh per-run budget; its ``hard_ceiling`` is the spec's ``max``.

        A clamped ceiling is appended to ``warnings`` when a list is given. ``current`` (what
        is used already) is a whole number, 0 or more: a negative one is refused, never
        quietly made 0. ``settings``: where its setting is read (a run's snapshot; default:
        the registry's lookup).
        """
        if isinstance(current, bool) or not isinstance(current, int) or current < 0:
            raise UsageError(f"current must be what the budget has used so far, a whole number "
                             f"0 or more (a new budget starts at 0), got {brief_repr(current)}.")
        resolved = self.resolve(name, ceiling_override, settings=settings)
        if resolved.clamped and warnings is not None:
            warnings.append(str(resolved.warning()))
        spec = self._specs.get(name)
        hard = spec.max if spec is not None else UNREGISTERED_SPEC["max"]
        return IterationBudget(name, resolved.ceiling, current, hard_ceiling=hard,
                               max_seconds=max_seconds)

    def setting_ceiling(self, name: str, *, settings: SettingsLookup | None = None
                        ) -> int | None:
        """The ceiling the setting of budget ``name`` asks for, in its unit (None when the
        budget has no setting or it is not set). ``settings``: as in :meth:`create`."""
        spec = self._specs.get(name)
        lookup = settings or self.settings_lookup
        if spec is None or not spec.setting or lookup is None:
            return None
        stored = lookup(spec.setting)
        return None if stored is None else _setting_ceiling(spec, spec.setting, stored)

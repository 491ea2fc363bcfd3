"""Declared settings: what a setting is (:class:`SettingSpec`) and who declared it
(:class:`SettingDeclarations`).

The core declares its settings (``datamachine.setting_rules``), plugins declare theirs through the
``register_settings()`` hook, and every budget's setting is declared by its budget registration.
``host.settings.set`` refuses a key nobody declared (naming the closest declared key) and a value
that does not fit the declaration; ``datamachine settings list`` shows every declared setting
with its default, value and source, secrets masked.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from agents_api.errors import brief_repr
from datamachine.errors import (
    InvalidBudgetValue,
    InvalidSetting,
    InvalidSettingSpec,
    UsageError,
    first_field_error,
)

if TYPE_CHECKING:
    from datamachine.registry import BudgetSpec, BudgetSpecs

__all__ = [
    "CORE_OWNER",
    "FREE_FORM_PREFIX",
    "MASK",
    "MAX_DEPTH",
    "SettingDeclarations",
    "SettingSpec",
    "SettingType",
    "default_copy",
    "nests_too_deep",
    "read_json",
    "unknown_setting",
]

SettingType = Literal["string", "integer", "number", "boolean", "array", "object", "null", "any"]
# Keys starting with this are the host application's own, free-form JSON: never declared,
# never refused as unknown (``x_theme``, ``x_myapp_last_run``).
FREE_FORM_PREFIX = "x_"
CORE_OWNER = "core"
MASK = "****"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# Shown after the mask, so two tokens can be told apart; only of secrets long enough that four
# characters give little away.
_SHOWN_TAIL, _TAIL_FROM_LENGTH = 4, 16
_ARTICLE = {"integer": "an", "array": "an", "object": "an"}
# The deepest a setting's value (or a `-o` model option's) may nest lists and objects. Real
# values nest a few levels; past about 1,000, json.loads raises RecursionError, and past 255
# pydantic-core cannot write a value back, so a deeper one could be read but not shown.
MAX_DEPTH = 100


def nests_too_deep(value: Any) -> bool:
    """Whether the lists and objects of ``value`` nest more than :data:`MAX_DEPTH` levels (a
    value that contains itself does). Level by level, without recursion: the value may be
    nested past Python's recursion limit."""
    level = [value] if isinstance(value, dict | list | tuple) else []
    for _ in range(MAX_DEPTH):
        level = [child for item in level
                 for child in (item.values() if isinstance(item, dict) else item)
                 if isinstance(child, dict | list | tuple)]
        if not level:
            return False
    return True


def _too_deep(what: str) -> UsageError:
    return UsageError(f"{what} is JSON nested more than {MAX_DEPTH} levels deep, which no "
                      "setting or option takes.")


def read_json(text: str, what: str) -> Any:
    """``text`` as JSON, for text typed by a person, from the environment or stored. Text that
    is not JSON raises json's ``ValueError`` (its message names a position, never the text);
    JSON nested more than :data:`MAX_DEPTH` levels raises :class:`UsageError` saying ``what``
    nests too deep (a ``ValueError`` too: catch it first)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(what) from None
    if nests_too_deep(value):
        raise _too_deep(what)
    return value


def _json_type(value: object) -> str:
    """The JSON type name of ``value`` (``"other"`` for what JSON has no type for)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "other"


class SettingSpec(BaseModel):
    """One setting's declaration: its ``name``, JSON ``type`` (one name or a tuple of them),
    ``default`` (what the code uses when it is unset; None when the code computes it, as the
    description then says), a ``description``, an optional ``validator(key, value)`` that raises
    :class:`InvalidSetting` (or ``ValueError``) for a bad value, and whether it holds secrets:
    ``secret=True`` masks the whole value in listings, ``secret_fields`` masks only the entries
    of those names, at any depth (``("token",)`` in ``remote_sites``).

    Validated on construction (a lowercase name that does not start with ``x_``, known type
    names), else :class:`InvalidSettingSpec` naming the field.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid",
                              arbitrary_types_allowed=True)

    name: StrictStr
    type: SettingType | tuple[SettingType, ...] = "any"
    default: Any = None
    description: StrictStr = ""
    validator: Callable[[str, Any], None] | None = None
    secret: StrictBool = False
    secret_fields: tuple[StrictStr, ...] = Field(default=())

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            field, reason, _ = first_field_error(exc)
            where = f"invalid {field}: " if field else ""
            raise InvalidSettingSpec(
                f"Setting declaration {data.get('name', '?')!r}: {where}{reason}.") from None

    @model_validator(mode="after")
    def _check(self) -> SettingSpec:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must be lowercase letters, digits and "
                             "underscores, starting with a letter")
        if self.name.startswith(FREE_FORM_PREFIX):
            raise ValueError(f"names starting with {FREE_FORM_PREFIX!r} are free-form keys of "
                             "the host application and cannot be declared")
        if isinstance(self.type, tuple) and not self.type:
            raise ValueError("type needs at least one type name")
        return self

    # -- reading the declaration ---------------------------------------------------------
    @property
    def types(self) -> tuple[SettingType, ...]:
        """The accepted JSON types, as a tuple."""
        return self.type if isinstance(self.type, tuple) else (self.type,)

    @property
    def is_secret(self) -> bool:
        """Whether listings mask some or all of the value."""
        return self.secret or bool(self.secret_fields)

    def type_text(self) -> str:
        """The type for people: ``"integer"``, ``"integer or string"``, ``"any JSON"``."""
        if "any" in self.types:
            return "any JSON"
        return " or ".join(self.types)

    # -- checking values -----------------------------------------------------------------
    def check(self, value: Any) -> None:
        """Raise :class:`InvalidSetting` (``InvalidBudgetValue`` for a budget's setting) when
        ``value`` cannot serve this setting: the wrong JSON type, a secret that is a mask as
        listings show it (``"****3456"``), or the validator refuses."""
        problem = self._type_problem(value)
        if problem is not None:
            # The validator's message is the richer one ("'ask' or 'pause'"); a validator that
            # only expected the right type may fail otherwise, and the type error stands.
            if self.validator is not None:
                try:
                    self._validate(value, wrong_type=True)
                except UsageError:
                    raise
                except Exception:  # a validator surprised by the type: the type error stands
                    pass
            raise InvalidSetting(problem)
        mask = next((text for text in self.secrets_in(value) if _is_mask(text)), None)
        if mask is not None:
            # `settings get` (masked) piped into `settings set` would replace every real
            # secret with its mask.
            raise InvalidSetting(
                f"Setting {self.name!r} holds {mask!r}, a secret as listings mask it, not the "
                f"secret itself; `datamachine settings get {self.name} --reveal` prints the "
                "value with its secrets to edit.")
        if self.validator is not None:
            self._validate(value)

    def _validate(self, value: Any, *, wrong_type: bool = False) -> None:
        assert self.validator is not None
        try:
            self.validator(self.name, value)
        except (InvalidSetting, InvalidBudgetValue):
            raise
        except ValueError as exc:  # UsageError included: a setting's error is InvalidSetting
            text = str(exc)
            raise InvalidSetting(text if self.name in text
                                 else f"Setting {self.name!r}: {text}") from None
        except (ArithmeticError, TypeError, RecursionError) as exc:
            # A check surprised by the value (a 400-digit integer where a float is meant, a
            # value nested past Python's recursion limit) refuses it: one line, not a traceback.
            # Of a value of the wrong type, the type error says more.
            if wrong_type:
                return
            why = type(exc).__name__ if self.is_secret else f"{type(exc).__name__}: {exc}"
            raise InvalidSetting(
                f"Setting {self.name!r} cannot take this value: its check failed ({why}). "
                f"`datamachine settings show {self.name}` describes what fits.") from None

    def _type_problem(self, value: Any) -> str | None:
        types = self.types
        if "any" in types:
            return None
        kind = _json_type(value)
        if kind == "integer" and "number" in types:
            kind = "number"
        if kind in types:
            # Only a float can be NaN or infinite (math.isfinite(10**400) raises OverflowError).
            if isinstance(value, float) and not math.isfinite(value):
                return (f"Setting {self.name!r} must be a finite number, got "
                        f"{brief_repr(value)}.")
            return None
        wanted = " or ".join(t if t == "null" else f"{_ARTICLE.get(t, 'a')} {t}" for t in types)
        named = kind if kind != "other" else type(value).__name__
        # The value of a secret setting is never repeated: it may be the secret.
        got = (f"{_ARTICLE.get(named, 'a')} {named} (not shown: it may hold a secret)"
               if self.is_secret else f"{brief_repr(value)} ({named})")
        return (f"Setting {self.name!r} must be {wanted}, got {got}. "
                f"`datamachine settings show {self.name}` describes it.")

    def parse_text(self, raw: str) -> Any:
        """A value from text typed by a person (``datamachine settings set``) or an environment
        variable, read as this setting's type: JSON when it parses to an accepted type, else the
        text itself for a string setting (``site_id 1234`` is the string ``"1234"``), ``true``
        and ``false`` in any case for a boolean, else the JSON or the text (which :meth:`check`
        then refuses with the reason). JSON nested more than :data:`MAX_DEPTH` levels is
        refused (:class:`InvalidSetting`)."""
        types = self.types
        try:
            value: Any = read_json(raw, f"Setting {self.name!r}")
        except UsageError as exc:  # nested too deep
            raise InvalidSetting(str(exc)) from None
        except ValueError:
            value, parsed = raw, False
        else:
            parsed = True
        if parsed:
            kind = _json_type(value)
            if "any" in types or kind in types or (kind == "integer" and "number" in types):
                return value
        if "string" in types:
            return raw
        if "boolean" in types and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        return value

    # -- showing values ------------------------------------------------------------------
    def masked(self, value: Any, *, whole: bool = False) -> Any:
        """``value`` as listings show it: secrets replaced by ``****`` (with the last four
        characters of a long secret string, so two can be told apart).

        A value that is not of the declared type (text where an object belongs: the fields
        cannot be found in it, and a secret may end it) is masked whole, without the last four
        characters, and so is any value when ``whole`` (a value with a problem: a misspelt
        field may hold the secret)."""
        if not self.is_secret:
            return value
        if whole or self._type_problem(value) is not None:
            return _mask_whole(value)
        if self.secret:
            return _mask_all(value)
        return _mask_fields(value, frozenset(self.secret_fields))

    def secrets_in(self, value: Any) -> list[str]:
        """The secret strings inside ``value`` (to scrub from an error message about it): every
        string of a secret setting, or of a value not of the declared type."""
        if self.secret or (self.secret_fields and self._type_problem(value) is not None):
            return _leaves(value)
        found: list[str] = []
        if self.secret_fields:
            _collect_fields(value, frozenset(self.secret_fields), found)
        return found


def hide_url_password(text: str) -> str:
    """``text`` with the password of a URL in it replaced by the mask
    (``http://user:****@host/v1``): a base URL may carry credentials, and a listing must not
    show them."""
    if "@" not in text or "://" not in text:
        return text
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.password:
        return text
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{user}:{MASK}@{host}").geturl()


def hide_url_passwords(value: Any) -> Any:
    """Every string inside ``value`` through :func:`hide_url_password`."""
    if isinstance(value, str):
        return hide_url_password(value)
    if isinstance(value, dict):
        return {key: hide_url_passwords(item) for key, item in value.items()}
    if isinstance(value, list):
        return [hide_url_passwords(item) for item in value]
    return value


def _mask_text(text: str) -> str:
    return MASK + text[-_SHOWN_TAIL:] if len(text) >= _TAIL_FROM_LENGTH else MASK


def _is_mask(text: str) -> bool:
    """Whether ``text`` is what :func:`_mask_text` makes of a secret."""
    return text == MASK or (len(text) == len(MASK) + _SHOWN_TAIL and text.startswith(MASK))


def _mask_all(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _mask_all(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_all(item) for item in value]
    if value is None:
        return None
    return _mask_text(value) if isinstance(value, str) else MASK


def _mask_whole(value: Any) -> Any:
    # A value whose secrets cannot be told from the rest: every string, number and boolean in
    # it masked, and text no tail of (it may end in a secret).
    if isinstance(value, dict | list | tuple):
        return _mask_all(value)
    return None if value is None else MASK


def _mask_fields(value: Any, fields: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {key: _mask_all(item) if key in fields else _mask_fields(item, fields)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_mask_fields(item, fields) for item in value]
    return value


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in _leaves(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _leaves(item)]
    return [value] if isinstance(value, str) and value else []


def _collect_fields(value: Any, fields: frozenset[str], found: list[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in fields:
                found.extend(_leaves(item))
            else:
                _collect_fields(item, fields, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect_fields(item, fields, found)


def unknown_setting(key: str, known: list[str]) -> InvalidSetting:
    """The refusal of a key nobody declared, naming the closest declared key."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    return InvalidSetting(
        f"Unknown setting {key!r}{hint} `datamachine settings list` shows every setting. A "
        "plugin declares its own with the register_settings() hook; keys starting with "
        f"{FREE_FORM_PREFIX!r} are free-form (for your application's own values).")


class SettingDeclarations:
    """Every declared setting of one host, with the plugin that declared it.

    Budget settings are declared by their budgets: a budget registered with ``setting=KEY``
    (at boot or later, in ``budgets``) declares ``KEY`` as a positive integer whose default is
    the budget's default (none for token and cost budgets, which count only when set).
    """

    def __init__(self, budgets: BudgetSpecs | None = None) -> None:
        self._specs: dict[str, SettingSpec] = {}
        self._owners: dict[str, str] = {}
        self._budgets = budgets
        self._derived: dict[str, tuple[BudgetSpec, SettingSpec]] = {}

    def declare(self, spec: SettingSpec, *, owner: str) -> SettingSpec:
        """Declare (or redeclare) ``spec``; its default must pass its own check. Conflicting
        declarations of two plugins are caught at boot, where both owners are known."""
        if not isinstance(spec, SettingSpec):
            raise InvalidSettingSpec(f"Declare a SettingSpec, got {brief_repr(spec)}.")
        if spec.default is not None:
            try:
                spec.check(spec.default)
            except UsageError as exc:
                raise InvalidSettingSpec(
                    f"Setting declaration {spec.name!r} (by {owner!r}): its default "
                    f"{brief_repr(spec.default)} fails its own check: {exc}") from None
        self._specs[spec.name] = spec
        self._owners[spec.name] = owner
        return spec

    def get(self, key: str) -> SettingSpec | None:
        """The declaration of ``key`` (a budget's setting included), or None."""
        spec = self._specs.get(key)
        if spec is not None or self._budgets is None:
            return spec
        budget = self._budget_of(key)
        return None if budget is None else self._budget_setting(key, budget)

    def owner(self, key: str) -> str | None:
        """Who declared ``key``: ``core``, a plugin's pluggy name, or the owner given to
        :meth:`declare`; None when it is not declared."""
        if key in self._owners:
            return self._owners[key]
        budget = self._budget_of(key)
        if budget is None or self._budgets is None:
            return None
        from datamachine.budgets_builtin import BUILTIN_OWNER

        owner = self._budgets.owner(budget.name)
        return CORE_OWNER if owner in (None, BUILTIN_OWNER) else owner

    def specs(self) -> list[SettingSpec]:
        """Every declaration, sorted by name."""
        found = dict(self._specs)
        for key in self._budget_keys():
            if key not in found:
                spec = self.get(key)
                if spec is not None:
                    found[key] = spec
        return [found[key] for key in sorted(found)]

    def names(self) -> list[str]:
        """Every declared key, sorted."""
        return sorted(set(self._specs) | set(self._budget_keys()))

    def budget_conflicts(self) -> list[tuple[str, str, str, str | None]]:
        """``(key, declared by, budget, budget registered by)`` for each budget setting that a
        declaration also claims (a boot error)."""
        budgets = self._budgets
        if budgets is None:
            return []
        return [(key, self._owners[key], budget, budgets.owner(budget))
                for key, budget in budgets.setting_keys().items() if key in self._specs]

    def _budget_keys(self) -> list[str]:
        return [] if self._budgets is None else list(self._budgets.setting_keys())

    def _budget_of(self, key: str) -> BudgetSpec | None:
        if self._budgets is None:
            return None
        name = self._budgets.setting_keys().get(key)
        return None if name is None else self._budgets.get_spec(name)

    def _budget_setting(self, key: str, budget: BudgetSpec) -> SettingSpec:
        made = self._derived.get(key)
        if made is not None and made[0] is budget:
            return made[1]
        registry = self._budgets
        assert registry is not None
        dollars = budget.unit == "microdollars" and key.endswith("_usd")
        described = f"{budget.description} " if budget.description else ""
        default: int | None = budget.default
        if default is None:
            unit = "US dollars" if dollars else budget.unit
            meaning = described + (f"Ceiling of the budget {budget.name!r} in {unit}, "
                                   f"clamped to [{budget.min:,}, {budget.max:,}]; unset, the "
                                   "budget does not count.")
        else:
            unlimited = ' or "unlimited"' if budget.unlimited else ""
            meaning = described + (f"Ceiling of the budget {budget.name!r}, clamped to "
                                   f"[{budget.min:,}, {budget.max:,}]{unlimited}.")
        kind: Any = "number" if dollars or budget.unit == "seconds" else "integer"
        if budget.unlimited:
            kind = (kind, "string")

        def validator(name: str, value: Any) -> None:
            registry.validate_setting(name, value)

        spec = SettingSpec(name=key, type=kind, default=default, description=meaning,
                           validator=validator)
        self._derived[key] = (budget, spec)
        return spec


def default_copy(spec: SettingSpec | None) -> Any:
    """A declaration's default, copied when it is a list or dict (callers may change it)."""
    if spec is None:
        return None
    default = spec.default
    return copy.deepcopy(default) if isinstance(default, dict | list) else default

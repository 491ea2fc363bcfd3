"""What a value must look like for the settings the product itself reads.

Checked when a setting is written (``host.settings.set``, ``datamachine settings set``), so a
typo fails at once with the key named, instead of being ignored at the next run. Budget settings
are checked by the budget registry; keys nobody owns are free-form JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.errors import InvalidSetting, UsageError
from datamachine.registry import validate_budget_value

__all__ = ["validate_known_setting"]


def _number(key: str, value: Any, *, positive: bool = False) -> None:
    if clock.duration(value, allow_zero=not positive) is None:
        kind = "a finite positive" if positive else "a finite non-negative"
        raise InvalidSetting(f"Setting {key!r} must be {kind} number of seconds, "
                             f"got {brief_repr(value)}.")


def _flag(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidSetting(f"Setting {key!r} must be true or false, got {brief_repr(value)}.")


def _text(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidSetting(f"Setting {key!r} must be a string, got {brief_repr(value)}.")


def _chat_turns(key: str, value: Any) -> None:
    if value != "unlimited":
        validate_budget_value(f"setting {key!r}", value)


def _confirmation(key: str, value: Any) -> None:
    if value not in ("ask", "pause"):
        raise InvalidSetting(f"Setting {key!r} must be 'ask' (confirm_continuation answers "
                             f"inside the run) or 'pause' (the run stops "
                             f"awaiting_confirmation), got {brief_repr(value)}.")


def _bytes(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(f"Setting {key!r} must be a positive number of bytes, got "
                             f"{brief_repr(value)}.")


def _model_options(key: str, value: Any) -> None:
    from datamachine.providers.options import validate_model_options

    try:
        validate_model_options(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


def _endpoints(key: str, value: Any) -> None:
    from datamachine.providers.endpoints import parse_endpoints

    try:
        parse_endpoints(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


def _max_retries(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise InvalidSetting(f"Setting {key!r} must be an integer from 0 to 10 (retries after "
                             f"the first request), got {brief_repr(value)}.")


def _prices(key: str, value: Any) -> None:
    from datamachine.conversation.metering import check_prices

    check_prices(value, f"Setting {key!r}")


def _spend_limits(key: str, value: Any) -> None:
    from datamachine.conversation.spending import parse_spend_limits

    parse_spend_limits(value, f"Setting {key!r}")


_RULES: dict[str, Callable[[str, Any], None]] = {
    "request_timeout": _number,
    "connect_timeout": _number,
    "max_run_seconds": lambda key, value: _number(key, value, positive=True),
    "budget_pressure": _flag,
    "default_provider": _text,
    "default_model": _text,
    "openai_base_url": _text,
    "chat_max_turns": _chat_turns,
    "confirmation": _confirmation,
    "max_request_bytes": _bytes,
    "model_options": _model_options,
    "provider_max_retries": _max_retries,
    "providers": _endpoints,
    "prices": _prices,
    "spend_limits": _spend_limits,
}


def validate_known_setting(key: str, value: Any) -> None:
    """Raise InvalidSetting (or InvalidBudgetValue) when ``value`` cannot serve ``key``."""
    rule = _RULES.get(key)
    if rule is not None:
        rule(key, value)

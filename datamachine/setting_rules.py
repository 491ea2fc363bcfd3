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

__all__ = ["check_provider_setting", "check_tools_setting", "validate_known_setting"]


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
    ceiling = 1 << 30  # more would let one request hold a gigabyte in memory
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= ceiling:
        raise InvalidSetting(f"Setting {key!r} must be a whole number of bytes from 1 to "
                             f"{ceiling:,}, got {brief_repr(value)}.")


def _site_id(key: str, value: Any) -> None:
    from datamachine.server.site import check_site_id

    check_site_id(value, f"setting {key!r}")


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


def _whole(key: str, value: Any, meaning: str, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidSetting(f"Setting {key!r} must be a whole number from 0 (off) to "
                             f"{maximum:,} ({meaning}), got {value!r}.")


def _tool_names(key: str, value: Any) -> None:
    from datamachine.storage.tokens import check_tool_names

    if value is None:
        return
    try:
        check_tool_names(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


_RULES: dict[str, Callable[[str, Any], None]] = {
    "request_timeout": _number,
    "connect_timeout": _number,
    "max_run_seconds": lambda key, value: _number(key, value, positive=True),
    "budget_pressure": _flag,
    "allow_model_requests": _flag,
    "default_provider": _text,
    "default_model": _text,
    "openai_base_url": _text,
    "chat_max_turns": _chat_turns,
    "confirmation": _confirmation,
    "max_request_bytes": _bytes,
    "site_id": _site_id,
    "model_options": _model_options,
    "provider_max_retries": _max_retries,
    "providers": _endpoints,
    "prices": _prices,
    "spend_limits": _spend_limits,
    "chat_tools": _tool_names,
    "chat_rate_limit": lambda key, value: _whole(key, value, "requests per minute per token",
                                                 1_000_000),
    "chat_max_concurrent": lambda key, value: _whole(key, value, "runs at once per token",
                                                     10_000),
}


def validate_known_setting(key: str, value: Any) -> None:
    """Raise InvalidSetting (or InvalidBudgetValue) when ``value`` cannot serve ``key``."""
    rule = _RULES.get(key)
    if rule is not None:
        rule(key, value)


def check_tools_setting(key: str, value: Any, registered: Any) -> None:
    """For ``chat_tools``: every name must be a tool this host registers (``registered`` has
    ``tools()``), so a typo fails when it is set, and ``serve`` refuses a list that outlived a
    removed plugin."""
    if key != "chat_tools" or not isinstance(value, list):
        return
    known = registered.tools()
    unknown = [name for name in value if name not in known]
    if unknown:
        raise InvalidSetting(
            f"Setting {key!r} names tools no plugin registers here: {', '.join(map(str, unknown))}"
            f" (registered: {', '.join(sorted(known)) or 'none'}); install their plugins or "
            "remove them from the list.")


def check_provider_setting(key: str, value: Any, registered: Any) -> None:
    """For ``default_provider``: a provider this host registers (``registered`` supports
    ``in`` and ``names()``), so every run without a provider does not fail on it."""
    if key != "default_provider" or not isinstance(value, str) or value in registered:
        return
    raise InvalidSetting(
        f"Setting {key!r} names the provider {value!r}, which no plugin registers here "
        f"(registered: {', '.join(sorted(registered.names())) or 'none'}).")

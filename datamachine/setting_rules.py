"""The core's setting declarations: what a value must look like for every setting the product
itself reads (:data:`CORE_SETTINGS`).

Checked when a setting is written (``host.settings.set``, ``datamachine settings set``), so a
typo fails at once with the key named, instead of being ignored at the next run. Budget settings
are declared by their budgets, plugins' settings by the plugins (``register_settings``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.errors import InvalidSetting, UsageError
from datamachine.setting_spec import SettingSpec

__all__ = ["CORE_SETTINGS", "SITE_ID_PATTERN", "SITE_ID_SETTING", "check_provider_setting",
           "check_site_id", "check_tools_setting", "validate_known_setting"]

SITE_ID_SETTING = "site_id"
# Short and without commas: a chain of calls carries the site ids as one comma-separated
# header (datamachine.server.chain), and an API token's ``site`` claim names one.
SITE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def check_site_id(value: object, where: str = f"setting {SITE_ID_SETTING!r}") -> str:
    """Return ``value`` if it is a usable site id, else raise :class:`InvalidSetting`."""
    if not isinstance(value, str) or not SITE_ID_PATTERN.fullmatch(value):
        # The fix is the setting's only when the value came from it (a token's site is the
        # caller's argument).
        fix = (f" Fix it with `datamachine settings set {SITE_ID_SETTING} <id>` or unset it to "
               "have one generated." if where.startswith("setting ") else "")
        raise InvalidSetting(
            f"{where} must be 1-64 letters, digits, '.', '_', ':' or '-' (starting with a letter "
            f"or digit), got {value!r}.{fix}"
        )
    return value


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


def _http_url(key: str, value: Any) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(value.strip()) if isinstance(value, str) else None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or any(c.isspace() for c in value.strip()) or parts.query or parts.fragment):
        raise InvalidSetting(
            f"Setting {key!r} must be an http(s) base URL such as https://api.openai.com/v1 or "
            f"http://127.0.0.1:11434/v1 (no query or fragment), got {brief_repr(value)}.")


def _model_id(key: str, value: Any) -> None:
    if value == "":
        return  # no default model: the provider's own (checked at boot: nothing to load)
    from datamachine.conversation.inputs import MAX_MODEL_LENGTH
    # A model's name has a letter in it (gpt-4o-mini, llama3.2, Qwen/Qwen2.5-7B); a bare
    # number (DATAMACHINE_DEFAULT_MODEL=123) is a value meant for something else.
    if (not isinstance(value, str) or len(value) > MAX_MODEL_LENGTH
            or value != value.strip() or not value.isprintable()
            or not any(c.isalpha() for c in value)):
        raise InvalidSetting(
            f"Setting {key!r} must be a model id such as 'gpt-4o-mini' or 'llama3.2' (text "
            f"with a letter in it, at most {MAX_MODEL_LENGTH} characters, no surrounding "
            f"spaces), got {brief_repr(value)}.")


def _origin(key: str, value: Any) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(value) if isinstance(value, str) else None
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
            or parts.path not in ("", "/") or parts.query or parts.fragment
            or parts.username is not None):
        raise InvalidSetting(
            f"Setting {key!r} must be the origin people open the viewer at, scheme and host "
            f"(and port) only, like 'https://runs.example.com', got {brief_repr(value)}.")


def _loop_guard(key: str, value: Any) -> None:
    from datamachine.loop_guard.ladder import parse_ladder

    try:
        parse_ladder(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


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


def _context_windows(key: str, value: Any) -> None:
    from datamachine.context.window import parse_context_windows

    try:
        parse_context_windows(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


def _context_compaction(key: str, value: Any) -> None:
    from datamachine.context.window import parse_compaction

    try:
        parse_compaction(value, f"Setting {key!r}")
    except UsageError as exc:
        raise InvalidSetting(str(exc)) from None


def _context_reserve(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**8:
        raise InvalidSetting(f"Setting {key!r} must be a whole number of tokens from 0 to "
                             f"100,000,000 (room left for the answer), got "
                             f"{brief_repr(value)}.")


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


def _positive_seconds(key: str, value: Any) -> None:
    _number(key, value, positive=True)


def _counted(unit: str, maximum: int) -> Callable[[str, Any], None]:
    """A validator of a whole number of ``unit`` from 1 to ``maximum``."""
    def check(key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
            raise InvalidSetting(f"Setting {key!r} must be a whole number of {unit} from 1 to "
                                 f"{maximum:,}, got {brief_repr(value)}.")
    return check


_lock_ttl = _counted("seconds", 86_400)


def _rate_limit(key: str, value: Any) -> None:
    _whole(key, value, "requests per minute per token", 1_000_000)


def _concurrency(key: str, value: Any) -> None:
    _whole(key, value, "runs at once per token", 10_000)


# Every setting the core reads, with the default its code uses when the setting is unset (a
# test compares them with the constants at the call sites). Budget settings (max_turns, ...)
# are declared by their budgets; plugins declare theirs with register_settings().
CORE_SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(name="allow_model_requests", type="boolean", default=True, validator=_flag,
                description="When false, only the providers that never leave the process "
                            "(`scripted`, `test`, `function`) and `text_result` hooks answer; a "
                            "run on any other provider raises `ModelRequestsDisabled` (test "
                            "suites switch it off)."),
    SettingSpec(name="budget_pressure", type="boolean", default=False, validator=_flag,
                description="True switches budget pressure notices (the default tiers) on "
                            "for every run; the payload key `budget_pressure` decides per run."),
    SettingSpec(name="chat_max_concurrent", type="integer", default=8, validator=_concurrency,
                description="Runs one API token may have going at once on `/chat` (0 = no "
                            "limit); over it, 429 with Retry-After."),
    SettingSpec(name="chat_rate_limit", type="integer", default=120, validator=_rate_limit,
                description="Requests per minute one API token may send to `/chat` (0 = no "
                            "limit); over it, 429 with Retry-After."),
    SettingSpec(name="chat_tools", type=("array", "null"), default=None,
                validator=_tool_names,
                description="Tool names a `/chat` caller may use when its token has no "
                            "allowlist; unset: every registered tool."),
    SettingSpec(name="confirmation", type="string", default="ask", validator=_confirmation,
                description="At a soft limit: \"ask\" (the confirm_continuation hook answers "
                            "inside the run) or \"pause\" (the run stops "
                            "awaiting_confirmation)."),
    SettingSpec(name="context_compaction", type=("string", "object"), default="auto",
                validator=_context_compaction,
                description="What a run does before a request that would fill its context "
                            "window: \"auto\", \"off\" (a request that does not fit stops "
                            "the run), or {\"compact_at\", \"keep_turns\", \"strategies\"}; "
                            "the payload key `context_compaction` wins (docs/context.md)."),
    SettingSpec(name="context_reserve", type="integer", default=None,
                validator=_context_reserve,
                description="Tokens of the context window kept for the answer when the "
                            "request sets no max_tokens; unset: 1024 (at most a quarter of "
                            "the window)."),
    SettingSpec(name="context_windows", type="object", default=None,
                validator=_context_windows,
                description="Context windows in tokens by model: {model name or fnmatch "
                            "pattern: tokens}, an exact name before the patterns "
                            "(docs/context.md)."),
    SettingSpec(name="connect_timeout", type="number", default=15.0, validator=_number,
                description="Seconds to connect to a provider; clamped to [0, 300] and to "
                            "the request timeout."),
    SettingSpec(name="default_model", type="string", default="", validator=_model_id,
                description="The model of a run that names none: a model id with a letter in "
                            "it (`gpt-4o-mini`, `llama3.2`; a bare number is refused)."),
    SettingSpec(name="default_provider", type="string", default="scripted", validator=_text,
                description="The provider of a run that names none; must be registered."),
    SettingSpec(name="job_lock_ttl", type="integer", default=300, validator=_lock_ttl,
                description="Seconds a queued job's run holds its transcript lock past its "
                            "last write: after a worker dies, how long until another may go "
                            "on with the job. Longer than the slowest provider turn."),
    SettingSpec(name="job_retry_wait", type="number", default=2.0, validator=_positive_seconds,
                description="Seconds before a queued job's second attempt; each later one "
                            "waits twice as long (at most 5 minutes)."),
    SettingSpec(name="max_request_bytes", type="integer", default=1_048_576, validator=_bytes,
                description="Largest `/chat` request body in bytes (1 to 1 GiB); larger "
                            "bodies get 413."),
    SettingSpec(name="loop_guard", type=("array", "string"), default=None,
                validator=_loop_guard,
                description="What the loop guard does at each turn a model repeats itself: "
                            "a list of steps from \"nudge\", \"hide_tool\", \"stop\" "
                            "(the last repeats), or \"off\"; unset: [\"nudge\", "
                            "\"hide_tool\", \"stop\"]. The payload key `loop_guard` wins "
                            "(docs/loop-guard.md)."),
    SettingSpec(name="model_options", type="object", default=None, validator=_model_options,
                description="Model options for every run (temperature, max_tokens, ...); the "
                            "payload's `model_options` win key by key."),
    SettingSpec(name="openai_base_url", type="string", default=None, validator=_http_url,
                description="Base URL of the `openai` provider, an http(s) URL; "
                            "$OPENAI_BASE_URL wins over it; unset: https://api.openai.com/v1."),
    SettingSpec(name="prices", type="object", default=None, validator=_prices,
                description="US dollars per million tokens by model: "
                            "{model: {\"input\": ..., \"output\": ...}}; the cost budget and "
                            "spend limits need it."),
    SettingSpec(name="providers", type="object", default=None, validator=_endpoints,
                secret_fields=("headers",),
                description="Named endpoints, each a provider: {name: {\"type\", "
                            "\"base_url\", \"api_key_env\", \"model_options\", "
                            "\"headers\"}}; header values are masked in listings."),
    SettingSpec(name="request_timeout", type="number", default=300.0, validator=_number,
                description="Seconds one provider request may take; clamped to [0, 900]."),
    SettingSpec(name="site_id", type="string", default=None, validator=_site_id,
                description="This site's id in agent-to-agent chains (1-64 letters, digits, "
                            "'.', '_', ':' or '-'); generated (a uuid4 hex) and stored at the "
                            "first boot."),
    SettingSpec(name="viewer_origin", type="string", default=None, validator=_origin,
                description="The origin people open the run viewer at when a reverse proxy "
                            "serves it (https://runs.example.com): its forms' Origin is "
                            "accepted, and https there makes the login cookie Secure."),
    SettingSpec(name="spend_limits", type="array", default=None, validator=_spend_limits,
                description="Spend limits over time windows: a list of {\"name\", "
                            "\"budget\", \"window\", \"limit\" or \"limit_usd\", "
                            "\"scope\"}."),
)
_CORE = {spec.name: spec for spec in CORE_SETTINGS}


def validate_known_setting(key: str, value: Any) -> None:
    """Raise InvalidSetting when ``value`` cannot serve the core setting ``key`` (other keys
    pass)."""
    spec = _CORE.get(key)
    if spec is not None:
        spec.check(value)


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

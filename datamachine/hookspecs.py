"""Every hook a datamachine plugin can implement.

Names are a contract: arguments may grow, never shrink. Three kinds (DESIGN.md section 3):
``firstresult`` short-circuits (``None`` = no opinion; keep these sync), value filters folded by
the host (each impl gets the current ``value`` and returns a new one or ``None``), and actions.
Annotations here are real types, not strings, so ``docs/hooks.md`` can be checked against
``inspect.signature`` text.
"""

from typing import Any

import pluggy

from agents_api import IterationBudget, Message
from datamachine.context.compaction import CompactedView
from datamachine.loop_guard.signals import GuardTurn
from datamachine.observe import RunInfo, RunObserver
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.registry import BudgetSpec
from datamachine.setting_spec import SettingSpec
from datamachine.tools.definition import Tool

hookspec = pluggy.HookspecMarker("datamachine")
hookimpl = pluggy.HookimplMarker("datamachine")

# Hooks the host folds itself instead of calling through pluggy.
VALUE_FILTERS = frozenset({"request_timeout", "connect_timeout"})


@hookspec
def register_budgets() -> list[BudgetSpec | tuple[str, dict[str, Any]]] | None:
    """Called once at boot: return the budgets this plugin owns (BudgetSpec or (name, config))."""


@hookspec
def register_tools() -> list[Any] | None:
    """Called once at boot: return the Tool objects this plugin offers."""


@hookspec
def register_providers() -> list[Any] | None:
    """Called once at boot: return provider objects (each with ``name`` and ``complete``)."""


@hookspec
def register_modes() -> list[str] | None:
    """Called once at boot: return the extension mode names this plugin's behaviour keys off
    (``["support"]``). A run may only name a built-in or a declared mode."""


@hookspec(firstresult=True)
def text_result(request: ProviderRequest) -> ProviderResponse | dict[str, Any] | Exception | None:
    """Before dispatch: a compact dict, a ProviderResponse or an Exception short-circuits it."""


@hookspec(firstresult=True)
def provider_availability(provider: str, model: str) -> bool | str | None:
    """Before dispatch: True = available, a reason string = unavailable, None = default check."""


@hookspec
def request_timeout(
    value: float, mode: str, provider: str, model: str, payload: dict[str, Any]
) -> float | None:
    """Value filter: return the request timeout in seconds, or None to keep ``value``."""


@hookspec
def connect_timeout(
    value: float,
    mode: str,
    provider: str,
    model: str,
    payload: dict[str, Any],
    request_timeout: float,
) -> float | None:
    """Value filter: return the connect timeout in seconds, or None to keep ``value``."""


@hookspec(firstresult=True)
def compact_context(messages: list[Message], context: dict[str, Any]) -> CompactedView | None:
    """A request would fill the context window: return a smaller view of ``messages`` (what
    would be sent) to send instead, or None to leave it to the built-in strategies. Asked
    before them; ``context`` has ``turn``, ``mode``, ``session_id``, ``ceiling`` (the window),
    ``limit`` (the prompt tokens to get under) and ``reserve``."""


@hookspec
def detect_stuck(turns: list[GuardTurn], context: dict[str, Any]) -> str | None:
    """After each turn the built-in signals found nothing in: return a name for what makes
    the run look stuck (a signal, counted on ``stuck_turns`` like the built-in ones), or None.
    Every plugin is asked (the first name wins). ``turns``: the run's completed turns (text,
    calls and how each ended); ``context`` has ``turn``, ``mode``, ``session_id`` and
    ``hidden_tools``."""


@hookspec(firstresult=True)
def confirm_continuation(budget: IterationBudget, context: dict[str, Any]) -> bool | None:
    """A soft limit was reached: True = continue, False = stop, None = no UI (headless default)."""


@hookspec(firstresult=True)
def reconcile_tool_call(tool: Tool | None, call: dict[str, Any], idempotency_key: str) -> Any:
    """A call's outcome is in doubt: a run died after a ``write`` call (or an approved one)
    started and before its result was stored (DESIGN.md 24). Look it up where the tool acted
    (by ``idempotency_key``, or by ``call["parameters"]``) and return what the call returned
    to settle it without running it again; None when you cannot tell (a person is asked next).
    ``tool`` is None when no loaded tool has the call's name any more."""


@hookspec
def on_loop_event(event: str, payload: dict[str, Any]) -> None:
    """Observe every loop event of every run; the return value is ignored."""


@hookspec
def run_observer(run: RunInfo, host: Any) -> RunObserver | None:
    """Called once per run as it is set up (``host``: the run's host, for its settings): return
    an object whose ``event(name, payload)`` receives that run's events, or None to leave the
    run unobserved (then it costs nothing)."""


@hookspec
def register_commands(cli: Any) -> None:
    """Called when the CLI starts: add click commands to the ``cli`` group."""


@hookspec
def register_settings() -> list[SettingSpec] | None:
    """Called once at boot: return the settings this plugin reads, as SettingSpec objects."""


@hookspec
def validate_setting(key: str, value: Any) -> None:
    """The older way (declare with ``register_settings`` instead): called when a setting is
    written; for a key this plugin owns, raise ``ValueError`` saying what is wrong with
    ``value`` (the host reports it as ``InvalidSetting``). Ignore other keys."""


@hookspec
def host_started(host: Any) -> None:
    """Called once at the end of boot with the new host: a plugin that needs the host's
    settings to offer anything (MCP servers from ``mcp_servers``) starts it here and adds its
    tools with ``host.tools.register(...)``. An exception fails the boot, so report a part that
    cannot start (log it, leave its tools out) instead of raising."""


@hookspec
def host_closing(host: Any) -> None:
    """Called by ``host.close()`` before the host's connections close: stop what
    ``host_started`` started (servers, threads, processes). Exceptions are logged."""

"""What a paused run leaves behind and what resuming it starts from (DESIGN.md 16).

A run with ``confirmation="pause"`` does not ask ``confirm_continuation``: where it would ask (a
spent extendable budget, a chat session's turn limit, a tool that ``requires_approval``), it
stops ``awaiting_confirmation``. Its ``pending`` is stored with its transcript, so any process
can resume it; the objects JSON cannot hold (its tools, its policy) stay in this process's
:class:`PausedRuns`, and a resume in another process finds the tools by name instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from datamachine.payload_keys import RuntimeOptions
from datamachine.registry import SettingsLookup

if TYPE_CHECKING:
    from datamachine.host import Services

__all__ = ["CONFIRMATION_SETTING", "Confirmation", "PausedRun", "PausedRuns", "PendingKind",
           "Resumption", "confirmation_mode", "kept_payload", "paused_runs", "pending_warning",
           "stored_pending"]

CONFIRMATION_SETTING = "confirmation"
PendingKind = Literal["budget", "chat_turn_limit", "tool_approval", "stuck"]

# The runtime options a resumed run keeps from its paused run (in this process): how it is
# judged and bounded. Sinks, stores and scripts belong to whoever resumes it.
_KEPT_OPTIONS = ("completion_assertions", "completion_policy", "tool_runtime_rules",
                 "budget_pressure", "final_summary", "max_seconds", "extend_by", "model_options",
                 "output_type", "confirmation", "transcript_lock_ttl", "budget_ceilings",
                 "context_compaction", "loop_guard")
# Payload keys a resumed run must not inherit: its pipeline job was settled when it paused.
_JOB_KEYS = frozenset({"job_id", "flow_step_id"})


def confirmation_mode(settings: SettingsLookup, runtime: RuntimeOptions) -> str:
    """The run's payload ``confirmation``, else the setting (read through ``settings``, a
    host's or a run's ``get``), else ``"ask"``."""
    if runtime.confirmation is not None:
        return runtime.confirmation
    setting = settings(CONFIRMATION_SETTING)
    return setting if setting in ("ask", "pause") else "ask"


class Confirmation:
    """A run's confirmation mode, read when first needed (a run that never needs a person's
    answer costs no settings lookup). Holds no reference to the run, so handing its
    :meth:`pauses` to the tool executor makes no reference cycle."""

    __slots__ = ("_mode", "_runtime", "_settings")

    def __init__(self, settings: SettingsLookup, runtime: RuntimeOptions) -> None:
        self._settings = settings
        self._runtime = runtime
        self._mode: str | None = None

    @property
    def mode(self) -> str:
        """``"ask"`` or ``"pause"``."""
        if self._mode is None:
            self._mode = confirmation_mode(self._settings, self._runtime)
        return self._mode

    def pauses(self) -> bool:
        """The run pauses where it would ask."""
        return self.mode == "pause"


def kept_payload(payload: Mapping[str, Any], runtime: RuntimeOptions) -> dict[str, Any]:
    """What of a paused run's payload its resumption runs with (see ``_KEPT_OPTIONS``)."""
    kept = {key: value for key, value in payload.items() if key not in _JOB_KEYS}
    defaults = RuntimeOptions()
    for key in _KEPT_OPTIONS:
        value = getattr(runtime, key)
        if value != getattr(defaults, key):
            kept[key] = value
    return kept


def stored_pending(status: str, result: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a stored transcript's run waits for (its ``status`` and ``result`` summary), or
    None when it is not paused."""
    pending = result.get("pending")
    if status == "awaiting_confirmation" and isinstance(pending, dict):
        return pending
    return None


def pending_warning(pending: Mapping[str, Any]) -> str:
    """The result's ``warning`` for a paused run: what it waits for, in words."""
    kind = pending.get("kind")
    if kind == "tool_approval":
        call = pending.get("tool_call") or {}
        what = f"tool {call.get('name')!r} needs approval before it runs"
    elif kind == "chat_turn_limit":
        what = "the chat session reached its turn limit"
    elif kind == "stuck":
        what = "the model kept repeating itself (the loop guard's stuck_turns budget is spent)"
    else:
        what = f"its {str(pending.get('budget')).replace('_', ' ')} budget is spent"
    return (f"The run is paused: {what}. Answer with resume(session_id, approve=True) to go "
            "on, or approve=False to stop.")


@dataclass(frozen=True)
class PausedRun:
    """What this process keeps of a paused run beyond its stored ``pending`` (``pause_id``:
    the pause it belongs to, so a later pause of the session elsewhere is never answered with
    this one's tools)."""

    tools: dict[str, Any]
    payload: dict[str, Any]
    pause_id: str


class PausedRuns:
    """Paused runs of one host in this process, by session id (thread-safe). Holds the most
    recent ``limit`` pauses: an older one resumes with the tools found by name instead."""

    def __init__(self, limit: int = 1000) -> None:
        self._runs: OrderedDict[str, PausedRun] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def keep(self, session_id: str, run: PausedRun) -> None:
        """Remember a run that just paused."""
        with self._lock:
            self._runs[session_id] = run
            self._runs.move_to_end(session_id)
            while len(self._runs) > self._limit:
                self._runs.popitem(last=False)

    def get(self, session_id: str, pause_id: object = None) -> PausedRun | None:
        """The paused run of ``session_id`` this process holds, if it is the pause
        ``pause_id`` (another process may have resumed and paused the session since)."""
        with self._lock:
            found = self._runs.get(session_id)
        return found if found is not None and found.pause_id == pause_id else None

    def forget(self, session_id: str) -> None:
        """Drop a run once it is resumed."""
        with self._lock:
            self._runs.pop(session_id, None)


_REGISTRY_LOCK = threading.Lock()


def paused_runs(services: Services) -> PausedRuns:
    """The host's :class:`PausedRuns` (made on first use)."""
    found = services.__dict__.get("_paused_runs")
    if found is None:
        with _REGISTRY_LOCK:
            found = services.__dict__.setdefault("_paused_runs", PausedRuns())
    assert isinstance(found, PausedRuns)
    return found


@dataclass(frozen=True)
class Resumption:
    """How a resumed run starts where its paused run stopped.

    ``budgets``: the paused run's budget snapshots (counts and ceilings carry on);
    ``extend``: the budget an approval extends and by how much; ``declined_budget``: the spent
    budget that was not extended (the run stops on it); ``approved_call`` / ``declined_call``:
    the call id a person answered; ``approval_id``: the pause that answer was for (an approved
    call's intent stores it); ``pending_calls``: the calls that waited, run first;
    ``hidden_tools``: the tools the loop guard had taken away (they stay away).
    """

    budgets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pending_calls: tuple[dict[str, Any], ...] = ()
    extend: tuple[str, int] | None = None
    declined_budget: str | None = None
    approved_call: str | None = None
    declined_call: str | None = None
    approval_id: str | None = None
    hidden_tools: tuple[str, ...] = ()

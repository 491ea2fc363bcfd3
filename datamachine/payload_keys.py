"""The payload keys that carry runtime objects or loop configuration (DESIGN.md 5.2): the one
home of their names and defaults.

:class:`RuntimeOptions` is the run's view of them; its fields *are* the keys, so the adapter
(which takes them out of the payload) and the tool executor (which never shows them to a tool,
even when it is used without the adapter) cannot disagree about the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["DEFAULT_LOCK_TTL", "RUNTIME_KEYS", "RuntimeOptions"]

DEFAULT_LOCK_TTL = 300


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class RuntimeOptions:
    """The runtime objects of one run, taken out of its payload (validated)."""

    event_sink: Any = None
    transcript_persister: Any = None
    transcript_lock: Any = None
    transcript_session_id: str | None = None
    transcript_lock_ttl: int = DEFAULT_LOCK_TTL
    completion_assertions: dict[str, Any] = field(default_factory=dict)
    completion_policy: Any = None
    tool_runtime_rules: list[Any] = field(default_factory=list)
    budget_pressure: Any = None
    final_summary: bool = True
    persist_transcript: bool = True
    script: Any = None
    max_seconds: float | None = None
    extend_by: int | None = None
    model_options: dict[str, Any] = field(default_factory=dict)
    output_type: Any = None
    # "ask" (confirm_continuation answers inside the run) or "pause" (the run stops
    # awaiting_confirmation); None: the setting ``confirmation``, else "ask".
    confirmation: str | None = None
    # {budget name: ceiling} for this run, in each budget's unit (clamped and reported).
    budget_ceilings: dict[str, int] = field(default_factory=dict)
    # The name of the /chat bearer token the run answers (set by the server): spend limits
    # scoped "token" count against it.
    token_name: str | None = None
    # Error codes after which a pipeline run leaves its job ``running`` for another attempt
    # instead of failing it (set by ``datamachine worker`` on all but a job's last attempt).
    job_retry_codes: list[str] = field(default_factory=list)
    # "auto", "off" or {"compact_at", "keep_turns", "strategies"}, checked (None: the setting).
    context_compaction: Any = None
    # The loop guard's steps, or "off" (None: the setting, else the default ladder).
    loop_guard: Any = None


RUNTIME_KEYS = frozenset(option.name for option in fields(RuntimeOptions))

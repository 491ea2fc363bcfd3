"""Splitting a run's payload into what tools and requests may see and the runtime objects.

Runtime objects (event sinks, persisters, locks, policies, scripts) are taken out before anything
reaches a tool or a provider request: they are not JSON, and a model must never see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datamachine.errors import UsageError
from datamachine.payload_keys import RUNTIME_KEYS
from datamachine.registry import validate_budget_value

__all__ = ["RUNTIME_KEYS", "RuntimeOptions", "base_log_context", "split_payload"]

_LOG_KEYS = ("job_id", "flow_step_id", "agent_slug")


@dataclass
class RuntimeOptions:
    """The runtime objects of one run, taken out of its payload."""

    event_sink: Any = None
    transcript_persister: Any = None
    transcript_lock: Any = None
    transcript_session_id: str | None = None
    transcript_lock_ttl: int = 300
    completion_assertions: dict[str, Any] = field(default_factory=dict)
    completion_policy: Any = None
    tool_runtime_rules: list[Any] = field(default_factory=list)
    budget_pressure: Any = None
    final_summary: bool = True
    persist_transcript: bool = True
    script: Any = None
    max_seconds: float | None = None
    extend_by: int | None = None


def split_payload(payload: Mapping[str, Any] | None) -> tuple[dict[str, Any], RuntimeOptions]:
    """Return ``(clean_payload, runtime)``; bad runtime values raise UsageError naming the key."""
    if payload is None:
        return {}, RuntimeOptions()
    if not isinstance(payload, Mapping):
        raise UsageError(f"payload must be a dict, got {type(payload).__name__}.")
    clean = {k: v for k, v in payload.items() if k not in RUNTIME_KEYS}
    options = RuntimeOptions()
    for key in RUNTIME_KEYS & payload.keys():
        setattr(options, key, payload[key])
    session_id = options.transcript_session_id
    if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
        raise UsageError("payload['transcript_session_id'] must be a non-empty string.")
    ttl = options.transcript_lock_ttl
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
        raise UsageError("payload['transcript_lock_ttl'] must be a positive number of seconds.")
    if options.completion_assertions is None:
        options.completion_assertions = {}
    if not isinstance(options.completion_assertions, Mapping):
        raise UsageError("payload['completion_assertions'] must be a dict.")
    if options.tool_runtime_rules is None:
        options.tool_runtime_rules = []
    if not isinstance(options.tool_runtime_rules, list):
        raise UsageError("payload['tool_runtime_rules'] must be a list of rule dicts.")
    seconds = options.max_seconds
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                or seconds <= 0):
        raise UsageError("payload['max_seconds'] must be a positive number of seconds.")
    if options.event_sink is not None and not (
        callable(options.event_sink) or callable(getattr(options.event_sink, "emit", None))
    ):
        raise UsageError("payload['event_sink'] must be a callable or have emit(event, payload).")
    if options.extend_by is not None:
        validate_budget_value("payload['extend_by']", options.extend_by)
    for flag in ("final_summary", "persist_transcript"):
        if not isinstance(getattr(options, flag), bool):
            raise UsageError(f"payload[{flag!r}] must be True or False, "
                             f"got {getattr(options, flag)!r}.")
    lock = options.transcript_lock
    if lock is not None and not (callable(getattr(lock, "acquire", None))
                                 and callable(getattr(lock, "release", None))):
        raise UsageError("payload['transcript_lock'] must have acquire(session_id, ttl) and "
                         "release(session_id, token) methods.")
    persister = options.transcript_persister
    if persister is not None and not callable(getattr(persister, "persist", None)):
        raise UsageError("payload['transcript_persister'] must have a "
                         "persist(messages, request, result) method.")
    return clean, options


def base_log_context(mode: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """``{mode, job_id, flow_step_id, agent_slug}`` with absent keys omitted."""
    context: dict[str, Any] = {"mode": mode}
    for key in _LOG_KEYS:
        value = payload.get(key)
        if value not in (None, ""):
            context[key] = value
    return context

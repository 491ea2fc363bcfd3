"""Splitting a run's payload into what tools and requests may see and the runtime objects.

Runtime objects (event sinks, persisters, locks, policies, scripts) are taken out before anything
reaches a tool or a provider request: they are not JSON, and a model must never see them. Each
runtime key has one check; a bad value is a UsageError naming the key and the fix.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.errors import InvalidBudgetValue, PayloadKeyWarning, UsageError
from datamachine.payload_keys import RUNTIME_KEYS, RuntimeOptions
from datamachine.providers.options import validate_model_options
from datamachine.providers.scripted import Script, load_script
from datamachine.registry import MAX_METERED_VALUE, validate_budget_value
from datamachine.storage.locks import MAX_TTL

__all__ = [
    "CONFIRMATION_MODES",
    "RUNTIME_KEYS",
    "RuntimeOptions",
    "base_log_context",
    "check_event_sink",
    "check_payload_is_data",
    "payload_mapping",
    "split_payload",
]

# How a run gets a person's answer (DESIGN.md 16): asked inside the run, or paused for later.
CONFIRMATION_MODES = ("ask", "pause")

_LOG_KEYS = ("job_id", "flow_step_id", "agent_slug")


def _session_id(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise UsageError("payload['transcript_session_id'] must be a non-empty string.")
    return value


def _lock_ttl(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TTL:
        raise UsageError(f"payload['transcript_lock_ttl'] must be an integer number of seconds "
                         f"from 1 to {MAX_TTL}, got {brief_repr(value)}.")
    return value


def _assertions(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError("payload['completion_assertions'] must be a dict.")
    return value


def _rules(value: Any) -> Any:
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError("payload['tool_runtime_rules'] must be a list of rule dicts.")
    return value


def _seconds(value: Any) -> Any:
    if value is not None and clock.duration(value) is None:
        raise UsageError(f"payload['max_seconds'] must be a finite positive number of seconds "
                         f"(fractions allowed), got {brief_repr(value)}.")
    return value


def check_event_sink(value: Any) -> Any:
    """``payload["event_sink"]``: None, a callable or an object with ``emit(event, payload)``."""
    if value is not None and not (callable(value) or callable(getattr(value, "emit", None))):
        raise UsageError("payload['event_sink'] must be a callable or have emit(event, payload).")
    return value


def _extend_by(value: Any) -> Any:
    if value is not None:
        validate_budget_value("payload['extend_by']", value)
    return value


def _flag(key: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, bool):
            raise UsageError(f"payload[{brief_repr(key)}] must be True or False, got "
                             f"{brief_repr(value)}.")
        return value

    return check


def _lock(value: Any) -> Any:
    if value is not None and not (callable(getattr(value, "acquire", None))
                                  and callable(getattr(value, "release", None))):
        raise UsageError("payload['transcript_lock'] must have acquire(session_id, ttl) and "
                         "release(session_id, token) methods.")
    return value


def _persister(value: Any) -> Any:
    if value is not None and not callable(getattr(value, "persist", None)):
        raise UsageError("payload['transcript_persister'] must have a "
                         "persist(messages, request, result) method.")
    return value


def _confirmation(value: Any) -> Any:
    if value is not None and value not in CONFIRMATION_MODES:
        raise UsageError(f"payload['confirmation'] must be 'ask' or 'pause', got "
                         f"{brief_repr(value)}.")
    return value


def _context_compaction(value: Any) -> Any:
    from datamachine.context.window import parse_compaction

    parse_compaction(value, "payload['context_compaction']")
    return value


def _loop_guard(value: Any) -> Any:
    from datamachine.loop_guard.ladder import parse_ladder

    parse_ladder(value, "payload['loop_guard']")
    return value


def _budget_ceilings(value: Any) -> Any:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError("payload['budget_ceilings'] must be a dict of budget name -> ceiling.")
    for name, ceiling in value.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"payload['budget_ceilings'] keys must be budget names, "
                             f"got {brief_repr(name)}.")
        # The unit's own range is checked where the budget is known (0 only for a budget
        # that counts repeats); here only what no budget takes, said without a range that
        # would not be the budget's.
        knob = f"payload['budget_ceilings'][{brief_repr(name)}]"
        try:
            validate_budget_value(knob, ceiling, maximum=MAX_METERED_VALUE, minimum=0)
        except InvalidBudgetValue:
            raise InvalidBudgetValue(
                f"{knob} must be a whole number in the budget's range (`datamachine budgets "
                f"list` shows each budget's range), got {brief_repr(ceiling)}.") from None
    return dict(value)


def _token_name(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not value.strip()
                              or len(value) > 100):
        raise UsageError("payload['token_name'] must be the name of an API token (a non-empty "
                         f"string of at most 100 characters), got {brief_repr(value)}.")
    return value


def _output_type(value: Any) -> Any:
    from datamachine.conversation.output import check_output_type

    return check_output_type(value)


def _codes(value: Any) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"payload job_retry_codes must be a list of error codes (strings), "
                         f"got {brief_repr(value)}.")
    return list(value)


# A script file the payload names must be one of these: what the scripted provider reads.
SCRIPT_SUFFIXES = (".json", ".yaml", ".yml")


def _script(value: Any) -> Any:
    """``payload["script"]``: the responses themselves (a list, or a ``Script``), checked now,
    before anything is stored; or a file your code chose, as a ``pathlib.Path`` to an existing
    regular ``.json`` / ``.yaml`` / ``.yml`` file. A plain string is refused: payload data can
    come from anywhere (a queued job's JSON, an HTTP body) and must never make the provider
    open a file."""
    if value is None or isinstance(value, Script):
        return value
    if isinstance(value, str):
        raise UsageError(
            "payload['script'] is a string; give the responses themselves (a list such as "
            "[{'content': 'Hi.'}]) or, for a file your code chose, a pathlib.Path to a .json "
            "or .yaml file (a string is data, and data never opens files). On the command "
            "line: --script FILE.")
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if not isinstance(path, str) or not path.lower().endswith(SCRIPT_SUFFIXES) \
                or not os.path.isfile(path):
            raise UsageError(f"payload['script'] must be an existing .json, .yaml or .yml "
                             f"file, got {brief_repr(path)}.")
    elif not isinstance(value, list | tuple):
        raise UsageError(f"payload['script'] must be a list of responses (such as "
                         f"[{{'content': 'Hi.'}}]) or a pathlib.Path to a script file, got "
                         f"{type(value).__name__}.")
    script = load_script(value)  # InvalidScript (a UsageError) names the bad entry
    if not script.responses:
        raise UsageError("payload['script'] has no responses: give at least one, such as "
                         "[{'content': 'Hi.'}] (leave 'script' out for the echo).")
    return script


def _completion_policy(value: Any) -> Any:
    if value is not None and not any(
            callable(getattr(value, method, None))
            for method in ("record_tool_result", "record_natural_completion")):
        raise UsageError(
            f"payload['completion_policy'] must be an object with record_tool_result(...) "
            f"and/or record_natural_completion(...) (see datamachine.completion), got "
            f"{brief_repr(value)}.")
    return value


def _check_context(clean: Mapping[str, Any]) -> None:
    """The ordinary keys the product itself reads: checked before the run, not when a tool or
    a job first reads them."""
    engine_data = clean.get("engine_data")
    if engine_data is not None and not isinstance(engine_data, dict):
        raise UsageError(f"payload['engine_data'] must be a dict (the data tools read and "
                         f"write), got {brief_repr(engine_data)}.")
    job_id = clean.get("job_id")
    if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int | str)):
        raise UsageError(f"payload['job_id'] must be a job id, the integer host.jobs.create() "
                         f"returns, got {brief_repr(job_id)}.")
    if clean.get("caller_context") is not None:
        from datamachine.server.chain import CallerContext

        CallerContext.from_payload(clean)  # UsageError naming the field


def check_payload_is_data(payload: Mapping[str, Any]) -> None:
    """A payload that must travel through a database (a queued job's): JSON data only, no
    runtime objects. UsageError naming the first key that is not."""
    import json

    for key, value in payload.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise UsageError(f"payload {key!r} must be JSON data to be queued (a worker reads "
                             f"it from the database), got {brief_repr(value)}: {exc}.") from None


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "transcript_session_id": _session_id,
    "transcript_lock_ttl": _lock_ttl,
    "completion_assertions": _assertions,
    "tool_runtime_rules": _rules,
    "max_seconds": _seconds,
    "event_sink": check_event_sink,
    "extend_by": _extend_by,
    "final_summary": _flag("final_summary"),
    "persist_transcript": _flag("persist_transcript"),
    "transcript_lock": _lock,
    "transcript_persister": _persister,
    "model_options": validate_model_options,
    "output_type": _output_type,
    "confirmation": _confirmation,
    "budget_ceilings": _budget_ceilings,
    "token_name": _token_name,
    "job_retry_codes": _codes,
    "script": _script,
    "completion_policy": _completion_policy,
    "context_compaction": _context_compaction,
    "loop_guard": _loop_guard,
}


def payload_mapping(payload: object) -> Mapping[str, Any]:
    """The caller's ``payload`` as a mapping (``{}`` for None). Every entry point that adds to
    a payload (``output_type``, a stream's sink, a session id) checks it here first, so a
    string or a list is a UsageError naming ``payload`` rather than a ``TypeError`` from
    ``{**payload}`` or a ``ValueError`` from ``dict(payload)``."""
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise UsageError(f"payload must be a dict of context and runtime options, got "
                         f"{type(payload).__name__}.")
    return payload


# Ordinary key -> the runtime key it nearly spells (None: not a near miss), remembered so a
# run's ordinary keys cost one lookup each. Bounded: payload keys may come from callers.
_near_misses: dict[object, str | None] = {}
_RUNTIME_NAMES = sorted(RUNTIME_KEYS)


def _near_miss(key: object) -> str | None:
    """The runtime key ``key`` looks like a misspelling of (``persist_transcipt``), or None."""
    if key in _near_misses:
        return _near_misses[key]
    closest = None
    if isinstance(key, str) and len(key) <= 64:
        found = difflib.get_close_matches(key.lower(), _RUNTIME_NAMES, n=1, cutoff=0.85)
        closest = found[0] if found else None
    if len(_near_misses) < 1024:
        _near_misses[key] = closest
    return closest


def split_payload(payload: Mapping[str, Any] | None) -> tuple[dict[str, Any], RuntimeOptions]:
    """Return ``(clean_payload, runtime)``; bad runtime values raise UsageError naming the key."""
    if payload is None:
        return {}, RuntimeOptions()
    payload = payload_mapping(payload)
    for key in payload:
        if not isinstance(key, str):
            raise UsageError(f"payload keys must be names (strings such as 'job_id'), got "
                             f"{brief_repr(key)}.")
    clean = {k: v for k, v in payload.items() if k not in RUNTIME_KEYS}
    _check_context(clean)
    for key in clean:
        closest = _near_miss(key)
        if closest is not None:
            warnings.warn(
                f"payload key {key!r} is not a runtime option: it is passed on as ordinary "
                f"context (to tools and providers); did you mean {closest!r}?",
                PayloadKeyWarning, stacklevel=2)
    # In the payload's order: of two bad keys, the error names the first one given.
    given = {key: value for key, value in payload.items() if key in RUNTIME_KEYS}
    for key, value in given.items():
        check = _CHECKS.get(key)
        if check is not None:
            given[key] = check(value)
    return clean, RuntimeOptions(**given)


def base_log_context(mode: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """``{mode, job_id, flow_step_id, agent_slug}`` with absent keys omitted."""
    context: dict[str, Any] = {"mode": mode}
    for key in _LOG_KEYS:
        value = payload.get(key)
        if value not in (None, ""):
            context[key] = value
    return context

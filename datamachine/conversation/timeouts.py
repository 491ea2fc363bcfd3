"""Request and connect timeouts: settings first, then the value-filter hooks.

Resolved once per run (the hooks see the run's mode, provider, model and payload, none of which
change between turns). The connect timeout is never above the request timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datamachine.services import Services

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "DEFAULT_REQUEST_TIMEOUT", "Timeouts", "resolve_timeouts"]

DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_CONNECT_TIMEOUT = 15.0
MAX_REQUEST_TIMEOUT = 900.0
MAX_CONNECT_TIMEOUT = 300.0


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class Timeouts:
    """The transport profile of a run, in seconds."""

    request: float
    connect: float


def _number(value: object, fallback: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return fallback
    return float(value)


def resolve_timeouts(
    host: Services, mode: str, provider: str, model: str, payload: Mapping[str, Any]
) -> Timeouts:
    """Settings ``request_timeout`` / ``connect_timeout``, clamped, then the filter hooks."""
    hooks = host.pm.hook
    base_request = _number(host.settings.get("request_timeout"), DEFAULT_REQUEST_TIMEOUT)
    request = min(max(base_request, 0.0), MAX_REQUEST_TIMEOUT)
    if hooks.request_timeout.get_hookimpls():
        filtered = host.fold("request_timeout", request, mode=mode, provider=provider,
                             model=model, payload=dict(payload))
        # The clamps hold after the filters too: a plugin cannot make a call wait forever.
        request = min(max(0.0, _number(filtered, request)), MAX_REQUEST_TIMEOUT)

    base_connect = _number(host.settings.get("connect_timeout"), DEFAULT_CONNECT_TIMEOUT)
    connect = min(max(base_connect, 0.0), MAX_CONNECT_TIMEOUT, request)
    if hooks.connect_timeout.get_hookimpls():
        filtered = host.fold("connect_timeout", connect, mode=mode, provider=provider,
                             model=model, payload=dict(payload), request_timeout=request)
        connect = min(max(0.0, _number(filtered, connect)), MAX_CONNECT_TIMEOUT, request)
    return Timeouts(request=request, connect=connect)

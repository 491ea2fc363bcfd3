"""Default plugin: the built-in ``call_remote_agent`` tool (agent-to-agent, DESIGN.md section 8).

A model calls ``call_remote_agent(site, message)`` to ask an agent on another datamachine site.
The site's URL and bearer token come from this host's setting ``remote_sites``
(``{name: {"url": ..., "token": ...}}``); the model only ever sees the site's name, never its
token. Every call carries the chain: the same chain id, this run's depth (the receiver adds one)
and the sites passed through plus this one, so depth is counted and cycles are caught across
hops.

A refusal (429 too deep, 409 a cycle, any other non-2xx) becomes a failed tool result with the
remote error code, and is never retried: retrying a chain that is too deep or circular cannot
succeed and only multiplies load on every site in the chain.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.errors import InvalidSetting, UsageError
from datamachine.hookspecs import hookimpl
from datamachine.server.site import current_host, ensure_site_id
from datamachine.setting_spec import SettingSpec
from datamachine.tools import Tool, ToolContext, tool

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = [
    "REMOTE_SITES_SETTING",
    "TIMEOUT_SETTING",
    "RemoteSite",
    "call_remote_agent",
    "load_remote_sites",
    "register_settings",
    "register_tools",
]

REMOTE_SITES_SETTING = "remote_sites"
TIMEOUT_SETTING = "remote_agent_timeout"
DEFAULT_TIMEOUT_SECONDS = 120.0
_MAX_TIMEOUT_SECONDS = 900.0
ERROR_TYPE = "remote_agent_error"
# What of a refusal's ``data`` the model gets: the chain facts and a run's outcome, not the whole
# remote transcript a failed run carries.
_REMOTE_DATA_KEYS = frozenset({"chain_id", "chain_depth", "ceiling", "retry_after", "site_id",
                               "chain_sites", "header", "status", "error_code",
                               "transcript_session_id", "max_request_bytes"})


class RemoteSite(BaseModel):
    """One entry of the ``remote_sites`` setting."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://[^\s/]+", description="Base URL; /chat is appended.")
    token: str = Field(min_length=1, description="A token from the remote site's CLI.")


def load_remote_sites(host: Host) -> dict[str, RemoteSite]:
    """The validated ``remote_sites`` setting (``{}`` when unset).

    Raises :class:`InvalidSetting` naming the entry and field when it is malformed.
    """
    raw = host.settings.get(REMOTE_SITES_SETTING, {})
    return parse_remote_sites(raw)


def parse_remote_sites(raw: object) -> dict[str, RemoteSite]:
    """``raw`` as ``{name: RemoteSite}``; :class:`InvalidSetting` naming the entry and field."""
    if not isinstance(raw, dict):
        raise InvalidSetting(
            f"setting {REMOTE_SITES_SETTING!r} must be a JSON object "
            '{"name": {"url": "http://...", "token": "dm_..."}}, '
            f"got {type(raw).__name__}.")
    sites: dict[str, RemoteSite] = {}
    for name, entry in raw.items():
        try:
            sites[str(name)] = RemoteSite.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            raise InvalidSetting(
                f"setting {REMOTE_SITES_SETTING!r}, site {name!r}: {problems}.") from None
    return sites


def _timeout(host: Host) -> float:
    value = host.settings.get(TIMEOUT_SETTING, DEFAULT_TIMEOUT_SECONDS)
    return min(_check_timeout(value), _MAX_TIMEOUT_SECONDS)


def _check_timeout(value: object) -> float:
    seconds = clock.duration(value)  # None for 10**400 too (no float holds it)
    if seconds is None:
        raise InvalidSetting(f"setting {TIMEOUT_SETTING!r} must be a finite positive number of "
                             f"seconds, got {brief_repr(value)}.")
    return seconds


def _resolve_host(context: ToolContext) -> Host:
    # A ToolContext that carries its host wins; then the host the /chat server bound around the
    # run; a run started outside the server falls back to the default host.
    found: Host | None = getattr(context, "host", None) or current_host()
    if found is not None:
        return found
    from datamachine.api import get_default_host

    return get_default_host()


def _failure(site: str, error: str, **extra: Any) -> dict[str, Any]:
    return {"success": False, "error": error, "error_type": ERROR_TYPE, "site": site, **extra}


def _remote_error(site: str, status: int, text: str) -> dict[str, Any]:
    code, message = f"http_{status}", text[:500]
    data: dict[str, Any] = {}
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("code") or code)
        message = str(body.get("message") or message)
        if isinstance(body.get("data"), dict):
            data = body["data"]
    advice = " Do not call this site again for this request; answer with what you have." if (
        status in (409, 429)) else ""
    return _failure(site, f"Remote site {site!r} refused the call (HTTP {status}, {code}): "
                          f"{message}{advice}",
                    remote_status=status, remote_code=code,
                    remote_data={k: v for k, v in data.items() if k in _REMOTE_DATA_KEYS})


@tool(name="call_remote_agent")
def call_remote_agent(site: str, message: str, context: ToolContext) -> dict[str, Any]:
    """Ask the agent of another datamachine site and return its answer.

    Each call is one hop of an agent chain; the other site refuses a chain that is too deep or
    that would come back to a site it already passed through. A refusal is final for this
    request: do not call again.

    Args:
        site: Name of the remote site, as configured in this site's remote_sites setting.
        message: What to ask the remote agent.
    """
    try:
        host = _resolve_host(context)
        sites = load_remote_sites(host)
        target = sites.get(site)
        if target is None:
            known = ", ".join(sorted(sites)) or "none configured"
            return _failure(site, f"Unknown remote site {site!r}; known sites: {known}.")
        # Loaded per call, like httpx: a host that never calls another site never needs it.
        from datamachine.server.chain import CallerContext

        caller = CallerContext.from_payload(context.payload)
        site_id = ensure_site_id(host)
        timeout = _timeout(host)
    except UsageError as exc:
        return _failure(site, str(exc))
    agent = context.payload.get("agent_slug")
    headers = {
        "Authorization": f"Bearer {target.token}",
        **caller.outbound_headers(site_id, agent if isinstance(agent, str) else None),
    }
    _inject_trace_context(headers)
    import httpx

    url = target.url.rstrip("/") + "/chat"
    try:
        # One request, no retries: a refusal must not be repeated (see the module docstring).
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=min(10.0, timeout))) as client:
            response = client.post(url, json={"message": message}, headers=headers)
    except httpx.HTTPError as exc:
        return _failure(site, f"Remote site {site!r} could not be reached at {url}: "
                              f"{type(exc).__name__}: {exc}.", remote_status=None)
    if not response.is_success:
        return _remote_error(site, response.status_code, response.text)
    try:
        body = response.json()
    except ValueError:
        return _failure(site, f"Remote site {site!r} answered HTTP {response.status_code} with "
                              "a body that is not JSON.", remote_status=response.status_code)
    if not isinstance(body, dict):
        body = {}
    return {"success": True, "result": {
        "site": site,
        "status": body.get("status"),
        "final_content": body.get("final_content", ""),
        "session_id": body.get("transcript_session_id"),
        "chain_id": caller.chain_id,
    }}


def _inject_trace_context(headers: dict[str, str]) -> None:
    """Add the W3C ``traceparent`` (and ``tracestate``) of the current span, this call's
    ``execute_tool`` span, so the remote run continues the trace (docs/observability.md).
    Nothing without OpenTelemetry, or when no span is being recorded."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return  # no tracing here: nothing to continue, nothing passed on
    # The W3C trace context only: baggage from upstream is not handed to other sites.
    TraceContextTextMapPropagator().inject(headers)


def _sites_rule(key: str, value: Any) -> None:
    parse_remote_sites(value)


def _timeout_rule(key: str, value: Any) -> None:
    _check_timeout(value)


@hookimpl
def register_settings() -> list[SettingSpec]:
    """``remote_sites`` (its tokens masked in listings) and ``remote_agent_timeout``, checked
    when written (and by ``datamachine serve`` when they come from the environment)."""
    return [
        SettingSpec(name=REMOTE_SITES_SETTING, type="object", default={},
                    validator=_sites_rule, secret_fields=("token",),
                    description='Sites call_remote_agent may call: {name: {"url": "http://...", '
                                '"token": "dm_..."}}; tokens are masked in listings.'),
        SettingSpec(name=TIMEOUT_SETTING, type="number", default=DEFAULT_TIMEOUT_SECONDS,
                    validator=_timeout_rule,
                    description="Seconds one call_remote_agent request may take (at most "
                                f"{_MAX_TIMEOUT_SECONDS:g} are used)."),
    ]


@hookimpl
def register_tools() -> list[Tool]:
    """The built-in ``call_remote_agent`` tool."""
    return [call_remote_agent]

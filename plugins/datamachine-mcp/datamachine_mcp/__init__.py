"""datamachine-mcp: the tools of MCP servers as datamachine tools.

The setting ``mcp_servers`` names the servers, each either a command to start (stdio) or a URL
(streamable HTTP)::

    {"time": {"command": ["mcp-server-time", "--local-timezone", "UTC"], "env": {}},
     "docs": {"url": "http://127.0.0.1:8000/mcp"}}

At boot (``host_started``) the plugin connects to every server once, lists its tools and
registers each as the tool ``<server>__<tool>`` in ``host.tools``, so a run offers it like any
other tool: its schema is the server's, and every tool budget (``tool_calls``,
``tool_calls_<name>``, a completion policy) counts it. The sessions live on one background
event loop per host (the SDK is async, and a session must be used on the loop that opened it);
``host.close()`` (``host_closing``) ends them, and a stdio server's process with them.

Nothing a server does can crash a run or a boot: a server that fails to start is logged and its
tools are absent; a call that the server answers with an error, a server that died, and a call
that does not answer within the setting ``mcp_call_timeout`` (seconds, default 60, at most
3,600) are failed tool results naming the server, which the model reads.
"""

from __future__ import annotations

import logging
from typing import Any

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine import SettingSpec, hookimpl

__all__ = ["DEFAULT_CALL_TIMEOUT", "MAX_CALL_TIMEOUT", "SEPARATOR", "host_closing",
           "host_started", "register_settings"]

logger = logging.getLogger("datamachine.mcp")

DEFAULT_CALL_TIMEOUT = 60.0
# An hour: a call that may take longer is a job, not a tool call. The bound keeps every value
# a timer can hold (a timer of 10**400 seconds fails every call).
MAX_CALL_TIMEOUT = 3600.0
SEPARATOR = "__"

# Per host: its running servers (host id -> McpServers).
_RUNNING: dict[int, Any] = {}


@hookimpl
def host_started(host: Any) -> None:
    """Connect to the servers of ``mcp_servers`` and register their tools."""
    from datamachine.errors import DataMachineError
    from datamachine_mcp.servers import McpServers, parse_servers

    try:
        configured = host.settings.get("mcp_servers")
        parsed = parse_servers(configured) if configured else {}
    except DataMachineError as exc:
        # Not a boot failure: `datamachine settings set mcp_servers ...` must still run to fix
        # it, and every other tool still works. `serve` refuses to start on it.
        logger.error("datamachine-mcp: no MCP server started: %s", exc)
        return
    if not parsed:
        return
    servers = McpServers(parsed, settings_lookup=host.settings.get)
    _RUNNING[id(host)] = servers
    for tool in servers.start():
        host.tools.register(tool, plugin="datamachine-mcp")


def _servers_rule(key: str, value: Any) -> None:
    from datamachine_mcp.servers import parse_servers

    parse_servers(value, f"Setting {key!r}")


def _timeout_rule(key: str, value: Any) -> None:
    seconds = clock.duration(value)  # None for NaN, infinities and 10**400 (no float holds it)
    if seconds is None or seconds > MAX_CALL_TIMEOUT:
        raise ValueError(f"Setting {key!r} must be a positive number of seconds, at most "
                         f"{MAX_CALL_TIMEOUT:,g}, got {brief_repr(value)}.")


@hookimpl
def register_settings() -> list[SettingSpec]:
    """``mcp_servers`` (its ``env`` and ``headers`` values masked in listings) and
    ``mcp_call_timeout``, checked when written."""
    return [
        SettingSpec(name="mcp_servers", type="object", default=None, validator=_servers_rule,
                    secret_fields=("env", "headers"),
                    description='MCP servers whose tools this host offers: {name: {"command": '
                                '[...], "env": {...}} or {"url": "http://...", "headers": '
                                '{...}}}; env and header values are masked in listings.'),
        SettingSpec(name="mcp_call_timeout", type="number", default=DEFAULT_CALL_TIMEOUT,
                    validator=_timeout_rule,
                    description="Seconds one MCP tool call may take before it fails (at "
                                f"most {MAX_CALL_TIMEOUT:,g})."),
    ]


@hookimpl
def host_closing(host: Any) -> None:
    """Close this host's sessions and stop its stdio servers."""
    servers = _RUNNING.pop(id(host), None)
    if servers is not None:
        servers.close()

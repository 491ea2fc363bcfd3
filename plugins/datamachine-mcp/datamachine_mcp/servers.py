"""One host's MCP servers: their sessions on a background event loop, and their tools.

Why a loop of its own: the SDK's sessions are async and bound to the task and loop that opened
them (anyio cancel scopes), while runs happen on whatever thread and loop the host's callers
use, synchronous runs on a fresh loop each time. So each server gets one long-lived task on this
host's background loop that opens the transport and the session, lists the tools, and then
holds both open until :meth:`McpServers.close`; a tool call is handed to that loop and awaited
from the caller's loop, bounded by ``mcp_call_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents_api import clock
from datamachine.errors import UsageError, first_field_error
from datamachine.tools import Tool
from datamachine_mcp import MAX_CALL_TIMEOUT

__all__ = ["McpServers", "ServerConfig", "parse_servers"]

logger = logging.getLogger("datamachine.mcp")

CALL_TIMEOUT_SETTING = "mcp_call_timeout"
DEFAULT_CALL_TIMEOUT = 60.0
START_TIMEOUT = 30.0
SEPARATOR = "__"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,30}$")


class ServerConfig(BaseModel):
    """One entry of ``mcp_servers``: ``command`` (a list: the program and its arguments) with
    optional ``env``, or ``url`` (a streamable-HTTP endpoint) with optional ``headers``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either 'command' (a list: program and arguments) or 'url'")
        if self.command is not None and not self.command:
            raise ValueError("'command' needs at least the program to run")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError("'url' must be an http(s) URL")
        return self


def parse_servers(value: Any, where: str = "setting 'mcp_servers'") -> dict[str, ServerConfig]:
    """The servers of an ``mcp_servers`` value; a UsageError names the entry and the field."""
    if not isinstance(value, Mapping):
        raise UsageError(f"{where} must map server names to {{'command': [...]}} or "
                         f"{{'url': ...}}, got {type(value).__name__}.")
    servers: dict[str, ServerConfig] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not _NAME.match(name) or SEPARATOR in name:
            raise UsageError(f"{where}: {name!r} is not a server name (letters, digits, '_' "
                             f"and '-', at most 30, without '{SEPARATOR}').")
        try:
            servers[name] = ServerConfig.model_validate(raw)
        except ValidationError as exc:
            field, message, _ = first_field_error(exc)
            raise UsageError(f"{where}[{name!r}].{field or '(entry)'}: {message}.") from None
    return servers


@dataclass
class _Server:
    name: str
    config: ServerConfig
    session: Any = None
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    error: str | None = None
    tools: list[Any] = field(default_factory=list)


class McpServers:
    """The MCP servers of one host. :meth:`start` connects and returns their tools;
    :meth:`close` ends every session (and stdio process)."""

    def __init__(self, servers: Mapping[str, ServerConfig],
                 settings_lookup: Callable[[str], Any] | None = None) -> None:
        self._servers = {name: _Server(name, config) for name, config in servers.items()}
        self._settings_lookup = settings_lookup
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="datamachine-mcp", daemon=True)
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> list[Tool]:
        """Connect to every server (at once) and return the tools of those that answered."""
        self._thread.start()
        pending: dict[str, Future[None]] = {
            name: asyncio.run_coroutine_threadsafe(self._open(server), self._loop)
            for name, server in self._servers.items()}
        tools: list[Tool] = []
        for name, ready in pending.items():
            server = self._servers[name]
            try:
                ready.result(timeout=START_TIMEOUT)
            except Exception as exc:
                server.error = str(exc) or type(exc).__name__
                logger.warning("datamachine-mcp: server %r did not start (%s); its tools are "
                               "left out", name, server.error)
                continue
            tools.extend(self._tool(server, spec) for spec in server.tools)
        return tools

    async def _open(self, server: _Server) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        server.stop = asyncio.Event()
        server.task = self._loop.create_task(self._hold(server, ready))
        await ready

    async def _hold(self, server: _Server, ready: asyncio.Future[None]) -> None:
        """Open the transport and the session, list the tools, and keep both open until
        :meth:`close`: one task enters and leaves them, as the SDK requires."""
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(server.config))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                server.tools = list((await session.list_tools()).tools)
                server.session = session
                ready.set_result(None)
                assert server.stop is not None
                await server.stop.wait()
        except BaseException as exc:
            server.session = None
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception)
                                    else RuntimeError(str(exc)))
            else:
                server.error = str(exc) or type(exc).__name__
                logger.warning("datamachine-mcp: server %r stopped: %s", server.name,
                               server.error)
            if not isinstance(exc, Exception):
                raise

    @staticmethod
    def _transport(config: ServerConfig) -> Any:
        if config.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            return stdio_client(StdioServerParameters(
                command=config.command[0], args=config.command[1:], env=config.env or None))
        from mcp.client.streamable_http import streamable_http_client

        assert config.url is not None
        if config.headers:
            import httpx2  # the SDK's own HTTP client

            return streamable_http_client(
                config.url, http_client=httpx2.AsyncClient(headers=config.headers))
        return streamable_http_client(config.url)

    def close(self) -> None:
        """End every session (a stdio server's process exits with it) and stop the loop."""
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():
            return

        async def stop_all() -> None:
            tasks = []
            for server in self._servers.values():
                if server.stop is not None:
                    server.stop.set()
                if server.task is not None:
                    tasks.append(server.task)
            if tasks:
                await asyncio.wait(tasks, timeout=10)

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(timeout=15)
        except Exception:
            logger.warning("datamachine-mcp: servers did not stop cleanly", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- tools -------------------------------------------------------------------------------
    def call_timeout(self) -> float:
        """Seconds one call may take (setting ``mcp_call_timeout``, default 60, at most
        3,600: a larger value from the environment is cut to it)."""
        value = (self._settings_lookup(CALL_TIMEOUT_SETTING)
                 if self._settings_lookup is not None else None)
        if isinstance(value, int | float) and not isinstance(value, bool) and (
                value > MAX_CALL_TIMEOUT):  # exact for 10**400, which no float holds
            return MAX_CALL_TIMEOUT
        seconds = clock.duration(value)
        return DEFAULT_CALL_TIMEOUT if seconds is None else seconds

    def _tool(self, server: _Server, spec: Any) -> Tool:
        remote = str(spec.name)
        name = f"{server.name}{SEPARATOR}{remote}"

        async def call(**arguments: Any) -> dict[str, Any]:
            return await self.call(server, remote, arguments)

        schema = dict(spec.input_schema or {"type": "object", "properties": {}})
        return Tool(name=_safe(name), description=spec.description or f"{remote} ({server.name})",
                    parameters=schema, function=call,
                    runtime={"mcp_server": server.name, "mcp_tool": remote,
                             "effects": mcp_effects(getattr(spec, "annotations", None))})

    async def call(self, server: _Server, tool: str, arguments: dict[str, Any]
                   ) -> dict[str, Any]:
        """Run ``tool`` on ``server``: its result, or a failed result naming the server."""
        label = f"MCP server '{server.name}'"
        session = server.session
        if session is None or self._closed:
            reason = f" ({server.error})" if server.error else ""
            return _failure(f"{label} is not running{reason}; tool '{tool}' cannot be called.",
                            "mcp_server_unavailable")
        timeout = self.call_timeout()
        pending = asyncio.run_coroutine_threadsafe(session.call_tool(tool, arguments),
                                                   self._loop)
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(pending), timeout)
        except TimeoutError:
            pending.cancel()
            return _failure(f"{label} did not answer tool '{tool}' within {timeout:g} s "
                            f"(setting {CALL_TIMEOUT_SETTING}).", "mcp_timeout")
        except Exception as exc:
            return _failure(f"{label} failed on tool '{tool}': {type(exc).__name__}: {exc}",
                            "mcp_error")
        return _result(result, label, tool)


def _safe(name: str) -> str:
    # Provider-safe tool names: [A-Za-z0-9_-], at most 64 characters.
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def _failure(error: str, error_type: str) -> dict[str, Any]:
    return {"success": False, "error": error, "error_type": error_type}


def _text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else str(block))
    return "\n".join(parts)


def _result(result: Any, label: str, tool: str) -> dict[str, Any]:
    if getattr(result, "is_error", False):
        return _failure(f"{label}, tool '{tool}': {_text(result) or 'the tool failed'}",
                        "mcp_tool_error")
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return {"success": True, "result": structured}
    return {"success": True, "result": _text(result)}


def mcp_effects(annotations: Any) -> str:
    """What an MCP tool does to the world, from its annotations and MCP's own defaults (a tool
    that says nothing may write): ``read`` with ``readOnlyHint``, ``idempotent`` with
    ``idempotentHint``, else ``write``."""
    if annotations is not None:
        if getattr(annotations, "read_only_hint", None) is True:
            return "read"
        if getattr(annotations, "idempotent_hint", None) is True:
            return "idempotent"
    return "write"

"""MCP servers as tool sources, against servers nobody here wrote: the third-party
``mcp-server-time`` over stdio, the SDK's own ``MCPServer`` over streamable HTTP on loopback,
and a stdio server (also the SDK's ``MCPServer``) that crashes or hangs on request."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datamachine_mcp
import pytest

import bootstrap
from datamachine import BudgetSpec, hookimpl
from datamachine.errors import InvalidSetting
from datamachine.host import Host

HERE = Path(__file__).resolve().parent
USER = [{"role": "user", "content": "What time is it in Paris?"}]


def _host(db: Path, servers: dict[str, Any], *plugins: object, **settings: Any) -> Host:
    # The plugin declares mcp_servers; no server starts yet (none is configured).
    first = bootstrap.boot(str(db), plugins=[datamachine_mcp, *plugins], load_entrypoints=False)
    for key, value in settings.items():
        first.settings.set(key, value)
    first.settings.set("mcp_servers", servers)
    first.close()
    return bootstrap.boot(str(db), plugins=[datamachine_mcp, *plugins], load_entrypoints=False)


def _alive_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def marker() -> str:
    return f"DM_MCP_TEST={uuid.uuid4().hex}"


def _time_server(marker: str) -> dict[str, Any]:
    key, value = marker.split("=")
    return {"command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"],
            "env": {key: value}}


def _script(calls: list[dict[str, Any]], answer: str = "done") -> list[dict[str, Any]]:
    return [*({"tool_calls": [call]} for call in calls), {"content": answer}]


# -- mcp-server-time over stdio ----------------------------------------------------------------

def test_a_third_party_stdio_server_s_tools_are_listed_called_and_counted(
    tmp_path: Path, marker: str,
) -> None:
    host = _host(tmp_path / "h.db", {"time": _time_server(marker)})
    try:
        assert {"time__get_current_time", "time__convert_time"} <= set(host.tools.names())
        now = host.tools.get("time__get_current_time")
        assert now is not None
        assert now.parameters["required"] == ["timezone"]
        assert now.plugin == "datamachine-mcp"
        # mcp-server-time annotates its tools readOnlyHint: safe to repeat.
        assert now.effects == "read"
        assert datamachine_mcp.servers.mcp_effects(None) == "write"  # MCP's own default
        assert _alive_with(marker)  # the server runs while the host does

        result = host.run_conversation(USER, [now], "scripted", "m", payload={"script": _script([
            {"name": "time__get_current_time", "parameters": {"timezone": "Europe/Paris"}},
            {"name": "time__get_current_time", "parameters": {"timezone": "Asia/Tokyo"}}])})

        assert result.status == "completed", result.error
        first = result.tool_execution_results[0]["result"]
        assert first["result"]["timezone"] == "Europe/Paris"
        assert "datetime" in first["result"]
        assert result.budgets["tool_calls"]["current"] == 2
    finally:
        host.close()
    assert _alive_with(marker) == []  # host.close() ended the server's process


class PerToolBudget:
    @hookimpl
    def register_budgets(self) -> list[BudgetSpec]:
        return [BudgetSpec(name="tool_calls_time__get_current_time", default=2, min=1, max=10)]


def test_a_budget_stops_a_model_that_keeps_calling_an_mcp_tool(
    tmp_path: Path, marker: str,
) -> None:
    host = _host(tmp_path / "h.db", {"time": _time_server(marker)}, PerToolBudget())
    try:
        now = host.tools.get("time__get_current_time")
        assert now is not None
        zones = ["Europe/Paris", "Asia/Tokyo", "America/Lima", "Africa/Cairo", "UTC"]
        result = host.run_conversation(USER, [now], "scripted", "m", payload={
            "script": _script([{"name": "time__get_current_time",
                                "parameters": {"timezone": zone}} for zone in zones]),
            "final_summary": False})
        assert result.status == "budget_exceeded"
        assert result.budget == "tool_calls_time__get_current_time"
        assert result.budgets["tool_calls_time__get_current_time"]["current"] == 2
        assert len(result.tool_execution_results) == 2
    finally:
        host.close()


# -- a server that crashes, hangs or fails ------------------------------------------------------

def _flaky(tmp_path: Path, marker: str) -> dict[str, Any]:
    key, value = marker.split("=")
    return {"command": [sys.executable, str(HERE / "flaky_server.py")],
            "env": {key: value, "FLAKY_PID_FILE": str(tmp_path / "pids")}}


def test_a_hung_call_times_out_a_failing_one_reads_its_error_and_the_run_goes_on(
    tmp_path: Path, marker: str,
) -> None:
    host = _host(tmp_path / "h.db", {"flaky": _flaky(tmp_path, marker)}, mcp_call_timeout=1.5)
    try:
        tools = [host.tools.get(f"flaky__{name}") for name in ("echo", "hang", "fail")]
        assert all(tools)
        started = time.perf_counter()
        result = host.run_conversation(USER, [t for t in tools if t], "scripted", "m",
                                       payload={"script": _script([
                                           {"name": "flaky__hang", "parameters": {}},
                                           {"name": "flaky__fail",
                                            "parameters": {"reason": "card declined"}},
                                           {"name": "flaky__echo", "parameters": {"text": "hi"}}],
                                           answer="recovered")})
        assert time.perf_counter() - started < 10
        assert (result.status, result.final_content) == ("completed", "recovered")
        hung, failed, echoed = (r["result"] for r in result.tool_execution_results)
        assert hung["error_type"] == "mcp_timeout"
        assert "MCP server 'flaky' did not answer tool 'hang' within 1.5 s" in hung["error"]
        assert failed["error_type"] == "mcp_tool_error"
        assert failed["error"].startswith("MCP server 'flaky', tool 'fail': ")
        assert failed["error"].endswith("card declined")
        # The session survived the timeout (MCPServer wraps a plain value as {"result": ...}).
        assert echoed["result"] == {"result": "echo: hi"}
    finally:
        host.close()
    assert _alive_with(marker) == []


def test_a_server_that_dies_mid_call_is_a_failed_result_and_leaves_no_process(
    tmp_path: Path, marker: str,
) -> None:
    host = _host(tmp_path / "h.db", {"flaky": _flaky(tmp_path, marker)}, mcp_call_timeout=5)
    try:
        tools = [host.tools.get("flaky__crash"), host.tools.get("flaky__echo")]
        result = host.run_conversation(USER, [t for t in tools if t], "scripted", "m",
                                       payload={"script": _script([
                                           {"name": "flaky__crash", "parameters": {}},
                                           {"name": "flaky__echo", "parameters": {"text": "x"}}],
                                           answer="gave up")})
        assert (result.status, result.final_content) == ("completed", "gave up")
        crashed, after = (r["result"] for r in result.tool_execution_results)
        assert crashed["success"] is False
        assert "MCP server 'flaky'" in crashed["error"]
        assert after["success"] is False  # the server is gone: named, not a crash
        assert "MCP server 'flaky'" in after["error"]
    finally:
        host.close()
    assert _alive_with(marker) == []


def test_a_server_that_cannot_start_leaves_its_tools_out_and_the_boot_succeeds(
    tmp_path: Path, marker: str,
) -> None:
    host = _host(tmp_path / "h.db", {
        "time": _time_server(marker),
        "broken": {"command": [sys.executable, "-c", "import sys; sys.exit(2)"]}})
    try:
        names = host.tools.names()
        assert "time__get_current_time" in names
        assert not [name for name in names if name.startswith("broken__")]
    finally:
        host.close()


@pytest.mark.parametrize(("value", "message"), [
    ({"t": {"command": []}}, "'command' needs at least the program"),
    ({"t": {"url": "ftp://x"}}, r"'url' must be an http\(s\) URL"),
    ({"t": {"command": ["x"], "url": "http://x"}}, "either 'command'"),
    ({"a__b": {"command": ["x"]}}, "is not a server name"),
    ({"t": {"command": "mcp-server-time"}}, "command"),
])
def test_bad_server_entries_are_refused_when_written(value: Any, message: str) -> None:
    host = bootstrap.boot(":memory:", plugins=[datamachine_mcp], load_entrypoints=False)
    try:
        with pytest.raises(InvalidSetting, match=message):
            host.settings.set("mcp_servers", value)
    finally:
        host.close()


@pytest.mark.parametrize("value", [10**400, 3601, 0, float("inf")])
def test_a_call_timeout_no_timer_can_hold_is_refused_when_written(value: Any) -> None:
    # 10**400 was accepted, and then every MCP call failed on it.
    host = bootstrap.boot(":memory:", plugins=[datamachine_mcp], load_entrypoints=False)
    try:
        with pytest.raises(InvalidSetting, match="positive number of seconds, at most 3,600"):
            host.settings.set("mcp_call_timeout", value)
    finally:
        host.close()


@pytest.mark.parametrize(("value", "seconds"), [
    (10**400, 3600.0), (1e300, 3600.0), (90, 90.0), ("soon", 60.0), (None, 60.0),
])
def test_the_call_timeout_in_use_is_a_finite_number_of_at_most_an_hour(
        value: Any, seconds: float) -> None:
    # From the environment a value skips the check; the calls must still get a usable timer.
    from datamachine_mcp.servers import McpServers

    assert McpServers({}, settings_lookup=lambda key: value).call_timeout() == seconds


# -- streamable HTTP: the SDK's own server on loopback -----------------------------------------

@pytest.fixture
def http_server() -> Iterator[str]:
    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    runner = uvicorn.Server(uvicorn.Config(server.streamable_http_app(), log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        assert time.monotonic() < deadline, "the MCP HTTP server did not start"
        time.sleep(0.01)  # waiting for a real server thread to come up
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        runner.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_a_streamable_http_server_s_tools_work(tmp_path: Path, http_server: str) -> None:
    host = _host(tmp_path / "h.db", {"calc": {"url": http_server}})
    try:
        add = host.tools.get("calc__add")
        assert add is not None
        result = host.run_conversation(USER, [add], "scripted", "m", payload={"script": _script(
            [{"name": "calc__add", "parameters": {"a": 2, "b": 40}}])})
        assert result.status == "completed", result.error
        value = result.tool_execution_results[0]["result"]["result"]
        assert value in (42, {"result": 42})
    finally:
        host.close()


def test_the_tools_command_lists_mcp_tools(tmp_path: Path, marker: str) -> None:
    from click.testing import CliRunner

    from datamachine.cli import cli

    db = tmp_path / "h.db"
    _host(db, {"time": _time_server(marker)}).close()
    os.environ.pop("DATAMACHINE_LOAD_PLUGINS", None)
    out = CliRunner().invoke(cli, ["--db", str(db), "tools"])
    assert out.exit_code == 0, out.output
    assert "time__get_current_time" in out.output
    assert "datamachine-mcp" in out.output
    assert _alive_with(marker) == []


@pytest.mark.parametrize(("hints", "effects"), [
    ({"readOnlyHint": True}, "read"),
    ({"readOnlyHint": True, "idempotentHint": True}, "read"),
    ({"idempotentHint": True, "destructiveHint": False}, "idempotent"),
    ({"readOnlyHint": False}, "write"),
    ({}, "write"),
])
def test_an_mcp_tool_s_annotations_are_its_effects(hints: dict[str, bool], effects: str) -> None:
    from mcp.types import ToolAnnotations

    assert datamachine_mcp.servers.mcp_effects(ToolAnnotations(**hints)) == effects

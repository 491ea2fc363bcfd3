"""A stdio MCP server (the SDK's own MCPServer) that misbehaves on request.

``echo`` answers; ``crash`` kills the process mid-call; ``hang`` never answers; ``fail``
answers with a tool error. It writes its PID to the file named by ``FLAKY_PID_FILE`` so a test
can check that no process outlives ``host.close()``.
"""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("flaky")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def crash() -> str:
    """Die in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.Event().wait()  # bounded: the client gives up at its timeout
    return "unreachable"


@server.tool()
def fail(reason: str) -> str:
    """Fail with a reason (a tool error the client reads)."""
    raise ToolError(reason)


if __name__ == "__main__":
    pid_file = os.environ.get("FLAKY_PID_FILE")
    if pid_file:
        with open(pid_file, "a") as out:
            out.write(f"{os.getpid()}\n")
    server.run("stdio")

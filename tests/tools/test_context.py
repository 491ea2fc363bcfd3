"""ToolContext: what a tool sees of its run."""

from __future__ import annotations

import bootstrap
from datamachine import ToolContext, tool


def test_tool_context_carries_the_runs_host() -> None:
    seen: list[object] = []

    @tool
    def where(context: ToolContext) -> str:
        """Report the host."""
        seen.append(context.host)
        return "here"

    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        script = [{"tool_calls": [{"name": "where", "parameters": {}}]}, {"content": "done"}]
        host.run_conversation([{"role": "user", "content": "go"}], [where], "scripted", "m",
                              payload={"script": script})
    assert seen == [host]

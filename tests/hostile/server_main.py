"""A real ``/chat`` server in its own process, for the hostile-input suite.

``python -m tests.hostile.server_main DB FD`` boots a host on DB with the installed plugins
(``DATAMACHINE_LOAD_PLUGINS`` narrows them) plus :class:`DirectiveModel` and the ``read_secret``
tool, and serves it with :func:`datamachine.server.app.serve` (what ``datamachine serve`` runs)
on the listening socket FD the test opened, so the port is known before the process starts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import bootstrap
from datamachine.hookspecs import hookimpl
from datamachine.providers.base import ProviderRequest
from datamachine.server.app import serve
from datamachine.tools import Tool, tool


@tool(name="read_secret")
def read_secret() -> dict[str, Any]:
    """Read the site's secret (a tool only some tokens may reach)."""
    return {"success": True, "result": {"secret": "s3cret"}}


@tool(name="approve_me", runtime={"requires_approval": True})
def approve_me() -> dict[str, Any]:
    """Do something a person must approve first."""
    return {"success": True, "result": "approved-tool-ran"}


class DirectiveModel:
    """A model that does what the last user message says, so a test drives the server's tools
    and reads what the run saw without any real model.

    ``call NAME {json}``: call tool NAME with those arguments, then answer with its result.
    ``spend N``: answer reporting N tokens used. ``tools?``: answer with the names of the tools
    offered, as JSON. ``whoami``: answer with the run's caller context and token name, as
    JSON. Anything else: no answer here, so the site's default provider (the embedded
    scripted one, echoing) answers, as on a real site.
    """

    __name__ = "directive_model"

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any] | None:
        last = request.messages[-1]
        if last.get("role") == "tool":
            return {"content": f"tool said: {last.get('content')}"}
        text = str(last.get("content", ""))
        if text.startswith("call "):
            name, _, arguments = text[len("call "):].partition(" ")
            return {"content": "", "tool_calls": [{
                "id": f"call-{request.turn}", "name": name,
                "parameters": json.loads(arguments or "{}")}]}
        if text.startswith("spend "):
            used = int(text[len("spend "):])
            return {"content": "spent", "usage": {"prompt_tokens": used, "completion_tokens": 0,
                                                  "total_tokens": used}}
        if text == "tools?":
            return {"content": json.dumps(sorted(t["name"] for t in request.tools))}
        if text == "whoami":
            return {"content": json.dumps({
                "caller_context": request.payload.get("caller_context"),
                "token_name": request.payload.get("token_name")})}
        return None


class _Tools:
    __name__ = "hostile_tools"

    @hookimpl
    def register_tools(self) -> list[Tool]:
        return [read_secret, approve_me]


def main(argv: list[str]) -> None:
    db, fd = argv[1], int(argv[2])
    host = bootstrap.boot(db_path=db, plugins=[DirectiveModel(), _Tools()])
    serve(host, fd=fd, log_level="info", access_log=False)


if __name__ == "__main__":
    main(sys.argv)

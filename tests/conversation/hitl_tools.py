"""Tools and a plugin the pause-and-resume tests share, also loaded by a second process.

``delete_file`` needs approval; it records each run in a file named by ``HITL_LOG`` (so a test
can count runs made in another process) and in ``RUNS``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datamachine import hookimpl
from datamachine.tools import Tool

RUNS: list[str] = []


def _delete_file(path: str) -> str:
    """Delete a file (needs a person's approval)."""
    RUNS.append(path)
    log = os.environ.get("HITL_LOG")
    if log:
        with Path(log).open("a", encoding="utf-8") as handle:
            handle.write(path + "\n")
    return f"deleted {path}"


def _lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


DELETE = Tool(name="delete_file", description="Delete a file.", function=_delete_file,
              runtime={"requires_approval": True})
LOOKUP = Tool(name="lookup", description="Look something up.", function=_lookup)


class HitlTools:
    """Registers the two tools, as a third-party plugin would."""

    @hookimpl
    def register_tools(self) -> list[Any]:
        return [DELETE, LOOKUP]

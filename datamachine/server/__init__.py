"""The agent-to-agent HTTP server (DESIGN.md section 8): ``POST /chat`` and ``GET /health``.

Importing this package stays cheap: Starlette and uvicorn load only when :func:`create_app` or
:func:`serve` is first used, so the outbound tool can share the caller-context code in
:mod:`datamachine.server.chain` without pulling the web stack into a plain run.

- :mod:`~datamachine.server.site`: the host's ``site_id`` and the ``/chat`` size limit.
- :mod:`~datamachine.server.chain`: caller-context headers, depth and cycle checks.
- :mod:`~datamachine.server.auth`: bearer tokens.
- :mod:`~datamachine.server.schemas`: request bodies.
- :mod:`~datamachine.server.errors`: JSON error responses ``{code, message, data}``.
- :mod:`~datamachine.server.sessions`: one ``/chat`` request as a run on a chat session.
- :mod:`~datamachine.server.app`: the Starlette app and ``serve``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datamachine.server.app import create_app, serve
    from datamachine.server.chain import CallerContext
    from datamachine.server.site import ensure_site_id

__all__ = ["CallerContext", "create_app", "ensure_site_id", "serve"]

_EXPORTS = {
    "create_app": "datamachine.server.app",
    "serve": "datamachine.server.app",
    "CallerContext": "datamachine.server.chain",
    "ensure_site_id": "datamachine.server.site",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'datamachine.server' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

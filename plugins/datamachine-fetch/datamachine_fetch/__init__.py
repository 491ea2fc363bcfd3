"""datamachine-fetch: an HTTP fetch tool for agents, bounded by its own budget.

Agents that browse tend to fetch page after page. This plugin offers the ``fetch_url`` tool and
owns the ``http_fetches`` budget (default 10 per run, clamp [1, 100], setting
``max_http_fetches``) so a host can bound fetching separately from turns and tool calls.

Each ``fetch_url`` call consumes one unit of the run's ``http_fetches`` budget *before* it
touches the network, and refuses to fetch once the budget is spent. The loop checks every budget
after each tool call, so the fetch that reaches the ceiling is the last one: the run stops with
``status="budget_exceeded"`` and ``budget="http_fetches"``.

The tool answers with the HTTP status, the content type, the final URL (after redirects) and at
most the first ``MAX_BYTES`` of the body as text, so one large page cannot flood the model's
context. A 4xx/5xx answer is a failed tool result (the model may try another URL); it still
counts as a fetch.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from datamachine import BudgetSpec, hookimpl
from datamachine.tools import Tool, ToolContext, tool

if TYPE_CHECKING:
    import httpx

__all__ = ["HTTP_FETCHES", "MAX_BYTES", "TIMEOUT_SECONDS", "fetch_url", "register_budgets",
           "register_tools"]

HTTP_FETCHES = BudgetSpec(
    name="http_fetches",
    default=10,
    min=1,
    max=100,
    setting="max_http_fetches",
    description="HTTP fetches by the fetch_url tool in one run.",
)

# The most body text a model receives from one fetch (64 KiB).
MAX_BYTES = 64 * 1024
# Seconds for connecting and for each read; a slow server fails the call, not the run.
TIMEOUT_SECONDS = 15.0
_USER_AGENT = "datamachine-fetch/0.1 (+https://pypi.org/project/datamachine-fetch/)"


@tool(name="fetch_url")
def fetch_url(url: str, context: ToolContext) -> dict[str, Any]:
    """Fetch a web page or API response over HTTP(S) with a GET request.

    Returns the HTTP status, the content type, the final URL and the start of the body as text.
    Each call uses one unit of this run's http_fetches budget, so fetch only what you need.

    Args:
        url: The absolute http:// or https:// URL to fetch.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return {"success": False, "error_type": "invalid_url",
                "error": f"fetch_url needs an absolute http:// or https:// URL, got {url!r}."}

    budget = context.budget(HTTP_FETCHES.name)
    if budget.exceeded():
        return {
            "success": False,
            "error_type": "budget_exceeded",
            "error": (f"The http_fetches budget for this run is spent ({budget.current()} of "
                      f"{budget.ceiling()}); answer with what you have already fetched."),
        }
    # Counted before the request: a fetch that times out still cost the server and the clock.
    budget.increment()
    return _get(url.strip())


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _shared_client() -> httpx.Client:
    # One pooled client per process: building a client loads the TLS trust store (~0.1 s),
    # which would otherwise be paid on every fetch.
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                import httpx  # imported on first fetch, so booting a host stays cheap

                _client = httpx.Client(follow_redirects=True,
                                       headers={"User-Agent": _USER_AGENT})
    return _client


def _get(url: str) -> dict[str, Any]:
    import httpx

    try:
        with _shared_client().stream("GET", url, timeout=TIMEOUT_SECONDS) as response:
            body = bytearray()
            truncated = False
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > MAX_BYTES:
                    truncated = True
                    del body[MAX_BYTES:]
                    break
            encoding = response.encoding or "utf-8"
            status = response.status_code
            reason = response.reason_phrase
            final_url = str(response.url)
            content_type = response.headers.get("content-type", "")
    except httpx.TimeoutException:
        return {"success": False, "error_type": "fetch_timeout",
                "error": f"Fetching {url} timed out after {TIMEOUT_SECONDS:g} seconds."}
    except httpx.HTTPError as exc:
        return {"success": False, "error_type": "fetch_failed",
                "error": f"Fetching {url} failed: {type(exc).__name__}: {exc}"}

    try:
        text = body.decode(encoding, errors="replace")
    except LookupError:  # a charset Python does not know
        text = body.decode("utf-8", errors="replace")
    page = {"url": final_url, "status": status, "content_type": content_type, "text": text,
            "truncated": truncated}
    if status >= 400:
        return {"success": False, "error_type": "http_error", **page,
                "error": f"GET {final_url} answered HTTP {status} {reason}."}
    return {"success": True, "result": page}


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    """The budget this plugin owns."""
    return [HTTP_FETCHES]


@hookimpl
def register_tools() -> list[Tool]:
    """The tools this plugin offers."""
    return [fetch_url]

"""Tools, scripted calls and an event recorder shared by the completion tests."""

from __future__ import annotations

from typing import Any

from datamachine import Tool, ToolContext, tool

REQUEST = "Write up today's notes and file them."
USER = [{"role": "user", "content": REQUEST}]


def call(name: str, call_id: str = "", **parameters: Any) -> dict[str, Any]:
    """One scripted tool call."""
    return {"id": call_id or f"{name}-{sorted(parameters.items())!r}", "name": name,
            "parameters": parameters}


def turn(*calls: dict[str, Any], content: str = "") -> dict[str, Any]:
    """One scripted provider response."""
    return {"content": content, "tool_calls": list(calls)}


def say(content: str) -> dict[str, Any]:
    """A scripted answer without tool calls (a natural completion)."""
    return {"content": content}


class Events:
    """An event sink that keeps every event in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        self.seen.append((event, payload))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [payload for event, payload in self.seen if event == name]

    @property
    def names(self) -> list[str]:
        return [event for event, _ in self.seen]


@tool
def fetch(url: str) -> dict[str, Any]:
    """Fetch a page.

    Args:
        url: The page to fetch.
    """
    return {"title": f"Title of {url}"}


@tool
def save_note(text: str) -> dict[str, Any]:
    """Save a note.

    Args:
        text: The note.
    """
    return {"saved": True, "chars": len(text)}


@tool
def publish(title: str, status: str = "publish", options: dict[str, Any] | None = None,
            fail: bool = False) -> dict[str, Any]:
    """Publish a post.

    Args:
        title: The post title.
        status: publish, draft or pending.
        options: Extra publishing options.
        fail: Make the call fail (for tests).
    """
    if fail:
        return {"success": False, "error": "The site refused the post."}
    if status == "draft":
        return {"id": 7}  # drafts have no public URL
    return {"id": 7, "url": f"https://example.test/{title}"}


@tool
def publish_wrapped(title: str) -> dict[str, Any]:
    """Publish, answering in an envelope with a ``data`` key.

    Args:
        title: The post title.
    """
    return {"success": True, "data": {"url": f"https://example.test/{title}"}}


@tool
def remember_post(post_id: int, context: ToolContext) -> str:
    """Store the post id in the run's engine data.

    Args:
        post_id: The id to store.
    """
    context.engine_data["post_id"] = post_id
    return "stored"


@tool
def broken() -> dict[str, Any]:
    """A tool that always fails."""
    return {"success": False, "error": "Service unavailable."}


def _finish_job() -> str:
    return "job finished"


finish_job = Tool(name="finish_job", description="Mark the job finished.",
                  parameters={"type": "object", "properties": {}}, function=_finish_job,
                  runtime={"completion_signal": "terminal"})


def handler_tool(slug: str) -> Tool:
    """A pipeline handler tool (``handler`` set) named ``post_to_<slug>``."""

    def post(text: str) -> dict[str, Any]:
        return {"posted": True, "handler": slug}

    return Tool(name=f"post_to_{slug}", description=f"Post to {slug}.",
                parameters={"type": "object", "properties": {"text": {"type": "string"}},
                            "required": ["text"]},
                function=post, handler=slug)

"""A small web app that pauses for a person: async Starlette endpoints over one host.

``POST /chat {"session_id"?, "message"}`` runs a chat turn with ``confirmation="pause"``; when
the run needs a person (a tool that needs approval, the session's turn limit) the answer is
``{"status": "awaiting_confirmation", "question": ...}`` and nothing blocks.
``POST /answer {"session_id", "approve"}`` is the person's click, in a later request: it resumes
the same session. The model is a small rule-based stand-in (a ``text_result`` hookimpl), so the
app runs without a network.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from datamachine import (
    SessionAwaitingConfirmation,
    SessionNotPaused,
    hookimpl,
)
from datamachine.conversation.result import ConversationResult
from datamachine.host import Host
from datamachine.providers.base import ProviderRequest
from datamachine.tools import Tool

__all__ = ["RuleModel", "create_app", "make_tools"]


def make_tools(deleted: list[str]) -> list[Tool]:
    """``delete_file`` (needs approval; appends to ``deleted``) and ``lookup``."""

    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"notes on {topic}"

    return [Tool(name="delete_file", description="Delete a file.", function=delete_file,
                 runtime={"requires_approval": True}),
            Tool(name="lookup", description="Look a topic up.", function=lookup)]


class RuleModel:
    """Stands in for a model: "delete X" calls delete_file(X); "research X" looks three parts of
    X up; a tool result is summed up; anything else is echoed."""

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        messages = request.messages
        last = messages[-1]
        users = [m for m in messages if m.get("role") == "user"]
        text = str(users[-1].get("content", "")) if users else ""
        if last.get("role") == "tool":
            looked = sum(1 for m in messages[messages.index(users[-1]):]
                         if m.get("role") == "tool")
            if text.startswith("research ") and looked < 3:
                return self._call("lookup", {"topic": f"{text[9:]}, part {looked + 1}"},
                                  request.turn)
            return {"content": f"Done: {last.get('content')}"}
        if text.startswith("delete "):
            return self._call("delete_file", {"path": text[7:]}, request.turn)
        if text.startswith("research "):
            return self._call("lookup", {"topic": f"{text[9:]}, part 1"}, request.turn)
        return {"content": f"You said: {text}"}

    @staticmethod
    def _call(name: str, parameters: dict[str, Any], turn: int) -> dict[str, Any]:
        return {"content": "", "tool_calls": [
            {"id": f"{name}-{turn}", "name": name, "parameters": parameters}]}


def _question(pending: dict[str, Any]) -> str:
    if pending["kind"] == "tool_approval":
        call = pending["tool_call"]
        return f"Allow {call['name']}({call['parameters']})?"
    return "This conversation reached its turn limit. Continue?"


def _answer(result: ConversationResult) -> JSONResponse:
    body: dict[str, Any] = {"session_id": result.transcript_session_id,
                            "status": result.status, "answer": result.final_content}
    if result.pending is not None:
        body["question"] = _question(result.pending)
    return JSONResponse(body)


def create_app(host: Host, tools: list[Tool]) -> Starlette:
    """The app over ``host``; every run is offered ``tools``."""

    async def chat(request: Request) -> JSONResponse:
        data = await request.json()
        session_id = data.get("session_id") or host.chat_sessions.create().id
        try:
            result = await host.achat(session_id, data["message"], tools,
                                      payload={"confirmation": "pause"})
        except SessionAwaitingConfirmation as exc:
            return JSONResponse({"error": "answer the question first",
                                 "question": _question(exc.pending)}, status_code=409)
        return _answer(result)

    async def answer(request: Request) -> JSONResponse:
        data = await request.json()
        try:
            result = await host.aresume(data["session_id"], bool(data["approve"]), tools=tools)
        except SessionNotPaused as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return _answer(result)

    return Starlette(routes=[Route("/chat", chat, methods=["POST"]),
                             Route("/answer", answer, methods=["POST"])])

"""A site with runs of every kind for the run viewer's tests, served on loopback.

:class:`ViewerModel` is a rule-based stand-in model (a ``text_result`` hookimpl), so the runs
are real runs of the real loop, stored by the real stores:

- "weather": looks up Paris twice (the second call is rejected as a duplicate), then answers;
- "research": searches forever, under budget pressure, until its turn budget stops it;
- "delete": calls ``delete_file``, which needs approval: with ``confirmation="pause"`` the run
  pauses, and the viewer's Approve button resumes it;
- "hostile": answers with HTML and script, which the viewer must show as text;
- "doubt" (made by :func:`doubt_run` for the tests that need it): mails Ada, and the process
  dies right after the mail went out; the run that goes on pauses with the call in doubt.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import bootstrap
from datamachine import ProviderRequest, Tool, hookimpl, tool
from datamachine.host import Host
from datamachine.server.app import create_app
from tests.a2a.live import LiveServer
from tests.exactly_once.crash_tools import CRASH, LEDGER, Crash, send

HOSTILE = ('<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'
           '<b>bold?</b>')
DELETED: list[str] = []


@tool
def lookup_weather(city: str) -> dict[str, Any]:
    """The weather in a city.

    Args:
        city: The city.
    """
    return {"city": city, "temp_c": 14, "sky": "light rain"}


@tool
def search_web(query: str) -> list[str]:
    """Search the web.

    Args:
        query: What to look for.
    """
    return [f"{query}: an overview"]


def _delete_file(path: str) -> str:
    DELETED.append(path)
    return f"deleted {path}"


DELETE_FILE = Tool(name="delete_file", description="Delete a file.", function=_delete_file,
                   runtime={"requires_approval": True})


WIPE_DISK = Tool(name="wipe_disk", description="Wipe the disk.", function=lambda: "wiped",
                 runtime={"requires_approval": True})


class ViewerModel:
    """The stand-in model and the site's tools (see the module docstring)."""

    @hookimpl
    def register_tools(self) -> list[Any]:
        return [lookup_weather, search_web, DELETE_FILE, send]

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        if request.provider == HTTP_PROVIDER:
            return None  # a real HTTP provider answers (see http_run)
        answer = self._answer(request)
        size = sum(len(str(m.get("content", ""))) for m in request.messages)
        answer["usage"] = {"prompt_tokens": 40 + size // 4, "completion_tokens": 25,
                           "total_tokens": 65 + size // 4}
        return answer

    def _answer(self, request: ProviderRequest) -> dict[str, Any]:
        prompt = next(m["content"] for m in request.messages if m["role"] == "user")
        last = request.messages[-1]
        turn = request.turn
        if prompt.startswith("Compare the weather"):
            if turn <= 2:
                return {"content": "Checking Paris.", "tool_calls": [
                    {"id": f"w{turn}", "name": "lookup_weather",
                     "parameters": {"city": "Paris"}}]}
            return {"content": "Paris: 14 °C and light rain."}
        if prompt.startswith("Research"):
            if last["content"].startswith("[BUDGET EXHAUSTED]"):
                return {"content": "I searched three angles; the rest is still open."}
            return {"content": "", "tool_calls": [
                {"id": f"s{turn}", "name": "search_web",
                 "parameters": {"query": f"bicycles part {turn}"}}]}
        if prompt.startswith("Wipe"):  # a tool of the program's own, not the site's
            return {"content": "", "tool_calls": [
                {"id": "w1", "name": "wipe_disk", "parameters": {}}]}
        if prompt.startswith("Mail"):
            if last["role"] == "tool":
                return {"content": f"Done: {last['content']}"}
            return {"content": "", "tool_calls": [
                {"id": "m1", "name": "send", "parameters": {"to": "ada"}}]}
        if prompt.startswith("Delete"):
            if last["role"] == "tool":
                return {"content": f"Done: {last['content']}"}
            return {"content": "I will delete it.", "tool_calls": [
                {"id": "d1", "name": "delete_file", "parameters": {"path": "/tmp/old.log"}}]}
        return {"content": HOSTILE}


@dataclass
class ViewerSite:
    """A booted host with its runs, served with the viewer; ``token``: a viewer token."""

    host: Host
    server: LiveServer
    token: str
    runs: dict[str, str]  # kind -> session id
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, **options: Any) -> httpx.Client:
        """An HTTP client of this site (no redirects followed unless asked), closed with it."""
        options.setdefault("follow_redirects", False)
        made = httpx.Client(base_url=self.url, **options)
        self.clients.append(made)
        return made


HTTP_PROVIDER = "local"


def http_run(host: Host) -> str:
    """A run through the ``openai`` wire provider against a loopback server that is
    overloaded once (503, retried), then looks Oslo up and answers; its session id."""
    from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply, completion

    call = {"id": "o1", "type": "function",
            "function": {"name": "lookup_weather", "arguments": '{"city": "Oslo"}'}}
    server = FakeOpenAIServer().start()
    try:
        server.enqueue(
            Reply(503, {"error": {"message": "The model is overloaded, try again."}}),
            Reply(body=completion("", tool_calls=[call], finish_reason="tool_calls",
                                  usage={"prompt_tokens": 412, "completion_tokens": 19,
                                         "total_tokens": 431})),
            Reply(body=completion("Oslo: 9 °C and clear.",
                                  usage={"prompt_tokens": 468, "completion_tokens": 11,
                                         "total_tokens": 479})))
        from datamachine.providers.openai import OpenAIProvider

        host.providers.register(OpenAIProvider(
            name=HTTP_PROVIDER, base_url=server.url + "/v1", api_key="sk-local",
            sleep=RecordingSleep(), jitter=lambda: 0.0))
        result = host.run_conversation(
            [{"role": "user", "content": "What is the weather in Oslo?"}], [lookup_weather],
            HTTP_PROVIDER, "llama-3.2-3b-instruct", mode="chat",
            payload={"transcript_session_id": "http-run",
                     "model_options": {"temperature": 0.2, "max_tokens": 256}})
    finally:
        server.stop()
    assert result.status == "completed", result.error
    assert result.transcript_session_id is not None
    return result.transcript_session_id


def make_runs(host: Host) -> dict[str, str]:
    """One run of every kind (see the module docstring); kind -> session id."""
    def run(kind: str, prompt: str, **payload: Any) -> str:
        result = host.run_conversation(
            [{"role": "user", "content": prompt}], [lookup_weather, search_web, DELETE_FILE],
            "scripted", "stand-in", mode="chat", max_turns=payload.pop("max_turns", None),
            payload={"transcript_session_id": f"{kind}-run", **payload})
        assert result.transcript_session_id is not None
        return result.transcript_session_id

    return {
        "weather": run("weather", "Compare the weather in Paris and Oslo."),
        "research": run("research", "Research the history of the bicycle.", max_turns=3,
                        budget_pressure=True),
        "paused": run("paused", "Delete the old log file.", confirmation="pause"),
        "hostile": run("hostile", "Say something <i>hostile</i>."),
    }


def doubt_run(host: Host) -> str:
    """A run that died right after its mail went out, then went on with
    ``confirmation="pause"``: it waits with the call in doubt. Its session id."""
    CRASH["after_effect"] = True
    with suppress(Crash):
        host.run_conversation([{"role": "user", "content": "Mail Ada the report."}], [send],
                              "scripted", "stand-in", mode="chat",
                              payload={"transcript_session_id": "doubt-run"})
    assert not CRASH["after_effect"], "the run did not reach its mail"
    host.settings.set("confirmation", "pause")
    try:
        paused = host.continue_conversation("doubt-run", 3, [send])
    finally:
        host.settings.delete("confirmation")
    assert paused.pending is not None
    assert paused.pending["kind"] == "tool_in_doubt"
    return "doubt-run"


@contextmanager
def viewer_site(tmp_path: Path, *, ui_open: bool = False,
                db: str | None = None) -> Iterator[ViewerSite]:
    """Boot, fill and serve a site (on ``db``, else a new SQLite file); stop and close it at
    the end."""
    DELETED.clear()
    LEDGER.clear()
    host = bootstrap.boot(db_path=db or tmp_path / "viewer.db", plugins=[ViewerModel()],
                          load_entrypoints=False)
    try:
        host.settings.set("prices", {"stand-in": {"input": 2.5, "output": 10.0}})
        runs = make_runs(host)
        token = host.tokens.create("alice", scope="viewer")
        server = LiveServer(host)
        server.app.app = create_app(host, ui_open=ui_open)
        server.start()
        site = ViewerSite(host, server, token, runs)
        try:
            yield site
        finally:
            for client in site.clients:
                client.close()
            server.stop()
    finally:
        host.close()


def csrf_of(html: str) -> str:
    """The CSRF token of the first form of a page."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def logged_in(site: ViewerSite) -> httpx.Client:
    """An HTTP client (no redirects followed) with a viewer session."""
    client = site.client()
    page = client.get("/ui/login")
    answer = client.post("/ui/login", data={"token": site.token, "csrf": csrf_of(page.text),
                                            "next": "/ui/"})
    assert answer.status_code == 303, answer.text
    return client

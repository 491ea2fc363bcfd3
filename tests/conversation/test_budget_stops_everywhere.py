"""One way to say "ran out" (DESIGN 22): a stop on a budget the product counts itself is named
with its flag wherever a stop is reported: the `/chat` problem body (``data.flags``), the
command line (the report, exit code 3), the terminal event, OpenTelemetry-visible events, the
run viewer's one-line reason. Driven by a loopback server that always answers 503."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import bootstrap
from datamachine.host import Host
from datamachine.providers.openai import OpenAIProvider
from datamachine.server.ui.present import stop_reason
from tests.a2a.live import LiveServer
from tests.completion.helpers import Events
from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply

TIMEOUT = 30.0


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        # The server asks for a 1 ms wait: a command-line run retries without a long backoff.
        fake.enqueue(*[Reply(503, {"error": {"message": "overloaded"}},
                             headers={"retry-after-ms": "1"})] * 20)
        yield fake


def _loopback(host: Host, server: FakeOpenAIServer) -> None:
    host.providers.register(OpenAIProvider(
        name="loopback", base_url=server.url + "/v1", api_key="sk-test",
        sleep=RecordingSleep(), jitter=lambda: 0.0))


def test_the_chat_endpoint_names_the_budget_in_its_problem_body(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    with bootstrap.boot(db_path=tmp_path / "site.db", load_entrypoints=False) as host:
        _loopback(host, server)
        host.settings.set("provider_max_retries", 1)
        token = host.tokens.create("peer")
        live = LiveServer(host).start()
        try:
            response = httpx.post(f"{live.url}/chat", timeout=TIMEOUT,
                                  headers={"Authorization": f"Bearer {token}"},
                                  json={"message": "hi", "provider": "loopback",
                                        "model": "gpt-test"})
        finally:
            live.stop()
    assert response.status_code == 502
    body = response.json()
    assert body["code"] == "provider_error"
    assert body["data"]["flags"] == ["max_provider_retries_reached"]
    assert body["data"]["budget"] == "provider_retries"
    assert body["data"]["budgets"]["provider_retries"]["current"] == 1
    assert len(server.requests) == 2


def test_the_terminal_event_and_the_viewer_name_the_budget(
    host: Host, server: FakeOpenAIServer
) -> None:
    _loopback(host, server)
    events = Events()
    result = host.run_conversation([{"role": "user", "content": "hi"}], None, "loopback",
                                   "gpt-test", payload={"event_sink": events,
                                                        "budget_ceilings": {
                                                            "provider_retries": 2}})
    [failed] = events.named("failed")
    assert (failed["budget"], failed["flags"]) == ("provider_retries",
                                                   ["max_provider_retries_reached"])
    assert events.names.index("budget_exceeded") < events.names.index("failed")
    assert result.transcript_session_id is not None
    stored = host.transcripts.summary(result.transcript_session_id)
    reason = stop_reason(stored)
    assert reason.startswith("Budget provider_retries spent at 2/2; Error provider_http_error")


def _cli(db: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "datamachine", "--db", str(db), *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "DATAMACHINE_LOAD_PLUGINS": "", **env})


def test_the_command_line_exits_3_and_says_which_budget_ran_out(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    env = {"OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-test",
           "DATAMACHINE_PROVIDER_MAX_RETRIES": "0"}
    piped = _cli(tmp_path / "dm.db", "run", "--provider", "openai", "--model", "gpt-test",
                 "hi", **env)
    assert piped.returncode == 3, piped.stderr
    assert piped.stdout == ""
    assert "budget 'provider_retries' ran out (0/0)" in piped.stderr
    as_json = _cli(tmp_path / "dm.db", "run", "--provider", "openai", "--model", "gpt-test",
                   "--json", "-b", "provider_retries", "2", "hi", **env)
    assert as_json.returncode == 3
    result = json.loads(as_json.stdout)
    assert (result["status"], result["budget"], result["flags"]) == (
        "error", "provider_retries", ["max_provider_retries_reached"])
    assert result["budgets"]["provider_retries"]["ceiling"] == 2  # --budget beats the setting
    assert len(server.requests) == 1 + 3  # no retry at 0, then two


def test_a_clamped_ceiling_is_said_even_when_only_the_answer_is_printed(tmp_path: Path) -> None:
    done = _cli(tmp_path / "dm.db", "run", "--max-turns", "500", "hi")
    assert done.returncode == 0
    assert done.stdout == "echo: hi\n"
    assert ("notice: Budget 'conversation_turns': requested ceiling 500 (from override) is "
            "outside its range [1, 200]; using 200.") in done.stderr

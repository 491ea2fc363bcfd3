"""``datamachine tokens`` and ``datamachine serve`` from the command line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

import bootstrap
from datamachine.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SERVE_START_TIMEOUT = 20.0


def invoke(db: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--db", str(db), *args])
    return result.exit_code, result.output


def test_tokens_create_prints_the_token_once_on_the_last_line(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    code, out = invoke(db, "tokens", "create", "peer-b")
    assert code == 0, out
    token = out.strip().splitlines()[-1]
    assert token.startswith("dm_")
    assert out.count(token) == 1
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        assert host.tokens.verify(token) == "peer-b"
    code, out = invoke(db, "tokens", "create", "peer-b")
    assert code == 2
    assert "already named 'peer-b'" in out


def test_tokens_revoke_and_list(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    token = invoke(db, "tokens", "create", "peer-b")[1].strip().splitlines()[-1]
    invoke(db, "tokens", "create", "peer-c")
    code, out = invoke(db, "tokens", "revoke", "peer-b")
    assert (code, out.strip()) == (0, "Revoked API token 'peer-b'.")
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        assert host.tokens.verify(token) is None
    code, out = invoke(db, "tokens", "revoke", "peer-b")
    assert code == 1
    assert "no active API token is named 'peer-b'" in out
    code, out = invoke(db, "tokens", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["name", "scope", "status", "tools", "site", "created", "(UTC)",
                                "revoked", "(UTC)"]
    assert [line.split()[:3] for line in lines[1:]] == [["peer-b", "chat", "revoked"],
                                                       ["peer-c", "chat", "active"]]
    code, out = invoke(db, "tokens", "list", "--json")
    listed = json.loads(out)
    assert [item["name"] for item in listed] == ["peer-b", "peer-c"]
    assert all("token" not in key for item in listed for key in item)


def test_serve_refuses_a_bad_port(tmp_path: Path) -> None:
    code, out = invoke(tmp_path / "t.db", "serve", "--port", "0")
    assert code == 2
    assert "--port" in out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_answers_chat_with_a_cli_token(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    token = invoke(db, "tokens", "create", "caller")[1].strip().splitlines()[-1]
    process, url = _serve(db)
    try:
        health = httpx.get(f"{url}/health", timeout=1.0)
        assert health.json()["status"] == "ok"
        response = httpx.post(f"{url}/chat", json={"message": "hi"},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
        assert response.status_code == 200
        assert response.json()["final_content"] == "echo: hi"
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0]
    assert f"datamachine site {health.json()['site_id']}: POST /chat on {url}" in output


def _serve(db: Path, *options: str, log_level: str = "warning"
           ) -> tuple[subprocess.Popen[str], str]:
    """``datamachine serve`` on ``db`` and a free port, once its /health answers."""
    port = _free_port()
    env = {**os.environ, "DATAMACHINE_DB": str(db), "DATAMACHINE_LOAD_PLUGINS": ""}
    process = subprocess.Popen(
        [sys.executable, "-m", "datamachine", "serve", "--port", str(port),
         "--log-level", log_level, *options],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVE_START_TIMEOUT
    while True:  # bounded wait for the server to start
        try:
            httpx.get(f"{url}/health", timeout=1.0)
            return process, url
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()  # a server still starting would keep communicate() waiting
                pytest.fail(f"serve did not start: {process.communicate(timeout=10)[0]}")
            time.sleep(0.05)


def test_serve_streams_chat_as_server_sent_events(tmp_path: Path) -> None:
    from httpx_sse import connect_sse

    db = tmp_path / "served.db"
    token = invoke(db, "tokens", "create", "caller")[1].strip().splitlines()[-1]
    process, url = _serve(db)
    try:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(timeout=30.0) as client:
            with connect_sse(client, "POST", f"{url}/chat",
                             json={"message": "hi", "stream": True}, headers=auth) as source:
                assert source.response.headers["content-type"].startswith("text/event-stream")
                events = [(sse.event, sse.json()) for sse in source.iter_sse()]
            # Accept: text/event-stream alone asks for a stream too.
            with connect_sse(client, "POST", f"{url}/chat", json={"message": "again"},
                             headers={**auth, "Accept": "text/event-stream"}) as source:
                second = [sse.event for sse in source.iter_sse()]
            # The checks run before any stream starts: no token is a plain 401 JSON answer.
            refused = client.post(f"{url}/chat", json={"message": "hi", "stream": True})
    finally:
        process.terminate()
        process.communicate(timeout=20)
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "result"
    assert ("text_delta", {"text": "echo: hi"}) in events
    assert {"event": "turn_started"}.items() <= next(
        data for kind, data in events if kind == "event").items()
    result = events[-1][1]
    assert (result["status"], result["final_content"]) == ("completed", "echo: hi")
    assert second[-1] == "result"
    assert refused.status_code == 401
    assert refused.headers["content-type"].startswith("application/")


def test_tokens_create_with_tools_and_a_site(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    code, out = invoke(db, "tokens", "create", "narrow", "--tools", "call_remote_agent",
                       "--site", "beta")
    assert code == 0, out
    token = out.strip().splitlines()[-1]
    code, out = invoke(db, "tokens", "create", "none", "--tools", "")
    assert code == 0, out
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        found = host.tokens.lookup(token)
        assert found is not None
        assert (found.tools, found.site) == (("call_remote_agent",), "beta")
        assert [(t.name, t.tools) for t in host.tokens.list()] == [
            ("narrow", ("call_remote_agent",)), ("none", ())]
    code, out = invoke(db, "tokens", "list")
    assert [line.split()[:5] for line in out.splitlines()[1:]] == [
        ["narrow", "chat", "active", "call_remote_agent", "beta"],
        ["none", "chat", "active", "(none)", "-"]]


def test_tokens_create_refuses_unknown_tools_and_a_bad_site(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    code, out = invoke(db, "tokens", "create", "x", "--tools", "fetch_everything")
    assert code == 2
    assert "fetch_everything" in out
    assert "registered:" in out
    code, out = invoke(db, "tokens", "create", "x", "--site", "no,commas")
    assert code == 2
    assert "site" in out
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        assert host.tokens.list() == []  # nothing half-made

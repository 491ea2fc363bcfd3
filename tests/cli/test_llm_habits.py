"""The command line in the habits of ``llm`` (DESIGN.md 19), through real processes.

Every test starts ``python -m datamachine`` as a user would: stdin piped (``input=``) or a real
pseudo-terminal, and an environment given whole, so a key exported by the developer never
leaks in. One database, prepared once, serves the read-only tests.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pexpect
import pytest

import bootstrap
from datamachine.cli.tables import Column, fit_columns

ROOT = Path(__file__).resolve().parents[2]
# Two ids that share their first characters, and one that does not: real 32-character ids.
AB1 = "ab12" + "0" * 28
AB2 = "ab34" + "1" * 28
CD = "cd56" + "2" * 28
CHAT = "ef78" + "3" * 28
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SECRET = "sk-test-do-not-print-4242"


def _env(home: Path, **extra: str) -> dict[str, str]:
    # No installed plugin unless a test names one: the built-ins are enough, and boot is faster.
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "DATAMACHINE_LOAD_PLUGINS": "",
            **extra}


def dm(db: Path, *args: str, input: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``datamachine --db DB ARGS`` with ``input`` piped to it (so stdin is never a tty)."""
    return subprocess.run([sys.executable, "-m", "datamachine", "--db", str(db), *args],
                          input=input, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=_env(db.parent, **env))


def spawn(db: Path, *args: str, columns: int = 80) -> pexpect.spawn:
    """``datamachine --db DB ARGS`` on a pseudo-terminal ``columns`` wide."""
    return pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(db), *args],
                         cwd=str(ROOT), encoding="utf-8", timeout=30, dimensions=(40, columns),
                         env=_env(db.parent, TERM="xterm", COLUMNS=str(columns)))


def finish(child: pexpect.spawn) -> tuple[int, str]:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None
    return int(child.exitstatus), ANSI.sub("", child.before or "")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four transcripts and a chat session, written once for the read-only tests."""
    path = tmp_path_factory.mktemp("habits") / "h.db"
    spent = [{"content": "", "tool_calls": [{"id": "1", "name": "nope", "parameters": {}}]}]
    with bootstrap.boot(path, load_entrypoints=False) as host:
        for session, text, extra in ((AB1, "Tell me about Pelicans", {}),
                                     (AB2, "and walruses", {"script": spent}),
                                     (CD, "a chat about owls", {})):
            host.run_conversation([{"role": "user", "content": text}], None, "scripted", "m",
                                  "chat" if session == CD else "pipeline",
                                  {"transcript_session_id": session, **extra}, 1)
        host.chat_sessions.create(session_id=CHAT)
    return path


# -- the prompt -----------------------------------------------------------------------------

def test_run_reads_the_prompt_from_piped_stdin_alone_or_before_the_argument(
        tmp_path: Path) -> None:
    fresh = tmp_path / "p.db"
    alone = dm(fresh, "run", "--json", input="hi from a pipe\n")
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["final_content"] == "echo: hi from a pipe\n"

    dash = dm(fresh, "run", "-", "-s", "Be brief.", "-m", "tiny", "--json", input="only stdin")
    assert dash.returncode == 0, dash.stderr
    result = json.loads(dash.stdout)
    assert [(m["role"], m["content"]) for m in result["messages"]] == [
        ("system", "Be brief."), ("user", "only stdin"), ("assistant", "echo: only stdin")]
    assert result["request_metadata"]["model"] == "tiny"

    both = dm(fresh, "run", "Explain this.", "--json", input="def f(): pass\n")
    assert both.returncode == 0, both.stderr
    # As llm joins them: stdin as it came (never stripped), a space, then PROMPT.
    assert json.loads(both.stdout)["final_content"] == "echo: def f(): pass\n Explain this."


@pytest.mark.parametrize(("args", "stdin", "message"), [
    ((), "", "The prompt is empty"),            # nothing piped and no PROMPT
    (("   ",), "", "The prompt is empty"),
    (("hi", "-s", ""), "", "the system prompt is empty"),
])
def test_run_without_a_prompt_is_a_usage_error(tmp_path: Path, args: tuple[str, ...],
                                               stdin: str, message: str) -> None:
    done = dm(tmp_path / "p.db", "run", *args, input=stdin)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()  # one line, as every usage error
    assert message in line
    assert not (tmp_path / "p.db").exists()  # refused before the host booted


def test_run_without_a_prompt_on_a_terminal_says_how_to_give_one(tmp_path: Path) -> None:
    code, out = finish(spawn(tmp_path / "t.db", "run"))
    assert code == 2
    assert "Missing PROMPT" in out
    assert "echo Hello | datamachine run" in out


def test_run_dash_on_a_terminal_reads_what_is_typed_until_ctrl_d(tmp_path: Path) -> None:
    child = spawn(tmp_path / "t.db", "run", "-", "--no-stream")
    child.sendline("typed here")
    child.sendeof()
    code, out = finish(child)
    assert code == 0, out
    assert "final:       echo: typed here" in out


# -- the scripted fallback notice -----------------------------------------------------------

def test_run_with_a_provider_key_but_no_provider_says_so_on_stderr_only(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    keyed = dm(db, "run", "hi", "--json", OPENAI_API_KEY=SECRET)
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["final_content"] == "echo: hi"  # stdout stays JSON
    assert keyed.stderr.splitlines() == [
        "Note: answering with the scripted provider (it echoes; no model is asked) though "
        "OPENAI_API_KEY is set: use --provider openai, or `datamachine settings set "
        "default_provider openai`."]
    assert SECRET not in keyed.stdout + keyed.stderr

    chosen = dm(db, "run", "hi", "--provider", "scripted", OPENAI_API_KEY=SECRET)
    assert (chosen.returncode, chosen.stderr) == (0, "")
    unkeyed = dm(db, "run", "hi")
    assert (unkeyed.returncode, unkeyed.stderr) == (0, "")


def test_the_notice_names_a_plugin_provider_and_chat_gives_it_too(tmp_path: Path) -> None:
    db = tmp_path / "n.db"
    chat = dm(db, "chat", "-s", "You are terse.", "-m", "tiny", input="hello\n",
              DATAMACHINE_LOAD_PLUGINS="datamachine-anthropic", ANTHROPIC_API_KEY=SECRET)
    assert chat.returncode == 0, chat.stderr
    assert "assistant> echo: hello" in chat.stdout
    assert chat.stderr.count("\n") == 1
    assert "ANTHROPIC_API_KEY is set: use --provider anthropic" in chat.stderr
    session = re.search(r"Chat session (\w+)", chat.stdout)
    assert session is not None
    with bootstrap.boot(db, load_entrypoints=False) as host:
        record = host.transcripts.get_transcript(session.group(1))
    assert [(m["role"], m["content"]) for m in record.messages][:2] == [
        ("system", "You are terse."), ("user", "hello")]
    assert record.model == "tiny"


# -- ids by their first characters ----------------------------------------------------------

def test_every_id_argument_takes_a_unique_prefix(db: Path) -> None:
    shown = dm(db, "transcripts", "show", "cd")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"transcript {CD}: completed")

    session = dm(db, "sessions", "show", "ef7")
    assert session.returncode == 0, session.stderr
    assert json.loads(session.stdout)["id"] == CHAT

    chat = dm(db, "chat", "--session", "ef", input="")
    assert chat.returncode == 0, chat.stderr
    assert f"Chat session {CHAT} " in chat.stdout


@pytest.mark.parametrize("command", [("transcripts", "show", "ab"), ("continue", "ab"),
                                     ("resume", "ab", "--approve")])
def test_an_ambiguous_prefix_names_the_candidates_and_exits_2(db: Path,
                                                             command: tuple[str, ...]) -> None:
    done = dm(db, *command)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"Error: Ambiguous transcript id prefix 'ab': it starts {AB1}, {AB2}; give more "
        "characters."]


def test_a_prefix_that_starts_no_id_says_so_and_exits_1(db: Path) -> None:
    transcript = dm(db, "transcripts", "show", "zz")
    assert transcript.returncode == 1
    assert transcript.stderr.startswith("Error: No transcript id starts with 'zz'")
    session = dm(db, "sessions", "show", "zz")
    assert session.returncode == 1
    assert session.stderr.startswith("Error: No chat session id starts with 'zz'")


# -- listing --------------------------------------------------------------------------------

def test_transcripts_list_filters_by_search_status_mode_and_count(db: Path) -> None:
    def ids(*args: str) -> list[str]:
        done = dm(db, "transcripts", "list", *args, "--json")
        assert done.returncode == 0, done.stderr
        return [item["id"] for item in json.loads(done.stdout)]

    assert ids("--search", "PELICAN") == [AB1]
    assert ids("--status", "budget_exceeded", "-n", "5") == [AB2]
    assert ids("--mode", "chat", "--limit", "1") == [CD]
    refused = dm(db, "transcripts", "list", "--status", "finished")
    assert refused.returncode == 2
    assert "'awaiting_confirmation'" in refused.stderr  # the choices are the statuses


def test_piped_listings_print_whole_ids(db: Path) -> None:
    done = dm(db, "transcripts", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["id", "status"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted([AB1, AB2, CD])


def test_a_terminal_80_columns_wide_shows_every_id_whole(db: Path) -> None:
    code, out = finish(spawn(db, "transcripts", "list", columns=80))
    assert code == 0
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert "───" in out  # drawn by rich, not the piped text
    for session in (AB1, AB2, CD):
        assert any(line.startswith(session + " ") for line in lines), out
    assert "budget_exceeded" in out  # what gave way were the optional columns
    assert "messages" not in lines[0]


def test_fit_columns_keeps_whole_columns_and_shrinks_the_others_in_order() -> None:
    columns = [Column("id", 32, 32, "whole"), Column("status", 15, 15, "wrap"),
               Column("count", 8, 8, "wrap"), Column("description", 60, 12, "clip")]
    assert fit_columns(columns, 200) == [32, 15, 8, 60]
    # The description gives way first, down to its floor (its header) ...
    assert fit_columns(columns, 80, ["count"]) == [32, 15, 8, 19]
    # ... then optional columns are left out, the room they free going back ...
    assert fit_columns(columns, 64, ["count"]) == [32, 15, None, 13]
    # ... then long words are cut, never the whole column ...
    assert fit_columns(columns, 59, ["count"]) == [32, 12, None, 11]
    # ... and when nothing else gives, the plain text is printed instead.
    assert fit_columns(columns, 40, ["count"]) is None


# -- models and tools -----------------------------------------------------------------------

class _Models(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        _Models.seen.append((self.path, self.headers.get("Authorization", "")))
        body = json.dumps({"object": "list", "data": [{"id": "small"}, {"id": "big"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_models_lists_providers_endpoints_keys_and_the_default(tmp_path: Path,
                                                               models_server: str) -> None:
    db = tmp_path / "m.db"
    with bootstrap.boot(db, load_entrypoints=False) as host:
        host.settings.set("providers", {"local": {"type": "openai", "base_url": models_server,
                                                  "api_key_env": "LOCAL_KEY"}})
        host.settings.set("default_model", "small")
    done = dm(db, "models", "--json", OPENAI_API_KEY=SECRET)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert (listing["default_provider"], listing["default_provider_from"]) == ("scripted",
                                                                               "default")
    assert (listing["default_model"], listing["default_model_from"]) == ("small", "setting")
    rows = {row["name"]: row for row in listing["providers"]}
    assert set(rows) == {"scripted", "openai", "local"}
    assert rows["scripted"]["default"] is True
    assert rows["openai"]["source"] == "plugin"
    assert (rows["openai"]["api_key_env"], rows["openai"]["api_key_set"]) == ("OPENAI_API_KEY",
                                                                              True)
    assert (rows["local"]["source"], rows["local"]["type"]) == ("setting", "openai")
    assert rows["local"]["base_url"] == models_server
    assert listing["keys"] == {"OPENAI_API_KEY": True, "LOCAL_KEY": False}
    assert rows["local"]["models"] is None  # no network by default
    assert _Models.seen == []
    assert SECRET not in done.stdout + done.stderr

    remote = dm(db, "models", "--remote", LOCAL_KEY="local-secret")
    assert remote.returncode == 0, remote.stderr
    assert "local models: big, small" in remote.stdout
    assert "scripted *" in remote.stdout
    assert "local-secret" not in remote.stdout
    assert _Models.seen == [("/v1/models", "Bearer local-secret")]


def test_tools_json_gives_each_schema_and_name_shows_one(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    listed = dm(db, "tools", "--json")
    assert listed.returncode == 0, listed.stderr
    tools = {row["name"]: row for row in json.loads(listed.stdout)}
    remote = tools["call_remote_agent"]
    assert remote["plugin"] == "datamachine.default_plugins.remote_agent"
    assert remote["description"]
    assert remote["parameters"]["type"] == "object"
    assert "message" in remote["parameters"]["properties"]

    one = dm(db, "tools", "call_remote_agent")
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("call_remote_agent  (plugin: ")
    assert '"properties": {' in one.stdout

    unknown = dm(db, "tools", "nope")
    assert unknown.returncode == 2
    assert "No registered tool is named 'nope' (registered: call_remote_agent)" in unknown.stderr


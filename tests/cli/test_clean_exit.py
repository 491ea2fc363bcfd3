"""No asyncio warnings or tracebacks when ``chat``, ``run`` and ``serve`` end normally
(DESIGN.md 25), through a real terminal and through pipes, against a loopback
OpenAI-compatible server that streams; Ctrl-C on ``serve`` exits 0."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pexpect
import pytest

import bootstrap
from agents_api.drive import drive_sync
from tests.cli.terminal import as_at_a_terminal
from tests.providers.fake_openai import FakeOpenAIServer, Reply, chunk, completion

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("Task was destroyed", "async_generator_athrow", "Traceback", "RuntimeWarning",
         "Exception ignored", "Event loop is closed", "ResourceWarning")


def _env(home: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TERM": "xterm", "COLUMNS": "120",
            "DATAMACHINE_LOAD_PLUGINS": "", "PYTHONWARNINGS": "default"}


def _streamed(server: FakeOpenAIServer, text: str = "Hello there.") -> None:
    words = text.split(" ")
    server.enqueue(Reply(stream=[*(chunk(w + " ") for w in words[:-1]), chunk(words[-1]),
                                 chunk(finish_reason="stop")]))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        with bootstrap.boot(tmp_path / "x.db", load_entrypoints=False) as host:
            host.settings.set("openai_base_url", fake.url + "/v1")
        yield fake


def _spawn(tmp_path: Path, *args: str) -> tuple[pexpect.spawn, io.StringIO]:
    seen = io.StringIO()
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(tmp_path / "x.db"),
                                           *args],
                          cwd=str(ROOT), encoding="utf-8", timeout=30, env=_env(tmp_path),
                          preexec_fn=as_at_a_terminal)
    child.logfile_read = seen
    return child, seen


def _clean(text: str) -> None:
    for word in NOISE:
        assert word not in text, text


def test_drive_sync_closes_async_generators_on_the_loop_that_ran_them() -> None:
    closed: list[str] = []

    async def deltas() -> AsyncIterator[int]:
        try:
            for n in range(10):
                yield n
        finally:
            closed.append("closed")  # an HTTP stream's connection would go back here

    def steps() -> Iterator[object]:
        async def first_two() -> list[int]:
            taken = []
            async for n in deltas():
                taken.append(n)
                if n == 1:
                    break  # the rest is left unread, as after a stream's last event
            return taken

        got = yield first_two()
        return got

    assert drive_sync(steps()) == [0, 1]  # type: ignore[arg-type]
    assert closed == ["closed"]  # before the loop closed, not by the garbage collector later


def test_chat_streaming_on_a_terminal_ends_every_answer_cleanly(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    # After every streamed answer: "Task was destroyed but it is pending! ...
    # async_generator_athrow" (not with --no-stream).
    _streamed(server)
    _streamed(server, "Second answer.")
    child, seen = _spawn(tmp_path, "chat", "--provider", "openai", "-m", "m")
    child.expect("you> ")
    child.sendline("hi")
    child.expect(r"assistant> Hello there\.")
    child.expect(r"turns used: 1/25")
    child.expect("you> ")
    child.sendline("again")
    child.expect(r"Second answer\.")
    child.expect("you> ")
    child.sendeof()
    child.expect("Bye.")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, seen.getvalue()
    _clean(seen.getvalue())


def test_chat_and_run_through_pipes_end_cleanly(tmp_path: Path,
                                                server: FakeOpenAIServer) -> None:
    server.enqueue(Reply(body=completion("piped chat")), Reply(body=completion("piped run")))
    env = {**_env(tmp_path), "TERM": "dumb"}
    chat = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "x.db"),
                           "chat", "--provider", "openai", "-m", "m"], input="hi\n",
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert chat.returncode == 0, chat.stderr
    assert "assistant> piped chat" in chat.stdout
    run = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "x.db"),
                          "run", "hi", "--provider", "openai", "-m", "m"], input="",
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert (run.returncode, run.stdout) == (0, "piped run\n"), run.stderr
    _clean(chat.stderr + chat.stdout + run.stderr)


def test_run_streaming_on_a_terminal_ends_cleanly(tmp_path: Path,
                                                  server: FakeOpenAIServer) -> None:
    _streamed(server, "Streamed to a terminal.")
    child, seen = _spawn(tmp_path, "run", "hi", "--provider", "openai", "-m", "m")
    child.expect(r"status:      completed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, seen.getvalue()
    _clean(seen.getvalue())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_answers_a_streamed_chat_and_ctrl_c_exits_0(tmp_path: Path,
                                                          server: FakeOpenAIServer) -> None:
    made = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "x.db"),
                           "tokens", "create", "caller"], capture_output=True, text=True,
                          cwd=ROOT, env=_env(tmp_path), timeout=60)
    token = made.stdout.strip().splitlines()[-1]
    port = _free_port()
    child, seen = _spawn(tmp_path, "serve", "--port", str(port))
    child.expect("Uvicorn running")
    _streamed(server, "Over the wire.")
    answer = httpx.post(f"http://127.0.0.1:{port}/chat", timeout=30,
                        headers={"Authorization": f"Bearer {token}"},
                        json={"message": "hi", "provider": "openai", "model": "m",
                              "stream": True})
    assert answer.status_code == 200
    assert "event: result" in answer.text
    child.sendintr()
    child.expect("Finished server process")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, seen.getvalue()
    _clean(seen.getvalue())

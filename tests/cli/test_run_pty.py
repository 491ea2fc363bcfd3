"""``datamachine run`` in a real pseudo-terminal: the answer appears as the model writes it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pexpect

import bootstrap
from tests.providers.fake_openai import FakeOpenAIServer, Reply, chunk, completion

ROOT = Path(__file__).resolve().parents[2]


def _slow(server: FakeOpenAIServer) -> None:
    server.enqueue(Reply(stream=[chunk("First "), chunk("words, "), chunk("last "),
                                 chunk("words."), chunk(finish_reason="stop")],
                         chunk_delay=0.4))


def _spawn(db: Path, *args: str) -> pexpect.spawn:
    return pexpect.spawn(sys.executable,
                         ["-m", "datamachine", "--db", str(db), "run", "hi", "--provider",
                          "openai", "--model", "m", *args],
                         cwd=str(ROOT), encoding="utf-8", timeout=30,
                         env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "120"})


def test_run_on_a_terminal_shows_the_first_words_before_the_last_arrive(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with FakeOpenAIServer() as server:
        with bootstrap.boot(db, load_entrypoints=False) as host:
            host.settings.set("openai_base_url", server.url + "/v1")
        _slow(server)
        child = _spawn(db)
        child.expect("First ")
        first = time.perf_counter()
        child.expect(r"last words\.")
        last = time.perf_counter()
        child.expect("status:      completed")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0
    assert last - first > 0.6  # measured: the last words came chunks later than the first


def test_no_stream_prints_the_answer_only_when_it_is_complete(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with FakeOpenAIServer() as server:
        with bootstrap.boot(db, load_entrypoints=False) as host:
            host.settings.set("openai_base_url", server.url + "/v1")
        server.enqueue(Reply(body=completion("First words, last words.")))
        child = _spawn(db, "--no-stream")
        child.expect(r"final:       First words, last words\.")
        child.expect(pexpect.EOF)
        child.close()
        output = child.before or ""
    assert child.exitstatus == 0
    assert "First words, last words." not in output.split("final:")[0]

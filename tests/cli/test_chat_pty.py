"""``datamachine chat`` driven in a real pseudo-terminal, as a person would use it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pexpect
import pytest

import bootstrap
from tests.cli.terminal import as_at_a_terminal

ROOT = Path(__file__).resolve().parents[2]


def spawn(db: Path, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(db), "chat", *args],
                          cwd=str(ROOT), encoding="utf-8", timeout=30,
                          env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "120"},
                          preexec_fn=as_at_a_terminal)
    return child


def _signal_state(pid: int | None) -> str:
    """The signal masks of a process (None: this one), as /proc shows them."""
    status = Path(f"/proc/{pid or 'self'}/status")
    try:
        lines = status.read_text().splitlines()
    except OSError as exc:
        return f"unreadable ({exc})"
    return ", ".join(line.replace("\t", " ") for line in lines
                     if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))


def finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None
    return int(child.exitstatus)


def test_turn_limit_asks_to_continue_then_a_refusal_closes_the_session(tmp_path: Path) -> None:
    child = spawn(tmp_path / "c.db", "--max-turns", "2")
    child.expect(r"limit: 2 turns")
    child.expect("you> ")
    child.sendline("hello")
    child.expect(r"assistant> echo: hello")
    child.expect(r"turns used: 1/2")
    child.expect("you> ")
    child.sendline("again")
    # The answer streams as it arrives; the limit's question comes after it, on its own line.
    child.expect(r"assistant> echo: again\r\n")
    child.expect(r"Turn limit reached \(2/2\)\. Continue this session\? \[y/N\]")
    child.sendline("y")
    child.expect(r"turns used: 0/2")
    child.expect("you> ")
    child.sendline("third")
    child.expect(r"turns used: 1/2")
    child.expect("you> ")
    child.sendline("fourth")
    child.expect(r"Continue this session\?")
    child.sendline("n")
    child.expect("now closed")
    assert finish(child) == 3


def test_ctrl_c_mid_run_exits_cleanly_and_keeps_the_transcript(tmp_path: Path) -> None:
    script = tmp_path / "slow.json"
    script.write_text(json.dumps([{"content": "never arrives", "delay_seconds": 60}]))
    db = tmp_path / "c.db"
    child = spawn(db, "--script", str(script))
    child.expect(r"Chat session (\w+)")
    session_id = child.match.group(1)
    child.expect("you> ")
    child.sendline("take your time")
    child.expect(r"turn 1/25")  # the live progress line: the run is in flight
    child.sendintr()
    try:
        child.expect("Interrupted; finished turns are saved.")
    except pexpect.TIMEOUT:  # say why: a signal blocked or ignored, or a handler that ate it
        raise AssertionError(f"Ctrl-C was not acted on: {_signal_state(child.pid)}; test "
                             f"process: {_signal_state(None)}") from None
    assert finish(child) == 130
    with bootstrap.boot(db, load_entrypoints=False) as host:
        record = host.transcripts.get_transcript(session_id)
        assert [m["content"] for m in record.messages] == ["take your time"]
        assert host.transcripts.locks.held() == []


def test_ctrl_d_at_the_prompt_says_bye(tmp_path: Path) -> None:
    child = spawn(tmp_path / "c.db")
    child.expect("you> ")
    child.sendeof()
    child.expect("Bye.")
    assert finish(child) == 0


@pytest.mark.parametrize("bad", ["ten", "0", "10001"])
def test_bad_max_turns_is_refused_with_exit_2(tmp_path: Path, bad: str) -> None:
    child = spawn(tmp_path / "c.db", "--max-turns", bad)
    child.expect("--max-turns")
    assert finish(child) == 2


def test_tables_are_drawn_with_rich_on_a_terminal(tmp_path: Path) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(tmp_path / "t.db"),
                                           "budgets", "list"],
                          cwd=str(ROOT), encoding="utf-8", timeout=30,
                          env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "150"})
    child.expect("─{20,}")  # rich's rule under the bold header; piped text has none
    child.expect("conversation_turns")
    assert finish(child) == 0

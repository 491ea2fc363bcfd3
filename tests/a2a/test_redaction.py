"""Server paths out of error answers: whole paths only, never the caller's own text."""

from __future__ import annotations

from pathlib import Path

import pytest

import bootstrap
from datamachine.errors import InvalidSetting
from datamachine.server.errors import Redactor
from datamachine.server.throttle import TokenThrottle


def test_only_whole_paths_are_replaced() -> None:
    redact = Redactor(["/srv/site", "/srv/site/data.db", "/usr"])
    assert redact("Cannot write /srv/site/data.db: busy") == "Cannot write <server path>: busy"
    assert redact('in "/srv/site/logs/x"') == 'in "<server path>/logs/x"'
    # Text that merely starts like a path is the conversation's, not the server's.
    assert redact("/usrs and /srv/sites and x/usr") == "/usrs and /srv/sites and x/usr"


def test_a_path_the_caller_sent_is_left_alone() -> None:
    # Otherwise an echo of the caller's text would confirm which of its guesses are paths.
    redact = Redactor(["/root"])
    assert redact("Unknown provider '/root'", caller_text='{"provider": "/root"}') == (
        "Unknown provider '/root'")
    assert redact("Unknown provider '/root'") == "Unknown provider '<server path>'"


def test_short_paths_are_not_redacted() -> None:
    assert Redactor(["/", "/a"])("/ and /a") == "/ and /a"


def test_a_request_refused_for_concurrency_does_not_use_the_rate(tmp_path: Path) -> None:
    with bootstrap.boot(db_path=tmp_path / "t.db", load_entrypoints=False) as host:
        host.settings.set("chat_rate_limit", 2)
        host.settings.set("chat_max_concurrent", 1)
        throttle = TokenThrottle()
        held = throttle.admit(host, "a")
        for _ in range(5):
            with pytest.raises(Exception, match="chat_max_concurrent"):
                throttle.admit(host, "a")
        held.release()
        throttle.admit(host, "a").release()  # the second request of the minute


def test_settings_the_server_needs_are_checked_when_written(tmp_path: Path) -> None:
    with bootstrap.boot(db_path=tmp_path / "t.db", load_entrypoints=False) as host:
        with pytest.raises(InvalidSetting, match="no plugin registers"):
            host.settings.set("default_provider", "nonexistent")
        with pytest.raises(InvalidSetting, match="remote_sites"):
            host.settings.set("remote_sites", {"b": {"url": "ftp://b"}})
        with pytest.raises(InvalidSetting, match="remote_agent_timeout"):
            host.settings.set("remote_agent_timeout", float("inf"))
        for bad in ("no,commas", "alpha\n"):  # a trailing newline would break the header
            with pytest.raises(InvalidSetting, match="site_id"):
                host.settings.set("site_id", bad)
        host.settings.set("default_provider", "scripted")

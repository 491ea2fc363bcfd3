"""The /chat limits and edges that need the server in this process: runs at once per token,
a rate window that opens again (freezegun), streams giving their slot back, and a client that
disconnects mid-body (quiet, no traceback)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from freezegun import freeze_time

import bootstrap
from datamachine.host import Host
from datamachine.server.errors import Problem
from datamachine.server.throttle import TokenThrottle
from tests.a2a.conftest import MakeSite
from tests.a2a.live import GATE_TIMEOUT, Site

TIMEOUT = 30.0


def post(site: Site, body: object, token: str | None = None) -> httpx.Response:
    return httpx.post(f"{site.url}/chat", json=body, timeout=TIMEOUT,
                      headers={"Authorization": f"Bearer {token or site.token}"})


@pytest.fixture
def site(make_site: MakeSite) -> Site:
    return make_site("solo")


def test_a_token_over_its_runs_at_once_gets_429_until_one_ends(site: Site) -> None:
    site.host.settings.set("chat_max_concurrent", 1)
    site.model.hold = threading.Event()
    first: list[httpx.Response] = []
    runner = threading.Thread(target=lambda: first.append(post(site, {"message": "slow"})))
    runner.start()
    try:
        assert site.model.entered.wait(GATE_TIMEOUT)
        refused = post(site, {"message": "also"})
        assert refused.status_code == 429
        assert refused.json()["code"] == "rate_limited"
        assert refused.json()["data"]["limit"] == "chat_max_concurrent"
        assert refused.headers["Retry-After"] == "1"
    finally:
        site.model.hold.set()
        runner.join(TIMEOUT)
    site.model.hold = None
    assert first[0].status_code == 200
    assert post(site, {"message": "now"}).status_code == 200  # the slot came back


def test_a_stream_gives_its_slot_back_when_its_run_ends(site: Site) -> None:
    site.host.settings.set("chat_max_concurrent", 1)
    with httpx.stream("POST", f"{site.url}/chat", json={"message": "hi", "stream": True},
                      headers=site.auth(), timeout=TIMEOUT) as response:
        events = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert events[-1] == "event: result"
    # The run ended before its last event was sent, and released the slot then.
    assert post(site, {"message": "next"}).status_code == 200


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    with bootstrap.boot(db_path=tmp_path / "t.db", load_entrypoints=False) as booted:
        yield booted


def test_the_rate_window_opens_again_a_minute_later(host: Host) -> None:
    host.settings.set("chat_rate_limit", 2)
    throttle = TokenThrottle()
    with freeze_time("2026-11-24 12:00:00") as frozen:
        for _ in range(2):
            throttle.admit(host, "alice").release()
        with pytest.raises(Problem) as refused:
            throttle.admit(host, "alice")
        assert (refused.value.status, refused.value.code) == (429, "rate_limited")
        assert refused.value.headers == {"Retry-After": "60"}
        throttle.admit(host, "bob").release()  # another token has its own window
        frozen.tick(45)
        with pytest.raises(Problem) as still:
            throttle.admit(host, "alice")
        assert still.value.headers == {"Retry-After": "15"}
        frozen.tick(16)
        throttle.admit(host, "alice").release()
    host.settings.set("chat_rate_limit", 0)  # off
    for _ in range(10):
        throttle.admit(host, "alice").release()
    assert throttle.running("alice") == 0


def test_concurrency_slots_are_counted_per_token_and_released_once(host: Host) -> None:
    host.settings.set("chat_max_concurrent", 2)
    throttle = TokenThrottle()
    held = [throttle.admit(host, "alice"), throttle.admit(host, "alice")]
    with pytest.raises(Problem):
        throttle.admit(host, "alice")
    throttle.admit(host, "bob").release()
    held[0].release()
    held[0].release()  # a second release gives nothing back twice
    assert throttle.running("alice") == 1
    held.append(throttle.admit(host, "alice"))
    with pytest.raises(Problem):
        throttle.admit(host, "alice")


class _Watch(logging.Handler):
    """Collects records; sets ``seen`` when one contains ``awaited``."""

    def __init__(self, awaited: str) -> None:
        super().__init__(logging.DEBUG)
        self.awaited = awaited
        self.records: list[logging.LogRecord] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.awaited in record.getMessage():
            self.seen.set()


def test_a_client_gone_mid_body_is_one_quiet_line(site: Site) -> None:
    watch = _Watch("disconnected")
    logger = logging.getLogger("datamachine.server")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(watch)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(watch)
    try:
        with socket.create_connection(("127.0.0.1", site.server.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"POST /chat HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + site.token.encode() + b"\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         b'{"message": "half')
        assert watch.seen.wait(GATE_TIMEOUT)
    finally:
        logger.removeHandler(watch)
        uvicorn_errors.removeHandler(watch)
        logger.setLevel(old_level)
    assert [r for r in watch.records if r.levelno >= logging.WARNING] == []
    assert [r for r in watch.records if r.exc_info] == []
    assert site.model.requests == []

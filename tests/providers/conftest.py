"""Fixtures for provider tests: a loopback Chat Completions server and a sleep that records."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def recording_sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """Every server a test starts is stopped by that test: no thread outlives it."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"

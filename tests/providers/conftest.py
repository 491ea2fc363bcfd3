"""Fixtures for provider tests: a loopback Chat Completions server and a sleep that records."""

from __future__ import annotations

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

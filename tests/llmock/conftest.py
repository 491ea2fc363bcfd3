"""Provider tests against LLMock, a third-party OpenAI- and Anthropic-compatible mock server.

LLMock (PyPI ``llmock``) ships a pytest plugin: its ``llmock`` fixture starts one real server
for the session on a free loopback port (uvicorn in a thread, a real socket), resets it for each
test and points ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` (and dummy keys) at it, which is
exactly what datamachine's providers read. Every request body LLMock received in a test is then
checked against the official ``openai`` package's request types (see
``tests/providers/openai_types.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llmock.pytest_plugin import LLMock

import bootstrap
from datamachine.host import Host
from tests.providers.openai_types import wire_problems


@pytest.fixture
def host(llmock: LLMock) -> Iterator[Host]:
    booted = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    try:
        yield booted
    finally:
        booted.close()


@pytest.fixture
def checked_bodies(llmock: LLMock) -> Iterator[None]:
    """After the test: every Chat Completions body LLMock received is a valid request."""
    yield
    bodies = [record.body for record in llmock.requests
              if record.path.endswith("/chat/completions")]
    assert bodies, "the test sent LLMock no Chat Completions request"
    problems = {index: wire_problems(body) for index, body in enumerate(bodies)}
    assert not any(problems.values()), problems

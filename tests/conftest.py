"""Shared fixtures: a fresh, isolated host per test and no real model traffic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import bootstrap
from datamachine.host import Host


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's settings, database or plugin selection, or a real API key."""
    import os

    for name in list(os.environ):
        if name.startswith("DATAMACHINE_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("DATAMACHINE_DB", str(tmp_path / "default.db"))


@pytest.fixture
def host() -> Iterator[Host]:
    """A host on an in-memory database with no installed plugins."""
    h = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def file_host(tmp_path: Path) -> Iterator[Host]:
    """A host on a real database file (WAL), with no installed plugins."""
    h = bootstrap.boot(db_path=tmp_path / "dm.db", load_entrypoints=False)
    try:
        yield h
    finally:
        h.close()

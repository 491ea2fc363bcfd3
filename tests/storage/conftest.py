"""The storage suite runs on both backends: every test that takes ``backend`` (through ``host``
or ``db_target``) runs once on SQLite and once on PostgreSQL, unless it is marked
``sqlite_only`` (what only SQLite has: files, WAL, ``PRAGMA``s, sqlite-utils)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import bootstrap
from datamachine.host import Host

BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ["sqlite"] if only else list(BACKENDS))


@pytest.fixture
def db_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where a test's database lives: a new file, or a new PostgreSQL database (its URL)."""
    if backend == "postgresql":
        url: str = request.getfixturevalue("pg_url")
        return url
    return str(tmp_path / "dm.db")


@pytest.fixture
def host(backend: str, request: pytest.FixtureRequest) -> Iterator[Host]:
    """A host with no installed plugins: in memory on SQLite, a new database on PostgreSQL."""
    target = request.getfixturevalue("pg_url") if backend == "postgresql" else ":memory:"
    h = bootstrap.boot(db_path=target, load_entrypoints=False)
    try:
        yield h
    finally:
        h.close()

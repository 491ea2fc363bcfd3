"""Shared fixtures: a fresh, isolated host per test and no real model traffic."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import bootstrap
from datamachine.host import Host
from tests.postgres_server import PostgresServer


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's settings, database or plugin selection, or a real API key."""
    for name in list(os.environ):
        if name.startswith("DATAMACHINE_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("DATAMACHINE_DB", str(tmp_path / "default.db"))


BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``backend`` (through ``backend_host`` or ``db_target``) runs on both
    storage backends, unless marked ``sqlite_only``."""
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
def backend_host(backend: str, request: pytest.FixtureRequest) -> Iterator[Host]:
    """A host with no installed plugins: in memory on SQLite, a new database on PostgreSQL."""
    target = request.getfixturevalue("pg_url") if backend == "postgresql" else ":memory:"
    h = bootstrap.boot(db_path=target, load_entrypoints=False)
    try:
        yield h
    finally:
        h.close()


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test session (tests/postgres_server.py), with a migrated
    template database every test's own database is copied from."""
    from datamachine.storage.database import open_handle
    from tests.postgres_server import REQUIRE_ENV, find_bin_dir, start_postgres

    if find_bin_dir() is None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but PostgreSQL is not installed.")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run does).")
    server = start_postgres()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE dm_template")
        open_handle(server.url_for("dm_template")).conn.close()  # migrated once
        yield server
    finally:
        server.stop()


_DATABASES = itertools.count(1)


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A new, migrated PostgreSQL database of this test alone, dropped after it."""
    name = f"dm_test_{next(_DATABASES)}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE dm_template STRATEGY FILE_COPY")
    yield postgres_server.url_for(name)
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")

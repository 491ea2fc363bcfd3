"""The storage suite runs on both backends: its ``host`` is the root conftest's
``backend_host``, so every test here runs once on SQLite and once on PostgreSQL unless it is
marked ``sqlite_only`` (what only SQLite has: files, WAL, ``PRAGMA``s, sqlite-utils)."""

from __future__ import annotations

import pytest

from datamachine.host import Host


@pytest.fixture
def host(backend_host: Host) -> Host:
    """A host with no installed plugins: in memory on SQLite, a new database on PostgreSQL."""
    return backend_host

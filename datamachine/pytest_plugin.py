"""pytest fixtures for applications built on datamachine (loaded by the ``pytest11`` entry
point, so installing datamachine-agents is enough): ``dm_host`` and ``scripted_model``.

``dm_host`` is an isolated host on a temporary database with the setting
``allow_model_requests`` off, so no test reaches a real model by accident; it is also the
default host for the test. ``scripted_model`` is the model of that host: enqueue what it says,
read what it was asked. See docs/testing.md.

The ini option ``datamachine_allow_model_requests = false`` turns real model requests off for
every host of the test session, the default host and ``datamachine`` subprocesses included
(it sets ``DATAMACHINE_ALLOW_MODEL_REQUESTS=false`` for the session).

A test that uses neither fixture never writes into the user's data directory either: for the
whole session ``DATAMACHINE_DB`` names a database in a new temporary directory (removed at
the end), so the default host, ``boot()`` without a ``db_path`` and ``datamachine``
subprocesses all land there, whatever the environment said before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: a pytest run that uses none pays nothing
    from datamachine.host import Host
    from datamachine.testing import ScriptedModel

__all__ = ["dm_host", "scripted_model"]

_INI = "datamachine_allow_model_requests"
_ENV = "DATAMACHINE_ALLOW_MODEL_REQUESTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(_INI, type="bool", default=True,
                  help="datamachine: false refuses real model requests in every host of the "
                       "session (only the scripted provider and text_result hooks answer).")


_DB_ENV = "DATAMACHINE_DB"
# The session's temporary database directory, and DATAMACHINE_DB before the session.
_session_db = pytest.StashKey[tuple[str, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    if not config.getini(_INI) and _ENV not in os.environ:
        os.environ[_ENV] = "false"
    # Under TMPDIR, where pytest keeps its own temporary directories.
    folder = tempfile.mkdtemp(prefix="datamachine-pytest-")
    config.stash[_session_db] = (folder, os.environ.get(_DB_ENV))
    os.environ[_DB_ENV] = os.path.join(folder, "datamachine.db")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, before = config.stash.get(_session_db, ("", None))
    if not folder:
        return
    from datamachine.api import reset_default_host

    reset_default_host()  # its database is about to go
    if before is None:
        os.environ.pop(_DB_ENV, None)
    else:
        os.environ[_DB_ENV] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def dm_host(tmp_path: Path) -> Iterator[Host]:
    """An isolated host on a temporary database: installed plugins loaded (your app's own,
    narrowed by ``DATAMACHINE_LOAD_PLUGINS``), ``allow_model_requests`` off, and the default
    host for the test. Closed after the test."""
    from datamachine.testing import isolated_host

    with isolated_host(tmp_path / "datamachine.db") as host:
        yield host


@pytest.fixture
def scripted_model(dm_host: Host) -> ScriptedModel:
    """The model of ``dm_host``: ``enqueue(response)`` what it answers next (text, a dict
    ``{"content", "tool_calls", "usage"}``, a ``ProviderResponse`` or an exception) and read
    ``requests``: every ``ProviderRequest`` it was given. It answers for any provider."""
    from datamachine.testing import ScriptedModel

    model = ScriptedModel()
    dm_host.pm.register(model, name="scripted_model")
    return model

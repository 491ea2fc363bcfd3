"""Fixtures: a served site with runs (see :mod:`tests.viewer.site`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.viewer.site import ViewerSite, viewer_site


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ViewerSite]:
    """A site whose viewer needs a login, with one run of every kind."""
    with viewer_site(tmp_path) as served:
        yield served


@pytest.fixture
def backend_site(backend: str, tmp_path: Path, request: pytest.FixtureRequest
                 ) -> Iterator[ViewerSite]:
    """The same site on each storage backend (SQLite, PostgreSQL)."""
    db = request.getfixturevalue("pg_url") if backend == "postgresql" else None
    with viewer_site(tmp_path, db=db) as served:
        yield served


@pytest.fixture
def open_site(tmp_path: Path) -> Iterator[ViewerSite]:
    """The same, served with ``--ui-open``."""
    with viewer_site(tmp_path, ui_open=True) as served:
        yield served


# Read at import: every test runs with the DATAMACHINE_* variables cleared (tests/conftest.py).
CHROMIUM = os.environ.get("DATAMACHINE_CHROMIUM", "/usr/bin/chromium")
REQUIRE_BROWSER = bool(os.environ.get("DATAMACHINE_REQUIRE_BROWSER"))
SCREENSHOTS = os.environ.get("DATAMACHINE_SCREENSHOTS")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The system's headless Chromium, driven by Playwright (nothing is downloaded).

    Module-scoped, never longer: Playwright's synchronous API keeps an event loop marked as
    running on the main thread while it is started, and every synchronous run after it would
    refuse to start ("inside a running event loop").

    Skipped when it is missing, unless ``DATAMACHINE_REQUIRE_BROWSER`` is set (``.ci/run``
    installs Debian's ``chromium`` and sets it, so CI fails instead of skipping)."""
    if not Path(CHROMIUM).exists():
        if REQUIRE_BROWSER:
            pytest.fail(f"No Chromium at {CHROMIUM}: install Debian's chromium package (or set "
                        "DATAMACHINE_CHROMIUM).")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the browser tests save their screenshots: ``DATAMACHINE_SCREENSHOTS`` (how the
    ones in docs/images are made), else the test's temporary folder."""
    target = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path / "shots"
    target.mkdir(parents=True, exist_ok=True)
    return target

"""Fixtures: a served site with runs (see :mod:`tests.viewer.site`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.viewer.site import ViewerSite, viewer_site


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ViewerSite]:
    """A site whose viewer needs a login, with one run of every kind."""
    with viewer_site(tmp_path) as served:
        yield served


@pytest.fixture
def open_site(tmp_path: Path) -> Iterator[ViewerSite]:
    """The same, served with ``--ui-open``."""
    with viewer_site(tmp_path, ui_open=True) as served:
        yield served

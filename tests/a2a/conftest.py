"""Fixtures: sites (host + relay model + token + live uvicorn server), each on its own database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.a2a.live import LiveServer, RelayModel, Site, boot_site

MakeSite = Callable[..., Site]
THREAD_EXIT_TIMEOUT = 5.0


@pytest.fixture
def make_site(tmp_path: Path) -> Iterator[MakeSite]:
    """``make_site(name, next_site=None, fail_on=None)`` boots a host and serves it.

    Every server started here is stopped (and every host closed) when the test ends.
    """
    created: list[Site] = []

    def make(name: str, next_site: str | None = None, fail_on: str | None = None) -> Site:
        model = RelayModel(name, next_site, fail_on)
        host, token = boot_site(name, tmp_path / f"{name}.db", model)
        try:
            server = LiveServer(host).start()
        except BaseException:
            host.close()
            raise
        site = Site(name=name, host=host, model=model, token=token, server=server)
        created.append(site)
        return site

    yield make
    failures: list[BaseException] = []
    for site in created:  # all at once, so the servers' shutdown ticks overlap
        site.server.request_stop()
    for site in created:
        try:
            site.server.stop()
        except BaseException as exc:  # keep stopping the others, then report
            failures.append(exc)
        finally:
            site.host.close()
    if failures:
        raise failures[0]


def link(*sites: Site) -> None:
    """Give every site the others in its ``remote_sites`` setting, by name, each with a token
    the other site made for it (``--site``), as operators link two sites."""
    for site in sites:
        site.host.settings.set("remote_sites", {
            other.name: {"url": other.url,
                         "token": other.host.tokens.create(f"site-{site.name}",
                                                           site=site.site_id)}
            for other in sites if other is not site
        })


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """Every server a test starts is stopped by that test: no thread outlives it."""
    before = set(threading.enumerate())
    yield
    # A stopped server's AnyIO worker threads are told to exit when its event loop ends; give
    # them a bounded moment to finish before calling anything a leak.
    deadline = time.monotonic() + THREAD_EXIT_TIMEOUT
    for thread in [t for t in threading.enumerate() if t not in before]:
        thread.join(max(0.0, deadline - time.monotonic()))
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leaked, f"threads left running: {leaked}"


__all__ = ["LiveServer", "MakeSite", "link"]

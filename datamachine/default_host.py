"""The lazily booted host behind the module-level functions (``datamachine.run_conversation``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["get_default_host", "install_default_host", "reset_default_host"]

_lock = threading.Lock()
_host: Host | None = None


def get_default_host() -> Host:
    """Boot the default host on first use (database from ``$DATAMACHINE_DB`` or the data dir)."""
    global _host
    if _host is None:
        with _lock:
            if _host is None:
                from datamachine.booting import boot

                _host = boot()
    return _host


def reset_default_host() -> None:
    """Close and forget the default host; the next module-level call boots a new one from the
    environment (``DATAMACHINE_DB``, ``DATAMACHINE_LOAD_PLUGINS``), e.g. between tests."""
    global _host
    with _lock:
        if _host is not None:
            _host.close()
        _host = None


@contextmanager
def install_default_host(host: Host) -> Iterator[Host]:
    """Make ``host`` the default host for the block (tests: ``datamachine.run_conversation``
    runs on the test's own host); the default host before it is closed first, and none is
    left behind: the next module-level call after the block boots a new one. The caller
    still owns ``host`` and closes it."""
    global _host
    reset_default_host()
    with _lock:
        _host = host
    try:
        yield host
    finally:
        with _lock:
            if _host is host:
                _host = None

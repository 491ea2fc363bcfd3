"""The lazily booted host behind the module-level functions (``datamachine.run_conversation``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["get_default_host", "reset_default_host"]

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

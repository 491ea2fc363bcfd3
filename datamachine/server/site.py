"""Who this host is to other sites, and the limits its ``/chat`` endpoint enforces.

Every host has a ``site_id`` setting, generated the first time the server (or the outbound remote
agent tool) needs it and stored, so it stays the same across restarts: cycle detection compares
site ids carried by the chain, and an id that changed on every boot would never match. A
deployment may pin its own id (``datamachine settings set site_id alpha`` or
``DATAMACHINE_SITE_ID``); it must be a short token without commas, because the chain carries the
ids as one comma-separated header.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

from datamachine.errors import SiteMisconfigured
from datamachine.setting_rules import SITE_ID_PATTERN, SITE_ID_SETTING, check_site_id

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "MAX_REQUEST_BYTES_SETTING",
    "SITE_ID_PATTERN",
    "SITE_ID_SETTING",
    "bound_host",
    "check_site",
    "check_site_id",
    "current_host",
    "ensure_site_id",
    "max_request_bytes",
]

MAX_REQUEST_BYTES_SETTING = "max_request_bytes"
DEFAULT_MAX_REQUEST_BYTES = 1_048_576


def ensure_site_id(host: Host) -> str:
    """This host's site id, generating and storing one (a uuid4 hex) on first use.

    The read and the write are one transaction (``settings.setdefault``), so two processes
    starting on one database agree on a single id instead of each storing their own.
    """
    current = host.settings.get(SITE_ID_SETTING)
    if current is None:
        current = host.settings.setdefault(SITE_ID_SETTING, uuid.uuid4().hex)
    return check_site_id(current)


def max_request_bytes(host: Host) -> int:
    """The largest ``/chat`` body accepted: the setting ``max_request_bytes``, default 1 MiB
    (checked by the same rule as ``settings set``: a whole number from 1 to 1 GiB)."""
    from datamachine.setting_rules import validate_known_setting

    value = host.settings.get(MAX_REQUEST_BYTES_SETTING, DEFAULT_MAX_REQUEST_BYTES)
    validate_known_setting(MAX_REQUEST_BYTES_SETTING, value)
    return int(value)


def check_site(host: Host) -> None:
    """Raise :class:`SiteMisconfigured` naming the first setting a run on this site would fail
    on (DESIGN.md 20): a stored or environment value the host's validator refuses (a bad site
    id or request limit, a ``chat_tools`` naming a tool no plugin registers, ...).

    ``datamachine serve`` calls it before listening; ``/chat`` on every request (the answer is
    cached until a setting or the environment changes).
    """
    problems = host.settings.problems()
    if problems:
        key, why = problems[0]
        raise SiteMisconfigured(f"Setting {key!r} cannot be used: {why}", setting=key)


# The host whose run is executing in this context. Tools are registered per process, not per host,
# and ``ToolContext`` does not carry the host, so the server binds it around each run for tools
# (``call_remote_agent``) that need the host's settings.
_ACTIVE_HOST: ContextVar[Host | None] = ContextVar("datamachine_active_host", default=None)


@contextmanager
def bound_host(host: Host) -> Iterator[Host]:
    """Make ``host`` the :func:`current_host` for the code run inside the block."""
    token = _ACTIVE_HOST.set(host)
    try:
        yield host
    finally:
        _ACTIVE_HOST.reset(token)


def current_host() -> Host | None:
    """The host bound with :func:`bound_host` in this context, else None."""
    return _ACTIVE_HOST.get()

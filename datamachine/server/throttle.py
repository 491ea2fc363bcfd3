"""Per-token limits on ``/chat`` (DESIGN.md 20): requests per minute and runs at once.

The rate is the setting ``chat_rate_limit`` (requests per minute per token, default 120, 0 =
off), kept by the ``limits`` library's moving window in memory; runs at once is
``chat_max_concurrent`` (default 8, 0 = off), counted here. Over either, the answer is 429
``rate_limited`` with ``Retry-After``. Both are read per request, so a change takes effect at
once.

Both counts live in this server process: several ``serve`` processes on one database each
allow the full rate. Memory is bounded by the number of tokens (a moving window keeps at most
``chat_rate_limit`` timestamps per token, and a token's concurrency entry goes when its last
run ends).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

from datamachine.server.errors import Problem

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["DEFAULT_CHAT_MAX_CONCURRENT", "DEFAULT_CHAT_RATE_LIMIT", "RATE_LIMITED_CODE",
           "Slot", "TokenThrottle"]

DEFAULT_CHAT_RATE_LIMIT = 120
DEFAULT_CHAT_MAX_CONCURRENT = 8
RATE_LIMITED_CODE = "rate_limited"
# A run's length is unknown; a client told to wait a second and try again is not hammering.
_CONCURRENT_RETRY_AFTER = 1


class Slot:
    """One admitted request's place among its token's running requests; :meth:`release`
    when the run ends (idempotent, from any thread)."""

    __slots__ = ("_released", "_throttle", "token_name")

    def __init__(self, throttle: TokenThrottle | None, token_name: str) -> None:
        self._throttle = throttle
        self.token_name = token_name
        self._released = throttle is None

    def release(self) -> None:
        """Give the slot back (the second call does nothing)."""
        if not self._released:
            self._released = True
            assert self._throttle is not None
            self._throttle.release(self.token_name)


class TokenThrottle:
    """The rate and concurrency limits of one server, per token name."""

    def __init__(self) -> None:
        from limits import storage, strategies

        self._storage = storage.MemoryStorage()
        self._window = strategies.MovingWindowRateLimiter(self._storage)
        self._items: dict[int, Any] = {}
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, host: Host, token_name: str) -> Slot:
        """A :class:`Slot` for a request by ``token_name``, or a 429 :class:`Problem`."""
        per_minute = host.settings.get("chat_rate_limit", DEFAULT_CHAT_RATE_LIMIT)
        at_once = host.settings.get("chat_max_concurrent", DEFAULT_CHAT_MAX_CONCURRENT)
        slot = Slot(None, token_name)
        if at_once:
            with self._lock:
                running = self._running.get(token_name, 0)
                if running >= at_once:
                    raise _limited(
                        f"This token already has {running} requests running (setting "
                        f"'chat_max_concurrent': {at_once}); wait for one to finish.",
                        _CONCURRENT_RETRY_AFTER, {"limit": "chat_max_concurrent",
                                                  "max": at_once})
                self._running[token_name] = running + 1
            slot = Slot(self, token_name)
        # Counted only for a request that got a slot: one refused for concurrency has not
        # used the rate window (and a refused rate gives its slot back).
        if per_minute:
            try:
                self._count_request(token_name, per_minute)
            except BaseException:
                slot.release()
                raise
        return slot

    def release(self, token_name: str) -> None:
        """One of ``token_name``'s runs ended."""
        with self._lock:
            left = self._running.get(token_name, 1) - 1
            if left > 0:
                self._running[token_name] = left
            else:
                self._running.pop(token_name, None)

    def running(self, token_name: str) -> int:
        """How many of ``token_name``'s requests hold a slot now."""
        with self._lock:
            return self._running.get(token_name, 0)

    def _count_request(self, token_name: str, per_minute: int) -> None:
        from limits import RateLimitItemPerMinute

        item = self._items.get(per_minute)
        if item is None:
            if len(self._items) >= 16:  # the setting changed many times: keep the map small
                self._items.clear()
            item = self._items[per_minute] = RateLimitItemPerMinute(per_minute)
        if self._window.hit(item, "chat", token_name):
            return
        reset_at = self._window.get_window_stats(item, "chat", token_name).reset_time
        wait = max(1, math.ceil(reset_at - time.time()))
        raise _limited(
            f"This token sent more than {per_minute} requests in a minute (setting "
            f"'chat_rate_limit'); try again in {wait} s.",
            wait, {"limit": "chat_rate_limit", "per_minute": per_minute})


def _limited(message: str, retry_after: int, data: dict[str, Any]) -> Problem:
    return Problem(429, RATE_LIMITED_CODE, message, {**data, "retry_after": retry_after},
                   headers={"Retry-After": str(retry_after)})

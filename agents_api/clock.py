"""The one clock every timestamp and wall-clock rail reads.

Both functions look up ``time.monotonic`` / ``time.time`` at call time rather than binding them at
import, so ``freezegun`` (which swaps the ``time`` module's attributes) moves every budget and
every stored timestamp together, and tests never have to sleep.
"""

from __future__ import annotations

import time

__all__ = ["monotonic", "now"]


def monotonic() -> float:
    """Seconds on a monotonic clock; used for elapsed time and wall-clock rails."""
    return time.monotonic()


def now() -> float:
    """Seconds since the epoch; used for stored timestamps and lock expiry."""
    return time.time()

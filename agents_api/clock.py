"""The one clock every timestamp and wall-clock rail reads.

Both functions look up ``time.monotonic`` / ``time.time`` at call time rather than binding them at
import, so ``freezegun`` (which swaps the ``time`` module's attributes) moves every budget and
every stored timestamp together, and tests never have to sleep.
"""

from __future__ import annotations

import math
import time

__all__ = ["duration", "monotonic", "now"]


def monotonic() -> float:
    """Seconds on a monotonic clock; used for elapsed time and wall-clock rails."""
    return time.monotonic()


def now() -> float:
    """Seconds since the epoch; used for stored timestamps and lock expiry."""
    return time.time()


def duration(value: object, *, allow_zero: bool = False) -> float | None:
    """``value`` as a number of seconds a clock can count (a time rail, a timeout), else None.

    A caller's duration must be a real number: not a bool, not NaN or an infinity (a rail that
    compares false against every clock reading never fires), not below zero (nor zero unless
    ``allow_zero``), and not an integer too large for a float (``float(10**400)`` raises
    ``OverflowError`` deep inside a run). Every check of a duration reads this one rule.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        return None
    return seconds

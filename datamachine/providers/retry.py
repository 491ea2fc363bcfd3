"""How a provider retries: :class:`RetryPolicy` (light: a provider is built at boot, its
transport on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datamachine.errors import UsageError

__all__ = ["DEFAULT_MAX_RETRIES", "RetryPolicy", "check_max_retries"]

DEFAULT_MAX_RETRIES = 3


def check_max_retries(where: str, value: Any) -> int:
    """``value`` as a retry count (an integer from 0 to 10), else a UsageError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise UsageError(f"{where} must be an integer from 0 to 10 (retries after the first "
                         f"request), got {value!r}.")
    return value


@dataclass(slots=True)
class RetryPolicy:
    """How a provider retries: ``max_retries`` after the first request (None: the host setting
    ``provider_max_retries``, default 3), the backoff, and the longest wait it accepts."""

    max_retries: int | None = None
    backoff_base: float = 0.5
    backoff_max: float = 20.0
    max_retry_wait: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries is not None:
            check_max_retries("max_retries", self.max_retries)
        if self.backoff_base < 0 or self.backoff_max < 0 or self.max_retry_wait < 0:
            raise UsageError("backoff_base, backoff_max and max_retry_wait must not be negative.")

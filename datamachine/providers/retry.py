"""How a provider retries: :class:`RetryPolicy` (light: a provider is built at boot, its
transport on first use)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datamachine.errors import UsageError
from datamachine.registry import BudgetSpec, IterationBudgetRegistry, validate_budget_value

__all__ = ["DEFAULT_MAX_RETRIES", "RetryPolicy", "check_max_retries", "outside_run_retries",
           "retries_spec"]


def retries_spec() -> BudgetSpec:
    """The built-in ``provider_retries`` budget's registration: the one home of its default
    and range (a provider used outside a run has no host registry to ask)."""
    from datamachine.budgets_builtin import BUILTIN_BUDGETS, PROVIDER_RETRIES

    return next(spec for spec in BUILTIN_BUDGETS if spec.name == PROVIDER_RETRIES)


DEFAULT_MAX_RETRIES: int = retries_spec().default or 0


def check_max_retries(where: str, value: Any) -> int:
    """``value`` as a retry count: a whole number (0 or more, at most a count budget's
    10,000), else an InvalidBudgetValue (a UsageError) naming ``where``. Not clamped here: a
    run clamps it to the ``provider_retries`` budget's range (and says so); a provider used
    outside a run retries what it was built with."""
    return validate_budget_value(where, value, minimum=0)


_BUILTIN: list[IterationBudgetRegistry] = []


def outside_run_retries(settings: Callable[[str], Any] | None) -> int:
    """The retries of a request made outside a run (a provider called directly): the
    ``provider_retries`` setting read through ``settings``, else its default, clamped to the
    built-in registration's range by the registry, as a run would."""
    if not _BUILTIN:
        registry = IterationBudgetRegistry()
        registry.register(retries_spec())
        _BUILTIN.append(registry)
    return _BUILTIN[0].resolve(retries_spec().name, settings=settings).ceiling


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

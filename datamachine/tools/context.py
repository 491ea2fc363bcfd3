"""What a tool function sees of its run: :class:`ToolContext`.

A tool that declares a ``context`` parameter gets one of these per call. It exposes the run's
payload (runtime objects already removed, so a tool can never reach the transcript lock or the
event sink), the mode and turn, the run's engine data (which the tool may update), and the
run's named budgets, so an extension tool can consume its own budget and the loop can stop the
run when it is spent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, MutableMapping
from types import MappingProxyType
from typing import Any

from agents_api import IterationBudget

__all__ = ["ToolContext", "idempotency_key"]

BudgetFactory = Callable[[str], IterationBudget]


def idempotency_key(session_id: str | None, run_id: str, turn: int, call_id: str,
                    tool_name: str) -> str:
    """The key of one call: the session, the run (a random id each run draws: a run that
    died is not counted, so the next one's turns and a provider's made-up call ids repeat
    its own), the turn, the call id and the tool, hashed to a short ASCII string that any
    service's idempotency header takes. A call run again after a crash is given the key its
    intent stored, never a new one."""
    seed = f"{session_id or ''}\x1f{run_id}\x1f{turn}\x1f{call_id}\x1f{tool_name}"
    return "dm-" + hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


class ToolContext:
    """The run as one tool call sees it.

    ``payload`` is read-only; ``mode`` is the run's mode label (``"chat"``, or
    ``"cluckin,chat"`` for a multi-mode run) and ``modes`` the same as a tuple; ``turn`` is the
    provider turn that asked for this call; ``engine_data`` is the run's mutable engine data
    (writes are kept and reach the job when the run ends). ``budget(name)`` returns the run's
    budget of that name, creating it from the host's budget registry on first use and adding it
    to the run's budgets so the loop checks it after this call. ``idempotency_key`` is the
    key to hand a service downstream so it does the work once however often it is asked.
    """

    __slots__ = ("_budget_factory", "_budgets", "_key", "_run_id", "engine_data", "host",
                 "mode", "modes", "payload", "session_id", "tool_call_id", "tool_name", "turn")

    def __init__(
        self,
        *,
        payload: Mapping[str, Any],
        mode: str,
        turn: int,
        engine_data: dict[str, Any],
        budgets: MutableMapping[str, IterationBudget],
        budget_factory: BudgetFactory,
        modes: tuple[str, ...] | None = None,
        tool_name: str = "",
        tool_call_id: str = "",
        session_id: str | None = None,
        host: Any = None,
        idempotency_key: str | None = None,
        run_id: str = "",
    ) -> None:
        # The executor hands one read-only view to every call; wrap anything else once here.
        self.payload: Mapping[str, Any] = (
            payload if isinstance(payload, MappingProxyType) else MappingProxyType(dict(payload))
        )
        self.mode = mode
        self.modes = modes if modes is not None else tuple(
            part.strip() for part in mode.split(",") if part.strip())
        self.turn = turn
        self.engine_data = engine_data
        self.tool_name = tool_name
        self.tool_call_id = tool_call_id
        self.session_id = session_id
        # The run's host (its settings, stores, providers), or None outside a host run.
        self.host = host
        self._budgets = budgets
        self._budget_factory = budget_factory
        self._key = idempotency_key
        self._run_id = run_id

    def budget(self, name: str) -> IterationBudget:
        """The run's budget ``name``; call ``increment()`` on it for each unit of work.

        The first call creates it through the host's registry (ceiling from the override,
        setting or default, clamped) and registers it with the run; later calls, including
        from other tools, get the same object.
        """
        existing = self._budgets.get(name)
        if existing is not None:
            return existing
        created = self._budget_factory(name)
        # setdefault: if something else added it meanwhile, everyone shares that one.
        return self._budgets.setdefault(name, created)

    @property
    def idempotency_key(self) -> str:
        """A non-empty key of this call, the same for every attempt of it (a run that goes on
        after a crash asks again with the key its intent stored) and different for another
        call: derived from the session, the run, the turn and the call id. Send it where the
        service takes one (an ``Idempotency-Key`` header, a request id)."""
        if self._key is None:
            self._key = idempotency_key(self.session_id, self._run_id, self.turn,
                                        self.tool_call_id, self.tool_name)
        return self._key

    def __repr__(self) -> str:
        return (f"ToolContext(tool_name={self.tool_name!r}, mode={self.mode!r}, "
                f"turn={self.turn}, budgets={sorted(self._budgets)})")

"""The loop guard (DESIGN.md 23): a model that repeats itself is caught as it happens, told,
has the repeated tool taken away, and is stopped with a reason, counted by the budget
``stuck_turns``. What a turn looks like to the signals (:mod:`.signals`), the ladder a run
climbs (:mod:`.ladder`), and the run's guard (:mod:`.guard`)."""

from datamachine.loop_guard.signals import GuardCall, GuardTurn

__all__ = ["GuardCall", "GuardTurn"]

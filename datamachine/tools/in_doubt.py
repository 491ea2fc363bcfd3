"""Calls whose outcome nobody stored: what a run that goes on does with them (DESIGN.md 24).

A run that died between an effectful call's intent and its stored result leaves the call
unsettled. The run that goes on from the transcript hands every such call to its executor
first, before the model is asked anything, with an :class:`InDoubt` plan:

- an ``idempotent`` call (not approved by a person) runs again with the key its intent stored,
  so the service downstream does the work once;
- a ``write`` call, or any call a person had approved, is *in doubt*: the
  ``reconcile_tool_call`` hook is asked first (a result settles it without running it), then
  a person (``confirmation="pause"`` pauses the run with ``pending.kind="tool_in_doubt"``;
  ``"ask"`` asks ``confirm_continuation``), and with nobody to ask the call is recorded as
  failed and in doubt, not repeated, so the model is told.

A person's answer arrives as the executor's ``approved_call`` (run it again),
``declined_call`` (record it as not done) or :attr:`InDoubt.resolved` (what happened, from
``host.resolve``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from datamachine.storage.tool_intents import Intent
from datamachine.tools.definition import Tool
from datamachine.tools.results import failed_result, rejected_result

__all__ = ["IN_DOUBT", "InDoubt", "in_doubt_failure", "not_done", "waiting_calls"]

# The error_type of a call recorded as in doubt (nobody could be asked).
IN_DOUBT = "tool_in_doubt"
# The error_type of an in-doubt call a person recorded as not done.
NOT_DONE = "tool_not_done"


@dataclass
class InDoubt:
    """The unsettled calls a run goes on with (see the module docstring).

    ``intents``: in the order they were stored; ``tools``: tools the run does not offer but an
    unsettled call needs (the host's, by name); ``resolved``: call id -> what a person said
    happened (``host.resolve``). Calls are found by id; a turn whose calls shared an id (a
    provider that numbers them "0" every time) gives them back in order.
    """

    intents: list[Intent]
    tools: dict[str, Tool] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)
    _waiting: dict[str, deque[Intent]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._waiting = {}
        for intent in self.intents:
            self._waiting.setdefault(intent.call_id, deque()).append(intent)

    def waits(self, call_id: str) -> bool:
        """Whether a call of this id is still unsettled here."""
        return call_id in self._waiting

    def take(self, call_id: str) -> Intent:
        """The first unsettled call of this id, taken out (the executor handles it now)."""
        found = self._waiting[call_id]
        intent = found.popleft()
        if not found:
            del self._waiting[call_id]
        return intent

    def call_ids(self) -> list[str]:
        """The ids of the calls still unsettled, in order."""
        return [intent.call_id for intent in self.intents if intent.call_id in self._waiting]


def waiting_calls(intents: list[Intent], waiting: tuple[dict[str, Any], ...] = ()
                  ) -> tuple[dict[str, Any], ...]:
    """The calls a run goes on with: the unsettled ones first, then ``waiting`` (a paused
    run's calls that never started) that are not among them."""
    ids = {intent.call_id for intent in intents}
    return (*(intent.call() for intent in intents),
            *(call for call in waiting if str(call.get("id") or "") not in ids))


def in_doubt_failure(intent: Intent, why: str = "nobody could be asked") -> dict[str, Any]:
    """The result of an in-doubt call that was not run again: the model reads it."""
    return failed_result(
        intent.tool_name, dict(intent.arguments),
        f"Tool '{intent.tool_name}' may or may not have run: the run was interrupted after "
        "the call started and before its result was stored, so its outcome is in doubt. It "
        f"was not run again ({why}). Tell the user, and check before asking for it again.",
        IN_DOUBT, idempotency_key=intent.idempotency_key)


def not_done(intent: Intent) -> dict[str, Any]:
    """The result of an in-doubt call a person recorded as not done."""
    return rejected_result(
        intent.tool_name, dict(intent.arguments),
        f"Tool '{intent.tool_name}' was not done: the run was interrupted during the call, "
        "and a person recorded that it did not happen and was not to be run again. Continue "
        "without it, or explain to the user what you wanted to do.", NOT_DONE)

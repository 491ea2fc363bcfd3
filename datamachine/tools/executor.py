"""Running one tool call for the loop: :class:`ToolExecutor`.

The generic loop hands every tool call to ``tool_executor(tool_call, context)``. This executor
is the product's answer: it rejects a call that already succeeded (duplicates), then a call the
run's runtime rules forbid, then checks the arguments against the tool's schema, and only then
runs the tool, sync or async. Every way a call can go wrong (unknown tool, bad arguments, a
rejection, a tool that raises) becomes a failed tool result the model can read and recover from;
none of them ends the run.

One executor serves one run: it keeps that run's transcript index (so checks stay cheap as the
transcript grows), its rule state and its engine data.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import Any

from agents_api import IterationBudget, Message, Pause
from agents_api.drive import awaitable
from datamachine.errors import DataMachineError
from datamachine.payload_keys import RUNTIME_KEYS
from datamachine.registry import IterationBudgetRegistry
from datamachine.storage.tool_intents import Intent
from datamachine.tools.arguments import INVALID_ARGUMENTS, arguments_problem, coerce_parameters
from datamachine.tools.context import ToolContext, idempotency_key
from datamachine.tools.definition import Tool
from datamachine.tools.duplicates import check_duplicate
from datamachine.tools.history import TranscriptIndex, canonical_json
from datamachine.tools.in_doubt import InDoubt, in_doubt_failure, not_done
from datamachine.tools.registry import normalize_tools
from datamachine.tools.results import (
    failed_result,
    is_rejected,
    normalize_return,
    rejected_result,
)
from datamachine.tools.runtime_rules import RuntimeRule, RuntimeRuleSet, parse_runtime_rules
from datamachine.tools.validation import ArgumentValidator, ParameterError

__all__ = ["RUNTIME_PAYLOAD_KEYS", "ToolExecutor"]

logger = logging.getLogger("datamachine.tools")

# Payload keys that carry runtime objects or loop configuration: a tool never sees them, even if
# the caller forgot to strip them.
RUNTIME_PAYLOAD_KEYS = RUNTIME_KEYS

ToolResult = dict[str, Any]


class ToolExecutor:
    """The loop's ``tool_executor`` for one run.

    ``tools``: the run's tools (a mapping name → Tool, or a list). ``mode``: the run's mode (or
    modes), which picks the duplicate correction. ``payload``: the run's payload; runtime keys are
    dropped before a tool sees it. ``engine_data``: the run's mutable engine data (default: the
    payload's ``engine_data`` dict, else a new dict); tools write to it through their context.
    ``registry``: creates budgets a tool asks for by name. ``runtime_rules``: tool runtime rules
    (default: ``payload["tool_runtime_rules"]``), validated here so a bad rule fails before the
    run starts.
    ``warnings``: where clamped budget ceilings are reported (the run's ``warnings``).
    ``closed_tools``: the tools budget pressure's wrap-up took out of the latest request (the
    run keeps the set up to date; a call to one anyway is refused, not run). ``hidden_tools``:
    the tools the loop guard took away for the rest of the run (refused the same way).
    ``pauses``:
    whether a ``requires_approval`` tool pauses the run (``confirmation="pause"``) instead of
    asking ``confirm_continuation``. ``ceiling_overrides``: payload ``budget_ceilings``, for
    budgets tools create. ``approved_call`` / ``declined_call``: the call id a person answered
    (a resumed run); ``approval_id``: the id of the pause that answer was for (an approved
    call's intent stores it: the approval is used up when the call starts). ``run_id``: what
    tells this run's calls from another run's with the same turn and call id in their
    idempotency keys (default: a random id, drawn when first needed); ``in_doubt``: the calls
    a run that died left unsettled, handled before anything else (see
    :mod:`datamachine.tools.in_doubt`).

    Before a call of an ``idempotent`` or ``write`` tool, or any approved call, runs, its
    intent is stored through the turn context's ``transcript`` (when the run stores one that
    can: the host's store), in a transaction that proves the run's lock; a call whose intent
    cannot be stored does not run.

    Calling it returns the result dict for a sync tool and an awaitable of it for an async tool,
    so a run of sync tools never needs an event loop.
    """

    def __init__(
        self,
        tools: Mapping[str, Tool] | Iterable[Tool] | None,
        *,
        mode: str | Sequence[str] = "pipeline",
        payload: Mapping[str, Any] | None = None,
        engine_data: dict[str, Any] | None = None,
        registry: IterationBudgetRegistry | None = None,
        runtime_rules: Sequence[Mapping[str, Any] | RuntimeRule] | None = None,
        warnings: list[str] | None = None,
        host: Any = None,
        closed_tools: set[str] | None = None,
        hidden_tools: set[str] | None = None,
        pauses: Callable[[], bool] | None = None,
        ceiling_overrides: Mapping[str, int] | None = None,
        approved_call: str | None = None,
        declined_call: str | None = None,
        approval_id: str | None = None,
        run_id: str | None = None,
        in_doubt: InDoubt | None = None,
    ) -> None:
        # A run's tools come checked already (RunSpec); anything else is checked here.
        self.tools: dict[str, Tool] = (tools if type(tools) is dict and all(
            type(tool) is Tool and tool.name == name for name, tool in tools.items())
            else normalize_tools(tools))
        # The host the run belongs to, for tools that need its settings or stores.
        self.host = host
        raw_payload = dict(payload or {})
        if runtime_rules is None:
            runtime_rules = raw_payload.get("tool_runtime_rules")
        self.rules = RuntimeRuleSet(parse_runtime_rules(runtime_rules))
        self.mode: str | Sequence[str] = mode
        parts = mode.split(",") if isinstance(mode, str) else [str(m) for m in mode]
        self._modes = tuple(part.strip() for part in parts if part.strip()) or ("pipeline",)
        # Tools see the run's mode label: "chat", or "cluckin,chat" for a multi-mode run.
        self._mode_label = ",".join(self._modes)
        if engine_data is None:
            found = raw_payload.get("engine_data")
            engine_data = found if isinstance(found, dict) else {}
        self.engine_data: dict[str, Any] = engine_data
        self.payload: Mapping[str, Any] = MappingProxyType(
            {key: value for key, value in raw_payload.items() if key not in RUNTIME_PAYLOAD_KEYS}
        )
        self.registry = registry if registry is not None else IterationBudgetRegistry()
        self.warnings: list[str] = warnings if warnings is not None else []
        self.index = TranscriptIndex(observers=[self.rules] if self.rules else ())
        # Budgets created by tools when the caller's context has no budgets mapping.
        self._own_budgets: dict[str, IterationBudget] = {}
        self.closed_tools: set[str] = closed_tools if closed_tools is not None else set()
        self.hidden_tools: set[str] = hidden_tools if hidden_tools is not None else set()
        self.pauses: Callable[[], bool] = pauses if pauses is not None else _never
        self.approved_call = approved_call
        self.declined_call = declined_call
        self.approval_id = approval_id
        self._run_id = run_id
        self.in_doubt = in_doubt if in_doubt is not None and in_doubt.call_ids() else None
        self.ceiling_overrides: Mapping[str, int] = ceiling_overrides or {}
        # Per tool: (tool, validator, wants_context, effects), read once per run (each read
        # checks the tool's values against what they were worked out from); the identity
        # check notices a swapped tool.
        self._compiled: dict[str, tuple[Tool, ArgumentValidator, bool, str]] = {}

    def __call__(
        self, tool_call: Mapping[str, Any], context: Mapping[str, Any]
    ) -> ToolResult | Pause | Awaitable[ToolResult]:
        """Run one call given as ``run_loop``'s tool executor receives it (a call dict, and
        a context that may hold the live transcript as ``messages``); see :meth:`run`."""
        name = tool_call.get("name") or tool_call.get("tool_name") or ""
        if type(name) is not str:
            name = str(name)
        call_id = tool_call.get("id") or context.get("tool_call_id") or ""
        if type(call_id) is not str:
            call_id = str(call_id)
        messages = context.get("messages")
        if not (type(messages) is list or (isinstance(messages, Sequence)
                                           and not isinstance(messages, str | bytes))):
            messages = None
        return self.execute(name, call_id, tool_call.get("parameters"), messages, context)

    def execute(self, name: str, call_id: str, raw: Any, messages: Sequence[Message] | None,
                context: Mapping[str, Any], *, again: tuple[Intent, Tool] | None = None,
                approval: str | None = None) -> ToolResult | Pause | Awaitable[ToolResult]:
        """Run one call (tool ``name``, its id and ``raw`` parameters as the model sent them):
        known tool → decodable arguments → duplicate check → runtime rules → argument check
        against the schema → its intent stored (an effectful or approved call) → the tool.
        ``messages``: the run's live transcript, which holds the call's envelope (without one
        the executor keeps its own record of calls); ``context``: the turn's (its budgets, turn
        and session). ``again``: the intent of a call a run that died left unsettled and its
        tool, run once more with its key (``approval``: what let it run again); see
        :mod:`datamachine.tools.in_doubt`."""
        tracked = messages is not None
        if messages is not None:
            self.index.sync(messages)
        if again is None and self.in_doubt is not None and self.in_doubt.waits(call_id):
            return self._unsettled(self.in_doubt, call_id, messages, context)
        params = raw if type(raw) is dict else coerce_parameters(raw)

        tool = self.tools.get(name) if again is None else again[1]
        if tool is None:
            available = sorted(self.tools)
            listing = ", ".join(available) if available else "none (this run has no tools)"
            return self._done(tracked, call_id, failed_result(
                name, params, f"Tool '{name}' not found. Available tools: {listing}.",
                "tool_not_found", available_tools=available,
            ))
        if params is None:
            # Arguments the provider could not decode: the model reads why and may retry.
            return self._done(tracked, call_id, failed_result(
                name, None, arguments_problem(name, raw), INVALID_ARGUMENTS))
        # The call's spelling: the envelope's (tracked), else worked out here.
        key = (self.index.open_key(call_id) if tracked else None) or canonical_json(params)
        if not tracked:
            self.index.record_call(call_id, name, params)

        # A call run again was checked when it was first made.
        rejection = self._refusal(tool, key, params, call_id, context) if again is None else None
        if isinstance(rejection, str):
            approval = rejection  # a person approved it: its intent says so
        elif rejection is not None:  # nothing ran: a refusal, or a Pause (it waits)
            return rejection if isinstance(rejection, Pause) else self._done(
                tracked, call_id, rejection)

        compiled = self._compiled.get(name)
        if compiled is None or compiled[0] is not tool:
            compiled = self._compiled[name] = (tool, tool.validator, tool.wants_context,
                                               tool.effects)
        try:
            arguments = compiled[1].validate(params)
        except ParameterError as exc:
            return self._done(tracked, call_id, failed_result(
                name, params, exc.message, exc.error_type, **exc.extra))
        intent_key = None
        if approval is not None or compiled[3] != "read":
            intent_key = (again[0].idempotency_key if again is not None
                          else self._key(name, call_id, context))
            unstored = self._store_intent(Intent(
                call_id, name, params, intent_key, compiled[3], _turn(context), approval),
                context)
            if unstored is not None:
                return self._done(tracked, call_id, unstored)
        if compiled[2]:
            arguments["context"] = self._context(tool, call_id, context, intent_key)

        try:
            value = tool.function(**arguments)
        except Exception as exc:
            return self._done(tracked, call_id, self._raised(tool, params, exc))
        if awaitable(value):
            return self._finish_async(value, tool, params, tracked, call_id)
        result = self._normalize(tool, value, params)
        return result if tracked else self._done(tracked, call_id, result)

    def _key(self, name: str, call_id: str, context: Mapping[str, Any]) -> str:
        session_id = context.get("session_id")
        return idempotency_key(session_id if isinstance(session_id, str) else None,
                               self.run_id, _turn(context), call_id, name)

    @property
    def run_id(self) -> str:
        """This run's part of its calls' idempotency keys (drawn once, when first needed)."""
        if self._run_id is None:
            self._run_id = uuid.uuid4().hex
        return self._run_id

    @staticmethod
    def _store_intent(intent: Intent, context: Mapping[str, Any]) -> ToolResult | None:
        """Store the call's intent through the run's transcript (when it keeps intents);
        a failed result, and the call does not run, when it could not be stored."""
        record = getattr(getattr(context, "transcript", None), "record_intent", None)
        if record is None:
            return None  # a run that stores no transcript, or a store of the caller's
        try:
            record(intent)
        except Exception as exc:
            logger.warning("datamachine: the intent of call %r (%s) could not be stored",
                           intent.call_id, intent.tool_name, exc_info=True)
            return failed_result(
                intent.tool_name, intent.arguments,
                f"Tool '{intent.tool_name}' was not run: what it was about to do could not be "
                f"stored first ({type(exc).__name__}: {exc}), and a call with side effects "
                "only runs once its intent is stored.", "intent_not_stored")
        return None

    def _unsettled(self, plan: InDoubt, call_id: str, messages: Sequence[Message] | None,
                   context: Mapping[str, Any]) -> ToolResult | Pause | Awaitable[ToolResult]:
        """An unsettled call of a run that died (see :mod:`datamachine.tools.in_doubt`)."""
        intent = plan.take(call_id)
        tracked = messages is not None
        params = dict(intent.arguments)
        tool = self.tools.get(intent.tool_name) or plan.tools.get(intent.tool_name)
        if call_id in plan.resolved:  # a person said what happened
            result = normalize_return(plan.resolved.pop(call_id), intent.tool_name, params)
            return self._done(tracked, call_id, {**result, "resolved": True})
        if call_id == self.declined_call:
            self.declined_call = None
            return self._done(tracked, call_id, not_done(intent))
        if call_id == self.approved_call:
            self.approved_call = None
            return self._again(tool, intent, messages, context, self.approval_id or "asked")
        if not intent.in_doubt:
            return self._again(tool, intent, messages, context, None)
        call = {"id": intent.call_id, "name": intent.tool_name, "parameters": params}
        found = self._ask("reconcile_tool_call", tool=tool, call=call,
                          idempotency_key=intent.idempotency_key)
        if found is not None:  # settled without running it
            result = normalize_return(found, intent.tool_name, params)
            return self._done(tracked, call_id, {**result, "reconciled": True})
        if self.pauses():
            return Pause({"kind": "tool_in_doubt", "budget": None, "tool_call": call,
                          "effects": intent.effects,
                          "idempotency_key": intent.idempotency_key})
        budgets = context.get("budgets")
        answer = self._ask(
            "confirm_continuation",
            budget=budgets.get("tool_calls") if isinstance(budgets, Mapping) else None,
            context={"kind": "tool_in_doubt", "session_id": context.get("session_id"),
                     "tool_call": call, "effects": intent.effects,
                     "idempotency_key": intent.idempotency_key})
        if answer is True:
            return self._again(tool, intent, messages, context, "asked")
        if answer is False:
            return self._done(tracked, call_id, not_done(intent))
        return self._done(tracked, call_id, in_doubt_failure(intent))

    def _ask(self, hook: str, **arguments: Any) -> Any:
        """A hook's answer about a call in doubt; one that raises counts as no answer (logged),
        so the call still goes to a person, never settled by the error."""
        if self.host is None:
            return None
        try:
            return self.host.first(hook, **arguments)
        except Exception:
            logger.warning("datamachine: %s raised for a call in doubt; treated as no answer",
                           hook, exc_info=True)
            return None

    def _again(self, tool: Tool | None, intent: Intent, messages: Sequence[Message] | None,
               context: Mapping[str, Any], approval: str | None
               ) -> ToolResult | Pause | Awaitable[ToolResult]:
        """Run an unsettled call once more, with the key its intent stored."""
        if tool is None:
            return self._done(messages is not None, intent.call_id, in_doubt_failure(
                intent, f"this run has no tool '{intent.tool_name}' to run it with"))
        return self.execute(intent.tool_name, intent.call_id, dict(intent.arguments),
                            messages, context, again=(intent, tool), approval=approval)

    def _refusal(self, tool: Tool, key: str, params: dict[str, Any], call_id: str,
                 context: Mapping[str, Any]) -> ToolResult | Pause | str | None:
        """Why this call must not run, as its (rejected) result; None when it may: a session
        that was aborted at its limit, a tool wrap-up closed, a duplicate, a runtime rule, an
        approval not given. A :class:`Pause` when the approval is to be asked later; a string
        when a person approved it (what approved it: a pause id, or ``"asked"``)."""
        name = tool.name
        if call_id and call_id == self.declined_call:
            self.declined_call = None  # one answer, for the one call that waited
            return _declined(tool.name, params, "was declined")
        if name in self.closed_tools:
            return _closed(name, params)
        if name in self.hidden_tools:
            return _hidden(name, params)
        rejection = check_duplicate(tool, key, params, self.index, self.mode)
        if rejection is None and self.rules:
            rejection = self.rules.check(name, params)
        if rejection is None and tool.runtime.get("requires_approval") is True:
            return self._approval(tool, params, call_id, context)
        return rejection

    def _approval(self, tool: Tool, params: dict[str, Any], call_id: str,
                  context: Mapping[str, Any]) -> ToolResult | Pause | str:
        """Ask ``confirm_continuation`` (``kind="tool_approval"``); only a yes lets it run.
        In ``pause`` mode the run stops instead, and a person's later answer (``resume``)
        arrives as ``approved_call`` / ``declined_call``."""
        call = {"id": call_id, "name": tool.name, "parameters": dict(params)}
        answer = None
        if call_id and call_id == self.approved_call:
            # One approval, for the one call that waited (it runs first on resume): a later
            # call that happens to reuse the id is asked again.
            self.approved_call = None
            return self.approval_id or "asked"
        if self.pauses():
            return Pause({"kind": "tool_approval", "budget": None, "tool_call": call})
        elif self.host is not None:
            budgets = context.get("budgets")
            budget = budgets.get("tool_calls") if isinstance(budgets, Mapping) else None
            answer = self.host.first("confirm_continuation", budget=budget, context={
                "kind": "tool_approval", "session_id": context.get("session_id"),
                "tool_call": call})
        if answer is True:
            return "asked"
        why = "was declined" if answer is False else "needs approval, and nobody approved it"
        return _declined(tool.name, params, why)

    async def _finish_async(
        self, pending: Awaitable[Any], tool: Tool, params: dict[str, Any], tracked: bool,
        call_id: str,
    ) -> ToolResult:
        try:
            value = await pending
        except Exception as exc:
            return self._done(tracked, call_id, self._raised(tool, params, exc))
        return self._done(tracked, call_id, self._normalize(tool, value, params))

    def _normalize(self, tool: Tool, value: Any, params: dict[str, Any]) -> ToolResult:
        try:
            return normalize_return(value, tool.name, params)
        except Exception as exc:
            return self._raised(tool, params, exc)

    @staticmethod
    def _raised(tool: Tool, params: dict[str, Any], exc: Exception) -> ToolResult:
        if isinstance(exc, DataMachineError):
            # The library's own error (a bad setting of the tool's budget, say) names what is
            # wrong and the fix: one line per call, the traceback only at debug level.
            logger.warning("datamachine: tool %r raised %s: %s", tool.name,
                           type(exc).__name__, exc)
            logger.debug("datamachine: tool %r raised", tool.name, exc_info=exc)
        else:
            logger.warning("datamachine: tool %r raised", tool.name, exc_info=True)
        detail = str(exc) or "no message"
        return failed_result(
            tool.name, params,
            f"Tool '{tool.name}' failed: {type(exc).__name__}: {detail}. Check the parameters "
            "and try again, or continue without this tool.",
            "tool_exception", exception=type(exc).__name__,
        )

    def _done(self, tracked: bool, call_id: str, result: ToolResult) -> ToolResult:
        if not tracked:
            # Without a transcript the executor remembers outcomes itself.
            self.index.record_result(call_id, str(result.get("tool_name", "")),
                                     result.get("success") is True, is_rejected(result))
        return result

    def _context(self, tool: Tool, call_id: str, context: Mapping[str, Any],
                 key: str | None = None) -> ToolContext:
        budgets = context.get("budgets")
        if not isinstance(budgets, MutableMapping):
            budgets = self._own_budgets
        turn = context.get("turn")
        session_id = context.get("session_id")
        return ToolContext(
            payload=self.payload,
            mode=self._mode_label,
            modes=self._modes,
            turn=turn if isinstance(turn, int) else 0,
            engine_data=self.engine_data,
            budgets=budgets,
            budget_factory=self._create_budget,
            tool_name=tool.name,
            tool_call_id=call_id,
            session_id=session_id if isinstance(session_id, str) else None,
            host=self.host,
            idempotency_key=key,
            run_id=self.run_id,
        )

    def _create_budget(self, name: str) -> IterationBudget:
        return self.registry.create(name, ceiling_override=self.ceiling_overrides.get(name),
                                    warnings=self.warnings)


def _never() -> bool:
    return False


def _turn(context: Mapping[str, Any]) -> int:
    turn = context.get("turn")
    return turn if type(turn) is int else 0


TOOLS_CLOSED = "tools_closed"
TOOL_HIDDEN = "tool_hidden"
APPROVAL_DECLINED = "approval_declined"


def _declined(name: str, params: dict[str, Any], why: str) -> ToolResult:
    return rejected_result(name, params, f"Tool '{name}' was not run: it {why}. Continue "
                           "without it, or explain to the user what you wanted to do.",
                           APPROVAL_DECLINED)


def _hidden(name: str, params: dict[str, Any]) -> ToolResult:
    return rejected_result(name, params, f"Tool '{name}' was not run: it was taken away for "
                           "the rest of this run because it kept being called the same way "
                           "without progress. Use another approach, or give your final "
                           "answer with what you have.", TOOL_HIDDEN)


def _closed(name: str, params: dict[str, Any]) -> ToolResult:
    return rejected_result(name, params, f"Tool '{name}' was not run: tools are closed for "
                           "this turn because a budget is nearly spent. Write your final "
                           "answer from what you have.", TOOLS_CLOSED)

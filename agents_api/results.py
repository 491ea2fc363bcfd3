"""What a turn runner returns (:class:`TurnResult`), what a run's stop handler sees and answers
(:class:`RunStop`, :class:`StopVerdict`), and what the loop returns (:class:`LoopResult`).

The models cross the boundary between user code and the loop: a runner or a stop handler
returning the wrong shape gets a clear error instead of a ``KeyError`` three turns later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.errors import InvalidTurnResult
from agents_api.message import Message
from agents_api.records import LoopStatus, ToolCallDict, ToolRecord
from agents_api.usage import Usage

if TYPE_CHECKING:
    from collections.abc import Sized

    from agents_api.budget import BudgetSnapshot

__all__ = [
    "Decision",
    "EndedRun",
    "LoopResult",
    "LoopStatus",
    "RunStop",
    "StopVerdict",
    "TurnAnswer",
    "TurnResult",
    "add_usage",
    "built",
    "coerce_turn_result",
    "empty_usage",
    "final_content",
    "terminal_payload",
    "unchecked",
    "updated",
]


def empty_usage() -> Usage:
    """The usage of a run that made no provider call."""
    return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


class TurnResult(BaseModel):
    """One provider turn as the turn runner saw it.

    ``tool_calls`` are ``{"id", "name", "parameters"}`` dicts; the loop (not the runner) executes
    them. ``continuation_messages`` are appended after the tool results (a completion nudge, for
    example) and keep the loop going. ``complete=True`` ends the run after this turn even when
    there were tool calls.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid")

    content: str = ""
    tool_calls: list[dict[str, object]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=dict)
    request_metadata: dict[str, object] = Field(default_factory=dict)
    complete: bool = False
    continuation_messages: list[Message] = Field(default_factory=list)
    # Pause the run after this turn, before its tool calls run (see agents_api.pause): what
    # the run waits for; the calls wait with it.
    pause: dict[str, object] | None = None


@dataclass(slots=True)
class TurnAnswer:
    """A turn's answer as the loop keeps it: :class:`TurnResult`'s fields, already checked.

    The loop turns whatever a runner returns into one of these. A runner that makes every value
    itself (datamachine's provider runner) may return one directly: it is taken as it is, with
    no validation, which saves building and checking a pydantic model every turn. Anything a
    runner cannot vouch for belongs in a :class:`TurnResult` or a dict. Not changed after the
    loop receives it.
    """

    content: str = ""
    tool_calls: list[dict[str, object]] = field(default_factory=list)
    usage: Usage = field(default_factory=dict)
    request_metadata: dict[str, object] = field(default_factory=dict)
    complete: bool = False
    continuation_messages: list[Message] = field(default_factory=list)
    pause: dict[str, object] | None = None

    @classmethod
    def of(cls, result: TurnResult) -> TurnAnswer:
        """The answer a validated ``TurnResult`` holds."""
        return cls(result.content, result.tool_calls, result.usage, result.request_metadata,
                   result.complete, result.continuation_messages, result.pause)

    def to_turn_result(self) -> TurnResult:
        """The answer as the public model (what ``should_continue`` receives)."""
        return TurnResult(content=self.content, tool_calls=self.tool_calls, usage=self.usage,
                          request_metadata=self.request_metadata, complete=self.complete,
                          continuation_messages=self.continuation_messages, pause=self.pause)


def coerce_turn_result(value: object, turn: int) -> TurnAnswer:
    """Accept a TurnAnswer, a TurnResult or a mapping of its fields; anything else is an
    InvalidTurnResult."""
    if type(value) is TurnAnswer:
        return value
    if isinstance(value, TurnResult):
        return TurnAnswer.of(value)
    if isinstance(value, Mapping):
        try:
            return TurnAnswer.of(TurnResult(**dict(value)))
        except ValidationError as exc:
            fields = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidTurnResult(f"turn {turn}: the turn runner returned {fields}") from None
    raise InvalidTurnResult(
        f"turn {turn}: the turn runner must return a TurnResult or a dict of its fields, "
        f"got {type(value).__name__}."
    )


class Decision(BaseModel):
    """A completion policy's verdict: stop now (``complete``) or keep going, optionally with a
    ``message`` appended as a user turn before the next request."""

    model_config = ConfigDict(defer_build=True)

    complete: bool
    message: str = ""
    context: dict[str, object] = Field(default_factory=dict)


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class RunStop:
    """Why a run stopped and what it did: the one record the loop hands the product.

    The loop makes it twice: as its own verdict for the ``stop`` hook (``status``, ``budget``,
    ``error`` and ``error_code`` as the loop saw them), and once more at the very end with the
    hook's :class:`StopVerdict` applied (:meth:`decided`) and storage done; that last one is
    what the loop returns, what it stores and what its terminal event reports. ``messages`` is
    the transcript (read it, do not change it: a hook adds messages through its verdict);
    ``budgets`` a snapshot per budget.
    """

    status: LoopStatus
    budget: str | None
    error: str | None
    error_code: str | None
    messages: list[Message]
    final_content: str
    turn_count: int
    usage: Usage
    budgets: dict[str, BudgetSnapshot]
    last_tool_calls: list[ToolCallDict]
    tool_execution_results: list[ToolRecord]
    session_id: str | None
    flags: list[str] = field(default_factory=list)
    warning: str | None = None
    pending: dict[str, object] | None = None
    # The loop's notices (a stop hook that failed, a transcript that could not be stored),
    # then the verdict's.
    warnings: list[str] = field(default_factory=list)
    request_metadata: dict[str, object] = field(default_factory=dict)
    # Product diagnostics the verdict adds (persisters store them with the transcript).
    metadata: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, result: LoopResult) -> RunStop:
        """The stop a finished result describes."""
        return cls(
            status=result.status, budget=result.budget, error=result.error,
            error_code=result.error_code, messages=result.messages,
            final_content=result.final_content, turn_count=result.turn_count,
            usage=dict(result.usage),
            # A result holds what the loop made: snapshots, call dicts, tool records (its
            # pydantic fields only check that they are dicts).
            budgets=cast("dict[str, BudgetSnapshot]", result.budgets),
            last_tool_calls=cast("list[ToolCallDict]", result.last_tool_calls),
            tool_execution_results=cast("list[ToolRecord]", result.tool_execution_results),
            session_id=result.transcript_session_id, flags=list(result.flags),
            warning=result.warning, pending=result.pending, warnings=list(result.warnings),
            request_metadata=result.request_metadata, metadata=dict(result.metadata))

    def decided(self, verdict: StopVerdict | None, budgets: dict[str, BudgetSnapshot],
                *, verdict_applies: bool = True) -> RunStop:
        """This stop with ``verdict`` applied: the one place a verdict changes a run's end.

        Fields the verdict sets replace the loop's; its messages are appended (a final
        summary), its usage added, its warnings and metadata merged. ``verdict_applies=False``
        (the run lost its lock: its own end is that error) keeps only the verdict's warnings.
        ``budgets``: the snapshots as the run ends (the stop hook may have spent more).
        """
        warnings = list(self.warnings)
        if verdict is None:
            return replace(self, budgets=budgets, warnings=warnings,
                           pending=self.pending if self.status == "awaiting_confirmation"
                           else None)
        warnings += [w for w in verdict.warnings if w not in warnings]
        if not verdict_applies:
            return replace(self, budgets=budgets, warnings=warnings, pending=None)
        given = verdict.model_fields_set  # a property: read once, not once per name
        messages = [*self.messages, *verdict.messages] if verdict.messages else self.messages
        usage = dict(self.usage)
        add_usage(usage, verdict.usage)
        status = verdict.status if "status" in given and verdict.status else self.status
        final = (verdict.final_content if "final_content" in given
                 else final_content(verdict.messages) or self.final_content)
        return replace(
            self, status=status,
            budget=verdict.budget if "budget" in given else self.budget,
            flags=list(verdict.flags) if "flags" in given else self.flags,
            warning=verdict.warning if "warning" in given else self.warning,
            error=verdict.error if "error" in given else self.error,
            error_code=verdict.error_code if "error_code" in given else self.error_code,
            pending=((verdict.pending if "pending" in given else self.pending)
                     if status == "awaiting_confirmation" else None),
            final_content=final, messages=messages, usage=usage,
            budgets=({**budgets, **cast("dict[str, BudgetSnapshot]", verdict.budgets)}
                     if verdict.budgets else budgets),
            warnings=warnings, metadata={**self.metadata, **verdict.metadata})


class StopVerdict(BaseModel):
    """A stop handler's answer, applied to the result once, before it is stored or reported.

    Fields it sets replace the loop's (``status``, ``budget``, ``flags``, ``warning``,
    ``error``, ``error_code``, ``final_content``, ``pending``); fields it leaves out keep the
    loop's.
    ``messages`` are appended to the transcript (a final summary), ``usage`` is added to the
    run's usage (a call made after the last turn), ``warnings`` are appended and ``metadata``
    (product diagnostics that persisters store) is merged. ``budgets``: snapshots of budgets
    the product counted itself (retries, nudges), added to the run's.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    status: LoopStatus | None = None
    budget: str | None = None
    flags: list[str] = Field(default_factory=list)
    warning: str | None = None
    error: str | None = None
    error_code: str | None = None
    final_content: str = ""
    messages: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    metadata: dict[str, object] = Field(default_factory=dict)
    pending: dict[str, object] | None = None
    budgets: dict[str, dict[str, object]] = Field(default_factory=dict)


class LoopResult(BaseModel):
    """The normalized outcome of one run of the generic loop; built once, never changed.

    ``status`` says why the run stopped; ``budget`` names the budget that stopped it (with its
    ``max_<name>_reached`` flag in ``flags``); ``budgets`` snapshots every budget of the run.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    messages: list[Message]
    final_content: str = ""
    turn_count: int = 0
    completed: bool = False
    status: LoopStatus = "completed"
    budget: str | None = None
    flags: list[str] = Field(default_factory=list)
    warning: str | None = None
    error: str | None = None
    error_code: str | None = None
    usage: Usage = Field(default_factory=empty_usage)
    tool_execution_results: list[dict[str, object]] = Field(default_factory=list)
    last_tool_calls: list[dict[str, object]] = Field(default_factory=list)
    request_metadata: dict[str, object] = Field(default_factory=dict)
    budgets: dict[str, dict[str, object]] = Field(default_factory=dict)
    transcript_session_id: str | None = None
    warnings: list[str] = Field(default_factory=list)
    # Product diagnostics a stop handler adds (a blocker, completion diagnostics); persisters
    # store them with the transcript.
    metadata: dict[str, object] = Field(default_factory=dict)
    # What an ``awaiting_confirmation`` run waits for (see agents_api.pause); else None.
    pending: dict[str, object] | None = None

    @classmethod
    def of(cls, stop: RunStop) -> LoopResult:
        """The result of a run that ended as ``stop`` (a decided stop: see
        :meth:`RunStop.decided`)."""
        return unchecked(
            cls, messages=stop.messages, final_content=stop.final_content,
            turn_count=stop.turn_count, completed=stop.status == "completed",
            status=stop.status, budget=stop.budget, flags=stop.flags, warning=stop.warning,
            error=stop.error, error_code=stop.error_code, usage=stop.usage,
            tool_execution_results=stop.tool_execution_results,
            last_tool_calls=stop.last_tool_calls, request_metadata=stop.request_metadata,
            budgets=stop.budgets, transcript_session_id=stop.session_id,
            warnings=stop.warnings, metadata=stop.metadata, pending=stop.pending)


def add_usage(total: Usage, usage: Mapping[str, object]) -> None:
    """Add ``usage``'s numbers into ``total`` (other values replace)."""
    for key, value in usage.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            previous = total.get(key, 0)
            if isinstance(previous, int | float) and not isinstance(previous, bool):
                total[key] = previous + value
                continue
        total[key] = value


def final_content(messages: list[Message], start: int = 0) -> str:
    """The last assistant text among ``messages[start:]``: never an earlier run's answer."""
    for index in range(len(messages) - 1, start - 1, -1):
        message = messages[index]
        if (message.role == "assistant" and message.type == "text"
                and isinstance(message.content, str) and message.content):
            return message.content
    return ""


class EndedRun(Protocol):
    """What :func:`terminal_payload` reads of a finished run: a ``LoopResult``, a decided
    ``RunStop``, or anything with their fields (``pending`` is read when there is one)."""

    @property
    def status(self) -> str: ...
    @property
    def turn_count(self) -> int: ...
    @property
    def messages(self) -> Sized: ...
    @property
    def tool_execution_results(self) -> Sized: ...
    @property
    def budget(self) -> str | None: ...
    @property
    def flags(self) -> Sequence[str]: ...
    @property
    def budgets(self) -> Mapping[str, Mapping[str, object]]: ...
    @property
    def error(self) -> str | None: ...
    @property
    def error_code(self) -> str | None: ...


def terminal_payload(result: EndedRun) -> dict[str, object]:
    """The payload of a run's terminal event (``completed`` or ``failed``) from its result (a
    ``LoopResult``, a decided ``RunStop`` or anything with their fields): every emitter of that
    event uses this one."""
    return {
        "status": result.status, "turn": result.turn_count, "turn_count": result.turn_count,
        "message_count": len(result.messages),
        "tool_results": len(result.tool_execution_results), "budget": result.budget,
        "flags": list(result.flags),
        "budgets": result.budgets, "error": result.error, "error_code": result.error_code,
        "pending": getattr(result, "pending", None),
    }


# -- models built from the code's own values --------------------------------------------------
# A run builds a few pydantic models from its own values: a message per step, the provider
# request every turn, the result once. Validating them again would check what is already known
# and cost more than the rest of a turn's bookkeeping; ``model_construct`` walks every field in
# Python, and even ``model_copy(update=...)`` goes through ``copy.copy`` three times. So these
# builders set the instance's state directly, as ``model_copy`` does: the field values in
# ``__dict__``, the fields set, no extra and no private values (tests/test_fast_models.py
# checks each builder against pydantic's own copy, so a pydantic that changes this layout fails
# there, not in a run). Anything from outside (a user's dict, a model's answer) is validated as
# usual.

M = TypeVar("M", bound=BaseModel)

# Per class: an empty instance to copy, and the fields whose default is made per instance (a
# list or dict from a default_factory), which every call must set so no two share one.
_templates: dict[type[BaseModel], tuple[BaseModel, frozenset[str]]] = {}
_set_state = object.__setattr__


def unchecked(cls: type[M], /, **fields: object) -> M:
    """An instance of ``cls`` with ``fields`` set, not validated.

    Fields left out take their plain default; a field whose default comes from a
    ``default_factory`` must be given (a ``ValueError`` names it), because the copies would
    otherwise share the template's one list or dict. Required fields must be given too.
    """
    entry = _templates.get(cls)
    if entry is None:
        entry = _templates[cls] = _template(cls)
    template, must_set = entry
    if not fields.keys() >= must_set:
        missing = ", ".join(sorted(must_set - fields.keys()))
        raise ValueError(f"unchecked({cls.__name__}) needs a value for: {missing}.")
    values = template.__dict__.copy()
    values.update(fields)
    return built(cls, values, set(fields))


def updated(model: M, /, **fields: object) -> M:
    """``model.model_copy(update=fields)`` (a shallow copy, ``fields`` not validated), built
    directly: what a turn does with its provider request."""
    values = model.__dict__.copy()
    values.update(fields)
    return built(type(model), values, model.__pydantic_fields_set__ | fields.keys(),
                 model.__pydantic_extra__, model.__pydantic_private__)


def built(cls: type[M], values: dict[str, object], fields_set: set[str],
          extra: dict[str, object] | None = None,
          private: dict[str, object] | None = None) -> M:
    """An instance of ``cls`` whose state is ``values`` (every field, nothing validated), as
    pydantic's own copy makes one."""
    model = cls.__new__(cls)
    _set_state(model, "__dict__", values)
    _set_state(model, "__pydantic_fields_set__", fields_set)
    _set_state(model, "__pydantic_extra__", None if extra is None else dict(extra))
    _set_state(model, "__pydantic_private__", None if private is None else dict(private))
    return model


def _template(cls: type[BaseModel]) -> tuple[BaseModel, frozenset[str]]:
    fields = cls.model_fields
    must_set = frozenset(name for name, info in fields.items()
                         if info.default_factory is not None or info.is_required())
    # Every field in declaration order (what model_dump_json follows); the ones a caller must
    # set hold None until it does.
    values = {name: None if name in must_set else info.default
              for name, info in fields.items()}
    return built(cls, values, set()), must_set

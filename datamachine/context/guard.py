"""One run's context window: :class:`ContextGuard` (DESIGN.md 21).

Before every request the guard sizes it (the projection keeps the request's bytes as messages
are added, so this is a multiplication, not a pass over the history) and sets the
``context_tokens`` budget's count to the estimate: the latest request's prompt, never a sum.
When the estimate and the room for the answer pass ``compact_at`` of the window it builds a
smaller *view* of the history and sends that from then on (the transcript keeps every
message); when nothing can make the request fit it raises :class:`~agents_api.BudgetSpent`,
and the run stops on the budget with a summary that fits.

The estimate learns: each answer's reported prompt tokens over the bytes that were sent
replace the first guess of four bytes a token for the rest of the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from agents_api import BudgetSpent, IterationBudget, Message
from agents_api.drive import Steps
from datamachine.context.compaction import (
    CompactedView,
    clear_tool_results,
    drop_oldest,
    spans,
    split_for_summary,
    summary_message,
    summary_request_text,
    tail_start,
    view_problem,
)
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderResponse

if TYPE_CHECKING:
    from datamachine.context.window import CompactionConfig
    from datamachine.conversation.metering import RunMeter
    from datamachine.conversation.projection import ChatProjector
    from datamachine.conversation.provider_turn import ProviderTurn

__all__ = ["SUMMARY_PROMPT", "ContextGuard", "ContextSlot"]

logger = logging.getLogger("datamachine.context")

# Bytes of a request per token until the provider reports its prompt tokens.
FIRST_GUESS = 0.25
SUMMARY_PROMPT = (
    "You compact a conversation between a user, an assistant and its tools so the assistant "
    "can go on with less context. Write a summary the assistant will read instead of the "
    "messages below: the task, what was done and found (keep names, numbers, ids, file paths "
    "and tool results that matter), decisions made, and what is still open. Write it as "
    "notes, without preamble.")
# What a summary call may answer at most, in tokens.
SUMMARY_MAX_TOKENS = 1024
# The fewest answer tokens a final summary is worth asking for.
SUMMARY_MIN_ANSWER = 64
# Overflow answers one turn may recover from before the run stops on the window.
MAX_OVERFLOWS_PER_TURN = 2

Emit = Callable[[str, dict[str, Any]], None]
CompactHook = Callable[[list[Message], dict[str, Any]], object]


class ContextGuard:
    """The context window of one run (see the module docstring).

    ``budget``: the run's ``context_tokens``; ``config``: its compaction (None: off, and a
    request that does not fit stops the run); ``reserve``: the tokens left for the answer;
    ``turn``: the run's provider turn (sizes, projections, the summary call); ``hook``: the
    ``compact_context`` hook's caller when a plugin implements it; ``meter``: the run's token
    and cost counting, which the summary call is charged to.
    """

    def __init__(self, budget: IterationBudget, *, config: CompactionConfig | None,
                 reserve: int, turn: ProviderTurn, emit: Emit,
                 hook: CompactHook | None = None, meter: RunMeter | None = None,
                 mode: str = "", session_id: str | None = None) -> None:
        self.budget = budget
        self.config = config
        self.reserve = reserve
        self.turn = turn
        self.emit = emit
        self.hook = hook
        self.meter = meter
        self.mode = mode
        self.session_id = session_id
        self.ratio = FIRST_GUESS
        # The view sent instead of the transcript once a compaction happened (None: the
        # transcript itself), and how much of the transcript it has taken in.
        self.view: list[Message] | None = None
        self.synced = 0
        self._prefix = 0  # the view's own messages (the rest came from the transcript since)
        self.compactions = 0
        # Each compaction, for storage and the run's diagnostics.
        self.records: list[dict[str, Any]] = []
        # What the summary calls used (added to the run's usage).
        self.usage: dict[str, Any] = {}
        self.prepared_turn = 0
        self._overflows = 0
        self._overflow_turn = 0
        self._upto = 0  # the transcript messages the view's own messages stand for
        self._tokens = 0  # the latest request's estimate (see fits)
        self._limit = 0
        self._set_limit()

    # -- sizes --------------------------------------------------------------------------------
    def tokens(self, request_bytes: int) -> int:
        """The estimated prompt tokens of a request of ``request_bytes``."""
        return math.ceil(request_bytes * self.ratio)

    def limit(self) -> int:
        """The prompt tokens above which a request is compacted first."""
        return self._limit

    def _set_limit(self) -> None:
        """Work the limit out from the window (again when the window is lowered)."""
        fraction = self.config.compact_at if self.config is not None else 1.0
        self._limit = int(self.budget.ceiling() * fraction) - self.reserve

    def over(self, tokens: int) -> bool:
        """A request of ``tokens`` prompt tokens leaves no room for its answer."""
        return tokens + self.reserve > self.budget.ceiling()

    def messages(self, transcript: list[Message]) -> list[Message]:
        """What the coming request sends: the transcript, or the compacted view with what the
        transcript gained since."""
        view = self.view
        if view is None:
            return transcript
        if len(transcript) > self.synced:
            view.extend(transcript[self.synced:])
            self.synced = len(transcript)
        return view

    def observe(self, usage: Mapping[str, Any]) -> None:
        """An answer came: its reported prompt tokens are the budget's count, and teach the
        estimate its ratio (to the request's size as sent)."""
        prompt = usage.get("prompt_tokens")
        if type(prompt) is int and prompt > 0:
            self.budget.set_current(prompt)
            sent = self.turn.sent_bytes
            if sent > 0:
                self.ratio = prompt / sent

    # -- before a request ---------------------------------------------------------------------
    def fits(self, transcript: list[Message], number: int) -> bool:
        """Size turn ``number``'s request (the budget's count is its estimate): True when it
        needs no compaction, the common case, which is all a turn pays."""
        self.prepared_turn = number
        view = self.view
        if view is None:
            view = transcript
        elif len(transcript) > self.synced:
            view.extend(transcript[self.synced:])
            self.synced = len(transcript)
        tokens = math.ceil(self.turn.request_bytes(view) * self.ratio)
        self.budget.set_current(tokens)
        self._tokens = tokens
        return tokens <= self._limit

    def prepare(self, transcript: list[Message], number: int) -> Steps[None]:
        """Size turn ``number``'s request and compact it when it passes the limit; raise
        BudgetSpent when it cannot be made to fit."""
        if self.fits(transcript, number):
            return
        view, tokens = self.messages(transcript), self._tokens
        if self.config is not None:
            tokens = yield from self._compact(transcript, view, number, tokens)
        if self.over(tokens):
            raise self.spent(number, (
                f"the request of turn {number} needs about {tokens:,} prompt tokens and "
                f"{self.reserve:,} for the answer; the context window holds "
                f"{self.budget.ceiling():,} and nothing more can be compacted"))

    def _compact(self, transcript: list[Message], view: list[Message], number: int,
                 tokens: int) -> Steps[int]:
        """Strategies in order (the hook's first) until the request fits under the limit;
        the view they made is installed; its estimated tokens."""
        assert self.config is not None
        limit = self.limit()
        keep = self._keep(view, limit)
        found: tuple[list[Message], ChatProjector] | None = None
        for strategy in ("hook", *self.config.strategies):
            before = tokens
            made = yield from self._apply(strategy, view, number, keep, tokens - limit)
            if made is None:
                continue
            candidate, name, removed, summary = made
            projector = self.turn.projection(candidate)
            after = self.tokens(self.turn.bytes_of(projector))
            if after >= before:
                continue  # nothing gained: the view stays as it was
            view, tokens, found = candidate, after, (candidate, projector)
            self._record(name, number, before, after, removed, summary, len(transcript))
            if tokens <= limit:
                break
        if found is not None:
            self._install(found[0], found[1], len(transcript))
            self.budget.set_current(tokens)
        return tokens

    def _install(self, view: list[Message], projector: ChatProjector | None,
                 synced: int) -> None:
        """Send ``view`` (which stands for the transcript's first ``synced`` messages) from
        now on, projected by ``projector`` (made when None)."""
        self.view, self.synced, self._prefix = view, synced, len(view)
        self.turn.use_projection(projector if projector is not None
                                 else self.turn.projection(view))

    def start_from(self, stored: Mapping[str, Any], transcript: list[Message]) -> bool:
        """Begin with a stored compaction (a continued session): its view stands for the
        transcript's first ``upto`` messages. False, and nothing changed, when it does not
        fit this transcript."""
        upto, envelopes = stored.get("upto"), stored.get("view")
        if not isinstance(upto, int) or not isinstance(envelopes, list) \
                or not 0 < upto <= len(transcript):
            return False
        try:
            view = [Message.model_validate(envelope) for envelope in envelopes]
        except ValueError:
            return False
        if view_problem(view) is not None:
            return False
        self._install([*view, *transcript[upto:]], None, len(transcript))
        self._prefix = len(view)
        self._upto = upto
        return True

    def stored_records(self) -> list[dict[str, Any]]:
        """The run's compactions as the transcript store keeps them, the latest with the view
        a continued run starts from (see :meth:`start_from`)."""
        if not self.records or self.view is None:
            return [dict(record) for record in self.records]
        records = [dict(record) for record in self.records]
        records[-1]["view"] = [m.to_dict() for m in self.view[:self._prefix]]
        records[-1]["upto"] = self._upto
        records[-1]["context_window"] = self.budget.ceiling()
        return records

    def _keep(self, view: list[Message], limit: int) -> int:
        """The turns kept whole: ``keep_turns``, fewer (down to the last one) while they
        alone would take more than half of what the request may hold. A tail that fills the
        window would otherwise be compacted again at every turn."""
        assert self.config is not None
        keep = self.config.keep_turns
        if keep <= 1:
            return keep
        units = spans(view)
        while keep > 1:
            start = tail_start(view, units, keep)
            first = units[start][0] if start < len(units) else len(view)
            size = sum(self.turn.message_bytes(m) for m in view[first:])
            if self.tokens(size) <= limit // 2:
                break
            keep -= 1
        return keep

    def _apply(self, strategy: str, view: list[Message], number: int, keep: int,
               excess: int) -> Steps[tuple[list[Message], str, int, str | None] | None]:
        """One strategy's view of ``view``: (messages, its name, messages removed or cleared,
        the summary it wrote), or None when it had nothing to take out."""
        if strategy == "hook":
            return self._from_hook(view, number)
        if strategy == "clear_tool_results":
            cleared, count = clear_tool_results(view, keep, self.tokens)
            return (cleared, strategy, count, None) if count else None
        if strategy == "drop_oldest":
            wanted = math.ceil(excess / self.ratio)
            dropped, count = drop_oldest(view, keep, wanted, self.turn.message_bytes)
            return (dropped, strategy, count, None) if count else None
        if strategy == "summarize":
            made = yield from self._summarize(view, number, keep)
            return made
        return None

    def _from_hook(self, view: list[Message], number: int
                   ) -> tuple[list[Message], str, int, str | None] | None:
        if self.hook is None:
            return None
        context = {"turn": number, "mode": self.mode, "session_id": self.session_id,
                   "ceiling": self.budget.ceiling(), "limit": self.limit(),
                   "reserve": self.reserve}
        try:
            answer = self.hook(list(view), context)
        except Exception:
            logger.warning("datamachine: a compact_context hookimpl failed; the built-in "
                           "strategies go on", exc_info=True)
            return None
        if answer is None:
            return None
        if not isinstance(answer, CompactedView) or not all(
                isinstance(m, Message) for m in answer.messages):
            logger.warning("datamachine: a compact_context hookimpl returned %s, not a "
                           "CompactedView of Messages; ignored", type(answer).__name__)
            return None
        problem = view_problem(answer.messages)
        if problem is not None:
            logger.warning("datamachine: the compact_context view of %r is ignored: %s",
                           answer.strategy, problem)
            return None
        removed = max(0, len(view) - len(answer.messages))
        return list(answer.messages), answer.strategy or "hook", removed, answer.summary

    def _summarize(self, view: list[Message], number: int, keep: int
                   ) -> Steps[tuple[list[Message], str, int, str | None] | None]:
        """One tool-less call to the run's model for a summary of the turns before the tail;
        a call that fails or answers nothing leaves the view to the next strategy."""
        parts = split_for_summary(view, keep)
        if parts is None:
            return None
        head, summarized, tail = parts
        worth = self.tokens(sum(self.turn.message_bytes(m) for m in summarized))
        if worth < max(SUMMARY_MIN_ANSWER, self._limit // 8):
            return None  # a call to the model to save a few tokens: drop_oldest is cheaper
        room = self.budget.ceiling() - SUMMARY_MAX_TOKENS - self.tokens(len(SUMMARY_PROMPT))
        answer_tokens = min(SUMMARY_MAX_TOKENS, max(64, self.budget.ceiling() // 8))
        limit_chars = max(1_000, int((room - answer_tokens) / self.ratio * 0.9))
        text = summary_request_text(summarized, limit_chars)
        request = self.turn.side_request(SUMMARY_PROMPT, text, number, answer_tokens)
        if self.meter is not None:
            try:
                request = self.meter.admit_summary(request, len(text) + len(SUMMARY_PROMPT))
            except Exception as exc:  # the token or cost budgets have no room for it
                logger.info("datamachine: no summary compaction: %s", exc)
                return None
        try:
            called = self.turn.side_call(request, "compaction")
            answer = (called if type(called) is ProviderResponse
                      else (yield cast(Awaitable[ProviderResponse], called)))
        except ProviderError as exc:
            logger.warning("datamachine: the summary call for compaction failed: %s", exc)
            if self.meter is not None:
                self.meter.charge_failed()
            return None
        response = cast(ProviderResponse, answer)
        for key, value in response.usage.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.usage[key] = self.usage.get(key, 0) + value
        if self.meter is not None:
            self.meter.settle(response.usage, response.content)
        summary = response.content.strip()
        if not summary:
            return None
        message = summary_message(summary, turn=number, covers=len(summarized))
        return [*head, message, *tail], "summarize", len(summarized), summary

    def _record(self, strategy: str, number: int, before: int, after: int, removed: int,
                summary: str | None, upto: int) -> None:
        self._upto = upto
        self.compactions += 1
        record: dict[str, Any] = {"strategy": strategy, "turn": number,
                                  "tokens_before": before, "tokens_after": after,
                                  "messages_removed": removed}
        self.emit("context_compacted", dict(record))
        if summary is not None:
            record["summary"] = summary
        record["upto"] = upto
        self.records.append(record)

    # -- after a provider said no --------------------------------------------------------
    def overflowed(self, error: ProviderError, number: int, sent_bytes: int) -> bool:
        """The provider answered that turn ``number``'s prompt was too long: the window is
        lowered to what was sent (or to what the provider says it is) and the estimate
        corrected. True when the turn may compact and ask again (at most twice a turn)."""
        if self._overflow_turn != number:
            self._overflow_turn, self._overflows = number, 0
        self._overflows += 1
        sent = getattr(error, "prompt_tokens", None)
        if isinstance(sent, int) and sent > 0 and sent_bytes > 0:
            # The provider counted what was sent: the best ratio there is.
            self.ratio = sent / sent_bytes
        else:
            sent = self.tokens(sent_bytes)
        window = getattr(error, "context_window", None)
        ceiling = min(sent, window) if isinstance(window, int) and window > 0 else sent
        self.budget.lower(max(1, ceiling))
        self.budget.set_current(min(self.budget.current(), self.budget.ceiling()))
        self._set_limit()
        self.emit("context_overflow", {"turn": number, "ceiling": self.budget.ceiling(),
                                       "sent_tokens": sent})
        return self.config is not None and self._overflows <= MAX_OVERFLOWS_PER_TURN

    def spent(self, number: int, why: str = "") -> BudgetSpent:
        """The stop of a run whose request does not fit the window (the window is full)."""
        self.budget.set_current(self.budget.ceiling())
        return BudgetSpent(self.budget, why or (
            f"the request of turn {number} does not fit the context window of "
            f"{self.budget.ceiling():,} tokens"))

    # -- the final summary ----------------------------------------------------------------
    def fit_summary(self, transcript: list[Message], prompt_bytes: int,
                    answer_tokens: int) -> int | None:
        """Make the final summary's request fit: its view compacted without another model
        call (every tool result cleared, then the oldest turns dropped, down to the last);
        the answer tokens it may ask for, or None when even that does not fit."""
        view = self.messages(transcript)
        need = min(answer_tokens, SUMMARY_MIN_ANSWER)

        def room_of(candidate: list[Message]) -> tuple[ChatProjector, int]:
            projector = self.turn.projection(candidate)
            used = self.tokens(self.turn.bytes_of(projector) + prompt_bytes)
            return projector, self.budget.ceiling() - used

        projector, room = room_of(view)
        if room < need:
            view = clear_tool_results(view, 0, self.tokens)[0]
            projector, room = room_of(view)
        keep = self.config.keep_turns if self.config is not None else 1
        while room < need and keep >= 0:
            wanted = math.ceil((need - room) / self.ratio)
            view, count = drop_oldest(view, keep, wanted, self.turn.message_bytes)
            if count:
                projector, room = room_of(view)
            else:
                keep -= 1
        if room < need:
            return None
        if view is not transcript and view is not self.view:
            self._install(view, projector, len(transcript))
            self._upto = len(transcript)
        else:
            self.turn.use_projection(projector)
        return min(answer_tokens, room)


class ContextSlot:
    """Where a run keeps its :class:`ContextGuard`: made at set-up when the window is known,
    or mid-run when a provider first says a prompt was too long. The run's final summary reads
    it from here (holding the run itself would make a reference cycle)."""

    # No __init__: a run without a window makes its slot without entering this module.
    guard: ContextGuard | None = None

    def hold(self, guard: ContextGuard) -> ContextGuard:
        """Keep ``guard``, made mid-run; return it."""
        self.guard = guard
        return guard

    def fit_summary(self, messages: list[Message], prompt_bytes: int,
                    answer_tokens: int) -> tuple[list[Message], int | None]:
        """The final summary's messages and the answer tokens it may ask for, made to fit
        the window (None: it does not fit at all); as they are without a window."""
        guard = self.guard
        if guard is None:
            return messages, answer_tokens
        room = guard.fit_summary(messages, prompt_bytes, answer_tokens)
        return guard.messages(messages), room

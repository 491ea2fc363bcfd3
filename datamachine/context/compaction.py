"""Making a run's request smaller than its history: the compaction strategies (DESIGN.md 21).

A strategy takes the messages a request would send and returns fewer or smaller ones; the
transcript itself is never changed. What every strategy keeps: system messages, the first
user message, the latest summary, and the last ``keep_turns`` turns whole (the *tail*). What
none does: separate a tool call from its result, or the calls of one answer from each other (a
provider answers 400 to an assistant message whose calls lack a result, and the projection
folds the calls of one answer into one assistant message).

- ``clear_tool_results``: every tool result older than the tail becomes a short line saying
  what it was and how big (the model may call the tool again);
- ``summarize``: the turns before the tail become one summary message (the model writes it,
  in one tool-less call: :func:`summary_request_text` renders what it reads);
- ``drop_oldest``: whole turns go, oldest first, until the request fits.

A plugin adds its own with the ``compact_context`` hook, returning a :class:`CompactedView`;
:func:`view_problem` checks what it returns before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agents_api import Message
from agents_api.errors import brief_repr
from agents_api.jsontext import compact_json
from datamachine.errors import UsageError

__all__ = ["COMPACTION_KEY", "CompactedView", "Span", "clear_tool_results", "drop_oldest",
           "is_summary", "spans", "split_for_summary", "summary_message",
           "summary_request_text", "tail_start", "view_problem"]

# The metadata key of a summary message (its value says what it stands for).
COMPACTION_KEY = "compaction"
# A tool result shorter than this is left as it is: clearing it would save nothing.
_CLEAR_MIN_CHARS = 200
# What the summary call reads of one message at most (the rest is cut, and says so).
_RENDER_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class CompactedView:
    """A smaller request than the history: the ``messages`` to send instead, the ``strategy``
    that made them (a name for events and the timeline) and, when the strategy wrote one, the
    ``summary`` text (stored, so a continued run starts from it instead of summarizing again).
    What a ``compact_context`` hookimpl returns."""

    messages: list[Message]
    strategy: str
    summary: str | None = None

    def __post_init__(self) -> None:
        # Checked when made, so a hookimpl's mistake is named where it is written, not found
        # as a failed request estimate or a number stored as a summary turns later.
        if isinstance(self.messages, str | bytes) or not isinstance(self.messages, Sequence) \
                or not all(isinstance(message, Message) for message in self.messages):
            raise UsageError(f"CompactedView.messages must be a list of agents_api.Message "
                             f"(the request to send instead), got {brief_repr(self.messages)}.")
        if not isinstance(self.messages, list):  # a tuple is taken, kept as the list it reads
            object.__setattr__(self, "messages", list(self.messages))
        if self.strategy is not None and not isinstance(self.strategy, str):
            raise UsageError(f"CompactedView.strategy must be the strategy's name (a str; None "
                             f"or empty: 'hook'), got {brief_repr(self.strategy)}.")
        if self.summary is not None and not isinstance(self.summary, str):
            raise UsageError(f"CompactedView.summary must be the summary's text or None, got "
                             f"{brief_repr(self.summary)}.")


# (start, end) of one unit of messages that is kept or removed whole.
Span = tuple[int, int]


def is_summary(message: Message) -> bool:
    """A summary a compaction put in place of earlier turns."""
    return message.type == "text" and COMPACTION_KEY in message.metadata


def _is_answer(message: Message) -> bool:
    return message.type == "tool_call" or (message.role == "assistant"
                                           and message.type == "text")


def spans(messages: Sequence[Message]) -> list[Span]:
    """The units a strategy keeps or removes whole: an answer (its text, then its calls and
    their results, grouped as the projection groups them) or any other single message."""
    found: list[Span] = []
    start, count = 0, len(messages)
    while start < count:
        message = messages[start]
        end = start + 1
        if _is_answer(message):
            turn = message.payload.get("turn") if message.type == "tool_call" else None
            while end < count:
                following = messages[end]
                if following.type == "tool_result":
                    end += 1
                elif following.type == "tool_call" and (
                        turn is None or following.payload.get("turn") == turn):
                    turn = following.payload.get("turn")
                    end += 1
                else:
                    break
        found.append((start, end))
        start = end
    return found


def _pinned(messages: Sequence[Message], units: list[Span]) -> set[int]:
    """The units every strategy keeps: system messages, the first user message, and the
    latest summary."""
    pinned: set[int] = set()
    first_user = latest_summary = None
    for index, (start, _end) in enumerate(units):
        message = messages[start]
        if message.role == "system":
            pinned.add(index)
        elif is_summary(message):
            latest_summary = index
        elif first_user is None and message.role == "user" and message.type == "text":
            first_user = index
    pinned.update(i for i in (first_user, latest_summary) if i is not None)
    return pinned


def tail_start(messages: Sequence[Message], units: list[Span], keep_turns: int) -> int:
    """The index in ``units`` where the last ``keep_turns`` turns begin (each with the user
    messages just before it, the question it answers); ``len(units)`` for none."""
    if keep_turns <= 0:
        return len(units)
    seen = 0
    for index in range(len(units) - 1, -1, -1):
        if _is_answer(messages[units[index][0]]):
            seen += 1
            if seen == keep_turns:
                while index > 0 and _is_question(messages[units[index - 1][0]]):
                    index -= 1
                return index
    return 0


def _is_question(message: Message) -> bool:
    return message.role == "user" and message.type == "text" and not is_summary(message)


def clear_tool_results(messages: list[Message], keep_turns: int,
                       tokens_of: Callable[[int], int]) -> tuple[list[Message], int]:
    """Every tool result before the tail, replaced by a line naming the tool and the tokens it
    held (``tokens_of(bytes)``); the results cleared. Results already cleared, and short
    ones, stay."""
    from agents_api.results import updated  # the loop's module: not loaded at boot

    units = spans(messages)
    tail = tail_start(messages, units, keep_turns)
    cut = units[tail][0] if tail < len(units) else len(messages)
    view = list(messages)
    cleared = 0
    for index in range(cut):
        message = messages[index]
        if message.type != "tool_result" or message.metadata.get("cleared"):
            continue
        content = message.content if isinstance(message.content, str) \
            else compact_json(message.content)
        if len(content) < _CLEAR_MIN_CHARS:
            continue
        name = message.payload.get("tool_name") or "the tool"
        tokens = tokens_of(len(content.encode()))
        view[index] = updated(message, content=(
            f"[result of {name} cleared: {tokens} tokens; call it again if needed]"),
            metadata={**message.metadata, "cleared": True})
        cleared += 1
    return view, cleared


def drop_oldest(messages: list[Message], keep_turns: int, over: int,
                size_of: Callable[[Message], int]) -> tuple[list[Message], int]:
    """Whole units before the tail removed, oldest first, until about ``over`` bytes are gone
    (``size_of`` a message's bytes as sent); the messages removed. Pinned units stay."""
    units = spans(messages)
    tail = tail_start(messages, units, keep_turns)
    pinned = _pinned(messages, units)
    dropped: set[int] = set()
    freed = 0
    for index in range(tail):
        if freed >= over:
            break
        if index in pinned:
            continue
        start, end = units[index]
        dropped.add(index)
        freed += sum(size_of(messages[i]) for i in range(start, end))
    if not dropped:
        return messages, 0
    view: list[Message] = []
    removed = 0
    for index, (start, end) in enumerate(units):
        if index in dropped:
            removed += end - start
        else:
            view.extend(messages[start:end])
    return view, removed


def split_for_summary(messages: list[Message], keep_turns: int
                      ) -> tuple[list[Message], list[Message], list[Message]] | None:
    """``(head, summarized, tail)``: the pinned messages before the tail (system messages, the
    first user message), what a summary replaces (every other message before the tail, an
    earlier summary included), and the tail; None when there is nothing to summarize."""
    units = spans(messages)
    tail = tail_start(messages, units, keep_turns)
    pinned = _pinned(messages, units)
    head: list[Message] = []
    summarized: list[Message] = []
    for index in range(tail):
        start, end = units[index]
        keep = index in pinned and not is_summary(messages[start])
        (head if keep else summarized).extend(messages[start:end])
    if not summarized or all(is_summary(m) for m in summarized):
        return None
    cut = units[tail][0] if tail < len(units) else len(messages)
    return head, summarized, messages[cut:]


def summary_message(text: str, *, turn: int, covers: int) -> Message:
    """The message that stands for the summarized turns (marked ``metadata.compaction``)."""
    return Message.text("user", f"[Summary of the earlier conversation]\n{text}", {
        COMPACTION_KEY: {"strategy": "summarize", "turn": turn, "covers": covers}})


def summary_request_text(messages: Sequence[Message], limit: int) -> str:
    """What the summary call reads: the summarized messages as plain text (long ones cut),
    the most recent kept when all of them would pass ``limit`` characters. Plain text, not the
    chat itself, so no provider sees tool results without their tool definitions."""
    lines = [_render(message) for message in messages]
    total, kept = 0, 0
    for line in reversed(lines):
        if total + len(line) + 1 > limit and kept:
            break
        total += len(line) + 1
        kept += 1
    shown = lines[len(lines) - kept:]
    if kept < len(lines):
        shown.insert(0, f"[{len(lines) - kept} earlier message(s) left out]")
    return "\n".join(shown)


def _render(message: Message) -> str:
    content = message.content if isinstance(message.content, str) \
        else compact_json(message.content)
    if message.type == "tool_call":
        name = message.payload.get("tool_name")
        text = f"Assistant called {name} with {compact_json(message.payload.get('parameters'))}"
    elif message.type == "tool_result":
        text = f"Tool {message.payload.get('tool_name')} returned: {content}"
    elif is_summary(message):
        text = f"Earlier summary: {content}"
    else:
        text = f"{message.role.capitalize()}: {content}"
    if len(text) > _RENDER_CHARS:
        text = text[:_RENDER_CHARS] + f" [... {len(text) - _RENDER_CHARS} characters cut]"
    return text


def view_problem(messages: Sequence[Message]) -> str | None:
    """Why ``messages`` cannot be sent as a request, or None: a tool result whose call is not
    before it, or a call whose result is missing."""
    open_calls: dict[str, str] = {}
    for message in messages:
        if message.type == "tool_call":
            open_calls[str(message.metadata.get("tool_call_id", ""))] = str(
                message.payload.get("tool_name", ""))
        elif message.type == "tool_result":
            call_id = str(message.metadata.get("tool_call_id", ""))
            if call_id not in open_calls:
                return (f"the result of call {call_id!r} "
                        f"({message.payload.get('tool_name')}) has no call before it")
            del open_calls[call_id]
    if open_calls:
        call_id, name = next(iter(open_calls.items()))
        return f"call {call_id!r} ({name}) has no result"
    return None

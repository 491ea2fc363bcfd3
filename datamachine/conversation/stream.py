"""Streaming a run: :func:`astream_conversation` and :func:`stream_conversation`.

A chat UI or a CLI wants the answer as it is written, not when it is done. A streamed run is an
ordinary run (the same budgets, rails, pressure, summary, nudges and transcript) whose events,
and whose provider's text as it arrives, are handed to the caller as :class:`StreamEvent`s, the
last one carrying the ``ConversationResult``. The run itself goes on in a task of its own, so a
slow consumer never holds up a tool, and a consumer that stops reading (``break``) asks the run
to stop at its next safe point: the provider's stream is closed, nothing further runs, and the
run ends ``aborted`` with its transcript stored and its lock released, as at any other end.

The synchronous :func:`stream_conversation` runs the async stream on a background thread's own
event loop and hands the events over a queue.

Between two turns a streamed run waits until its consumer has taken every event so far (not
between a turn's tool calls: a tool never waits for the consumer). A run whose provider and
tools never await anything would otherwise run to its end before the consumer saw its first
event, and a consumer that leaves at the second turn would leave a run that had already spent
its whole budget.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from datamachine.conversation.result import ConversationResult

if TYPE_CHECKING:
    from datamachine.host import Services

__all__ = ["StreamEvent", "astream_on", "event_data", "from_loop_event", "stream_on"]

StreamEventType = Literal["text_delta", "tool_call", "tool_result", "event", "result"]


class StreamEvent(BaseModel):
    """One thing a streamed run reports, by ``type``:

    * ``text_delta``: ``text``, the next piece of the model's answer;
    * ``tool_call``: ``tool_call``, ``{"id", "name", "parameters"}``, about to run;
    * ``tool_result``: ``tool_result``, the call's result as in ``tool_execution_results``;
    * ``event``: ``event`` and ``payload``, any other loop event (``turn_started``,
      ``budget_exceeded``, ...);
    * ``result``: ``result``, the ``ConversationResult``; always the last one.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    type: StreamEventType
    text: str | None = None
    tool_call: dict[str, Any] | None = None
    tool_result: dict[str, Any] | None = None
    event: str | None = None
    payload: dict[str, Any] | None = None
    result: ConversationResult | None = None


def event_data(event: StreamEvent) -> Any:
    """What one event carries, as JSON-ready data (the ``data:`` of a Server-Sent Event)."""
    if event.type == "text_delta":
        return {"text": event.text}
    if event.type == "tool_call":
        return event.tool_call
    if event.type == "tool_result":
        return event.tool_result
    if event.type == "event":
        return {"event": event.event, "payload": event.payload}
    return event.result.model_dump(mode="json") if event.result is not None else None


def from_loop_event(event: str, payload: dict[str, Any]) -> StreamEvent:
    """A loop event (``event_sink`` call) as a StreamEvent."""
    if event == "tool_call":
        return StreamEvent(type="tool_call", tool_call={
            "id": payload.get("tool_call_id"), "name": payload.get("tool_name"),
            "parameters": payload.get("parameters")})
    if event == "tool_result":
        return StreamEvent(type="tool_result", tool_result={
            "tool_name": payload.get("tool_name"), "tool_call_id": payload.get("tool_call_id"),
            "success": payload.get("success"), "turn": payload.get("turn"),
            "result": payload.get("result")})
    return StreamEvent(type="event", event=event, payload=dict(payload))


def _chained(sink: Any, put: Callable[[str, dict[str, Any]], None]) -> Callable[..., None]:
    """The run's event sink: the caller's own (if any), then the stream."""
    forward = getattr(sink, "emit", sink) if sink is not None else None

    def emit(event: str, payload: dict[str, Any]) -> None:
        if forward is not None:
            forward(event, payload)
        put(event, payload)

    return emit


async def astream_on(services: Services, messages: Any, tools: Any = None,
                     provider: str | None = None, model: str | None = None,
                     mode: Any = "pipeline", payload: dict[str, Any] | None = None,
                     max_turns: int | None = None, single_turn: bool = False, *,
                     output_type: Any = None,
                     consumer_caught_up: Callable[[], Awaitable[None]] | None = None,
                     ) -> AsyncGenerator[StreamEvent, None]:
    """Run one conversation on ``services`` (a host), yielding its events as they happen.
    ``consumer_caught_up``: what else a turn waits for (the synchronous stream's consumer in
    its own thread); a turn always waits until every earlier event was taken from here."""
    from datamachine.conversation.conversation_run import ConversationRun
    from datamachine.conversation.payload import check_event_sink, payload_mapping
    from datamachine.host import with_output_type

    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    taken = asyncio.Event()  # every event so far was taken by the consumer
    taken.set()

    def put(event: StreamEvent) -> None:
        taken.clear()
        events.put_nowait(event)

    async def between_turns() -> None:
        await taken.wait()
        if consumer_caught_up is not None:
            await consumer_caught_up()

    given = dict(payload_mapping(payload))
    # Checked before it is wrapped: inside the stream's own sink it would pass the payload
    # check, then raise at every event and starve the stream.
    given["event_sink"] = _chained(
        check_event_sink(given.get("event_sink")),
        lambda event, data: put(from_loop_event(event, data)))
    run = ConversationRun.create(
        services, messages, tools, provider, model, mode, with_output_type(given, output_type),
        max_turns, single_turn,
        on_text=lambda text: put(StreamEvent(type="text_delta", text=text)),
        between_turns=between_turns)
    task = asyncio.ensure_future(run.arun())
    try:
        while True:
            waiting = asyncio.ensure_future(events.get())
            await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
            if waiting.done():
                if events.empty():
                    taken.set()
                yield waiting.result()
                continue
            waiting.cancel()
            while not events.empty():
                yield events.get_nowait()
            break
        yield StreamEvent(type="result", result=task.result())
    finally:
        if not task.done():
            # The consumer left: the run stops at its next safe point and stores its end.
            run.request_stop()
            taken.set()  # a turn waiting for the consumer goes on, to stop
            await asyncio.shield(task)


_DONE = object()


def stream_on(services: Services, *args: Any, **kwargs: Any) -> Iterator[StreamEvent]:
    """:func:`astream_on` for synchronous callers: the run goes on in a background thread
    with its own event loop; events come over a queue as they happen."""
    handoff: queue.Queue[Any] = queue.Queue()
    leave = threading.Event()
    # The consumer came back for more with nothing left to take: a turn may start.
    idle = threading.Event()

    def wait_for_consumer() -> None:
        while not (idle.is_set() or leave.is_set()):
            idle.wait(0.1)  # bounded: it looks at leave again

    async def caught_up() -> None:
        if not (idle.is_set() or leave.is_set()):
            await asyncio.to_thread(wait_for_consumer)

    async def pump() -> None:
        stream = astream_on(services, *args, consumer_caught_up=caught_up, **kwargs)
        try:
            async for item in stream:
                idle.clear()
                handoff.put(item)
                if leave.is_set():
                    break
        except BaseException as exc:  # handed to the caller's thread
            handoff.put(exc)
        finally:
            await stream.aclose()
            handoff.put(_DONE)

    # The caller's context goes with the run (its current trace span, a bound host).
    caller_context = contextvars.copy_context()
    worker = threading.Thread(target=lambda: caller_context.run(asyncio.run, pump()),
                              name="datamachine-stream", daemon=True)
    worker.start()
    try:
        while True:
            if handoff.empty():
                idle.set()
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        leave.set()
        worker.join()

"""Driving a step generator, synchronously or inside an event loop, and deadlines.

The loop body yields whatever it must await. :func:`drive_sync` answers those yields without an
event loop until one is actually needed (so an all-sync run pays no asyncio cost per turn), and
:func:`drive_async` awaits them in the caller's loop. :func:`bounded` and :func:`call_in_thread`
let a wall-clock rail cut a provider or tool call that is still running.

Public for products built on the loop that write their own step generators (datamachine's final
summary call is one): :data:`Steps`, :func:`awaitable`, :func:`resume_async`.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Generic, TypeGuard, TypeVar, TypeVarTuple, cast

from agents_api.errors import InvalidLoopArgument
from agents_api.results import Decision, StopVerdict, TurnAnswer, TurnResult

if TYPE_CHECKING:  # asyncio loads only when a run really awaits something
    import asyncio

__all__ = ["DeadlineReached", "Steps", "ThreadCall", "awaitable", "bounded", "call_in_thread",
           "drive_async", "drive_sync", "resume_async", "run_steps"]

logger = logging.getLogger("agents_api.loop")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# A step generator: it yields what must be awaited and is sent back what that gave (any
# value: the generator knows what it asked for and narrows it), and returns a T.
Steps = Generator[Awaitable[object], object, T]


def drive_sync(steps: Steps[T]) -> T:
    """Run a step generator to completion, awaiting yielded awaitables on a private loop."""
    loop: asyncio.AbstractEventLoop | None = None
    try:
        pending = next(steps)
        while True:
            if type(pending) is ThreadCall and _no_running_loop():
                # A sync call under a deadline: a thread and a timed wait, no event loop.
                try:
                    value = pending.run()
                except BaseException as exc:
                    pending = steps.throw(exc)
                    continue
                if not inspect.isawaitable(value):
                    pending = steps.send(value)
                    continue
                # An executor that returned a coroutine from its thread: await it as before.
                pending = bounded(value, pending.seconds)
            if loop is None:
                import asyncio  # here, not on every run: most runs never await

                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    loop = asyncio.new_event_loop()
                else:
                    close = getattr(pending, "close", None)
                    if close is not None:
                        close()
                    steps.close()
                    raise InvalidLoopArgument(
                        "An async callable was used from the synchronous run_loop inside a "
                        "running event loop; call arun_loop (or arun_conversation) instead."
                    )
            try:
                value = loop.run_until_complete(as_coroutine(pending))
            except BaseException as exc:  # handed back so the loop body decides what it means
                pending = steps.throw(exc)
            else:
                pending = steps.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        if loop is not None:
            # As asyncio.run does: async generators the run left open (an HTTP stream's, read
            # up to its last event) are closed on the loop that ran them. Closed later by the
            # garbage collector, their close was a task on a loop already gone: "Task was
            # destroyed but it is pending! ... async_generator_athrow".
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()


async def drive_async(steps: Steps[T]) -> T:
    """Run a step generator to completion inside the running event loop."""
    try:
        pending = next(steps)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return await resume_async(steps, pending)


async def resume_async(steps: Steps[T], pending: Awaitable[object]) -> T:
    """Finish a step generator whose first awaitable ``pending`` was already yielded.

    Lets a caller run the synchronous prefix of a generator itself and only go async when
    something really has to be awaited.
    """
    try:
        while True:
            try:
                value = await pending
            except BaseException as exc:
                pending = steps.throw(exc)
            else:
                pending = steps.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def run_steps(steps: Steps[T]) -> T | Awaitable[T]:
    """Run ``steps`` synchronously until it must await something; then return a coroutine that
    finishes it. A hook that is usually synchronous (a stop handler) stays synchronous."""
    try:
        pending = next(steps)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return resume_async(steps, pending)


# What the loop's callables return on the synchronous path; no value of these exact types can be
# awaited, so the per-turn checks skip inspect.isawaitable's ABC lookup for them.
_PLAIN_TYPES = frozenset({type(None), bool, int, str, dict, list, TurnAnswer, TurnResult,
                          Decision, StopVerdict})


def awaitable(value: object) -> TypeGuard[Awaitable[object]]:
    """``inspect.isawaitable(value)``, answered at once for the plain values above."""
    return type(value) not in _PLAIN_TYPES and inspect.isawaitable(value)


async def as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


class DeadlineReached(Exception):
    """A provider or tool call was still running when the run's time rail was spent."""


async def bounded(awaitable: Awaitable[T], seconds: float) -> T:
    """Await with a deadline; the awaited call is cancelled when it passes."""
    import asyncio

    try:
        if seconds <= 0:
            raise TimeoutError
        value = await asyncio.wait_for(as_coroutine(awaitable), timeout=seconds)
    except TimeoutError:
        # A call cancelled before it started is closed, so nothing warns "never awaited".
        if inspect.iscoroutine(awaitable) and (
            inspect.getcoroutinestate(awaitable) == inspect.CORO_CREATED
        ):
            awaitable.close()
        raise DeadlineReached from None
    if inspect.isawaitable(value):  # an executor that returned a coroutine from its thread
        return await bounded(value, seconds)
    return value


async def call_in_thread(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """Run ``fn`` in a daemon thread: a hung sync tool can be abandoned, never joined."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    # The caller's context variables (a tracing span, a bound host) go with the call.
    context = contextvars.copy_context()

    def deliver(value: T | None, error: BaseException | None) -> None:
        if future.done():
            logger.warning("agents_api: discarded the late result of %r", fn)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(cast("T", value))  # no error: fn's own result

    def target() -> None:
        value: T | None
        try:
            value, error = context.run(fn, *args), None
        except BaseException as exc:  # handed to the waiting run
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the run's loop is gone: nobody is waiting any more
            logger.warning("agents_api: discarded the late result of %r", fn)

    threading.Thread(target=target, daemon=True, name="agents_api-tool").start()
    return await future


def _no_running_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


class ThreadCall(Generic[*Ts]):
    """``fn(*args)`` in a daemon thread, given up on after ``seconds``: what the loop yields for
    a sync call under a wall-clock rail.

    Awaited (``arun_loop``), it is ``bounded(call_in_thread(fn, *args), seconds)``.
    :func:`drive_sync` calls :meth:`run` instead: the same thread and the same deadline, waited
    for with a timed ``Event.wait``, so a synchronous run under a time rail pays a thread per
    call but no event-loop round trip.
    """

    __slots__ = ("args", "fn", "seconds")

    def __init__(self, fn: Callable[[*Ts], object], args: tuple[*Ts], seconds: float) -> None:
        self.fn = fn
        self.args = args
        self.seconds = seconds

    def __await__(self) -> Generator[object, None, object]:
        return bounded(call_in_thread(self.fn, *self.args), self.seconds).__await__()

    def run(self) -> object:
        """Call ``fn`` in a daemon thread and wait; :class:`DeadlineReached` past ``seconds``."""
        import threading

        if self.seconds <= 0:
            raise DeadlineReached
        fn, args = self.fn, self.args
        context = contextvars.copy_context()  # as in call_in_thread
        done = threading.Event()
        outcome: list[tuple[object, BaseException | None]] = []
        lock = threading.Lock()

        def target() -> None:
            try:
                value, error = context.run(fn, *args), None
            except BaseException as exc:  # handed to the waiting run
                value, error = None, exc
            with lock:
                if done.is_set():  # the run stopped waiting
                    logger.warning("agents_api: discarded the late result of %r", fn)
                    return
                outcome.append((value, error))
                done.set()

        threading.Thread(target=target, daemon=True, name="agents_api-tool").start()
        if not done.wait(self.seconds):
            with lock:
                if not outcome:
                    done.set()  # tells the thread nobody is waiting any more
                    raise DeadlineReached
        value, error = outcome[0]
        if error is not None:
            raise error
        return value

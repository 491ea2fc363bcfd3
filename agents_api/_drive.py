"""Driving the loop's step generator, synchronously or inside an event loop, and deadlines.

The loop body yields whatever it must await. :func:`drive_sync` answers those yields without an
event loop until one is actually needed (so an all-sync run pays no asyncio cost per turn), and
:func:`drive_async` awaits them in the caller's loop. :func:`bounded` and :func:`call_in_thread`
let a wall-clock rail cut a provider or tool call that is still running.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeGuard, TypeVar

from agents_api.errors import InvalidLoopArgument
from agents_api.results import Decision, TurnResult

__all__ = ["DeadlineReached", "Steps", "awaitable", "bounded", "call_in_thread", "drive_async",
           "drive_sync", "resume_async"]

logger = logging.getLogger("agents_api.loop")

T = TypeVar("T")
Steps = Generator[Awaitable[Any], Any, T]


def drive_sync(steps: Steps[T]) -> T:
    """Run a step generator to completion, awaiting yielded awaitables on a private loop."""
    loop: asyncio.AbstractEventLoop | None = None
    try:
        pending = next(steps)
        while True:
            if loop is None:
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
            loop.close()


async def drive_async(steps: Steps[T]) -> T:
    """Run a step generator to completion inside the running event loop."""
    try:
        pending = next(steps)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    return await resume_async(steps, pending)


async def resume_async(steps: Steps[T], pending: Awaitable[Any]) -> T:
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


# What the loop's callables return on the synchronous path; no value of these exact types can be
# awaited, so the per-turn checks skip inspect.isawaitable's ABC lookup for them.
_PLAIN_TYPES = frozenset({type(None), bool, int, str, dict, list, TurnResult, Decision})


def awaitable(value: object) -> TypeGuard[Awaitable[Any]]:
    """``inspect.isawaitable(value)``, answered at once for the plain values above."""
    return type(value) not in _PLAIN_TYPES and inspect.isawaitable(value)


async def as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


class DeadlineReached(Exception):
    """A provider or tool call was still running when the run's time rail was spent."""


async def bounded(awaitable: Awaitable[T], seconds: float) -> T:
    """Await with a deadline; the awaited call is cancelled when it passes."""
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


async def call_in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a daemon thread: a hung sync tool can be abandoned, never joined."""
    import threading

    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(value: Any, error: BaseException | None) -> None:
        if future.done():
            logger.warning("agents_api: discarded the late result of %r", fn)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:  # handed to the waiting run
            value, error = None, exc
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:  # the run's loop is gone: nobody is waiting any more
            logger.warning("agents_api: discarded the late result of %r", fn)

    threading.Thread(target=target, daemon=True, name="agents_api-tool").start()
    return await future

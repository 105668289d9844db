"""Glue the native module calls to run Python callables for the engine (internal)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Callable, Dict, Optional, Tuple


def schedule(loop: asyncio.AbstractEventLoop, ctx: contextvars.Context, fn: Callable[..., Any],
             args: Tuple[Any, ...], kwargs: Any, done: Any) -> None:
    """Runs coroutine function ``fn`` on ``loop`` in a copy of ``ctx``; reports to ``done``."""
    loop.call_soon_threadsafe(_start, loop, ctx, fn, args, kwargs or {}, done)


def _start(loop: asyncio.AbstractEventLoop, ctx: contextvars.Context, fn: Callable[..., Any],
           args: Tuple[Any, ...], kwargs: Dict[str, Any], done: Any) -> None:
    ctx = ctx.copy()
    try:
        coro = ctx.run(fn, *args, **kwargs)
        if not asyncio.iscoroutine(coro) and not isinstance(coro, asyncio.Future):
            done.finish(True, coro)
            return
        task = ctx.run(asyncio.ensure_future, coro, loop=loop)
    except BaseException as e:  # noqa: BLE001 - reported to the engine as the call's failure
        done.finish(False, e)
        return

    def _cb(t: "asyncio.Future[Any]") -> None:
        if t.cancelled():
            done.finish(False, asyncio.CancelledError())
        elif t.exception() is not None:
            done.finish(False, t.exception())
        else:
            done.finish(True, t.result())

    task.add_done_callback(_cb)


def call_in(ctx: contextvars.Context, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any],
            args: Tuple[Any, ...], kwargs: Any) -> Any:
    """Calls a plain function in a copy of the caller's context (from a worker thread). If it
    returns a coroutine, the coroutine runs on the caller's loop and this thread waits."""
    c = ctx.copy()
    result = c.run(fn, *args, **(kwargs or {}))
    if asyncio.iscoroutine(result):
        return c.run(asyncio.run_coroutine_threadsafe, result, loop).result()
    return result


def run_blocking(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Any) -> Any:
    """Runs coroutine function ``fn`` to completion from synchronous code."""
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    if not running:
        return asyncio.run(_await(fn, args, kwargs))
    # A loop runs on this thread (a sync tool API used inside async code): use another thread.
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            box["ok"] = asyncio.run(_await(fn, args, kwargs))
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=target, name="tidegate-coro")
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box.get("ok")


async def _await(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Any) -> Any:
    return await fn(*args, **(kwargs or {}))


def resolve_threadsafe(loop: asyncio.AbstractEventLoop, fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    """Resolves an asyncio future from another thread."""
    try:
        loop.call_soon_threadsafe(_resolve, fut, ok, value)
    except RuntimeError:
        pass  # the loop closed; nobody is waiting any more


def _resolve(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)

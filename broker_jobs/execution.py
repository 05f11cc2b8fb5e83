"""Running one handler: sync ones in a bounded thread pool, async ones on the loop,
each under a time limit, with the store's lease renewed while it runs.

Sync handlers run in threads so that a CPU-bound handler never starves the event
loop, which keeps AMQP heartbeats flowing. A sync handler that overruns its time
limit cannot be killed: the job is failed (and retried or dead-lettered) at the
limit, and the thread finishes in the background while the pool slot stays taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel

log = logging.getLogger(__name__)


class TimeLimitExceeded(Exception):
    """The handler ran longer than its task's time limit."""


class Executor:
    """Runs handlers; at most ``concurrency`` at once."""

    def __init__(self, concurrency: int) -> None:
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="broker-jobs-handler")
        #: Held from before a job is claimed until it is settled, so a job waiting
        #: for a slot holds no claim (and, on shutdown, can go back unclaimed).
        self.slots = asyncio.Semaphore(concurrency)

    async def run(
        self,
        handler: Callable[..., Any],
        payload: BaseModel,
        time_limit: float | None,
        renew_lease: Callable[[], Awaitable[None]],
        renew_every: float,
    ) -> Any:
        """Run ``handler(payload)``; raise what it raises, or TimeLimitExceeded. The
        caller holds one of :attr:`slots`."""
        renewer = asyncio.create_task(_renew_forever(renew_lease, renew_every))
        try:
            async with asyncio.timeout(time_limit) as limit:
                return await self.start(handler, payload)
        except TimeoutError:
            if limit.expired():  # else the handler's own TimeoutError: its failure
                raise TimeLimitExceeded(f"ran longer than {time_limit:g} s") from None
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    def start(self, handler: Callable[..., Any], payload: BaseModel) -> Awaitable[Any]:
        """Start ``handler(payload)``: a sync handler on the pool, an async one as a
        coroutine to await. The caller holds one of :attr:`slots`."""
        if inspect.iscoroutinefunction(handler):
            return handler(payload)  # type: ignore[no-any-return]
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._pool, functools.partial(handler, payload))

    def post(self, call: Callable[[], object]) -> None:
        """Run ``call()`` on a handler thread; callable from any thread. The call
        reports its own outcome (the fast path starts claimed jobs from the store's
        thread this way, without a hop through the event loop)."""
        self._pool.submit(call)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


async def _renew_forever(renew: Callable[[], Awaitable[None]], every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await renew()
        except Exception:  # a lost lease or an unreachable store: recording will tell
            log.warning("renewing a job's lease failed; it may run elsewhere", exc_info=True)
            return

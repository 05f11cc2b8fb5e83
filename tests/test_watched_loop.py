"""call_soon_from_thread: a self-pipe write only while the loop sleeps."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from collections.abc import Iterator

import pytest

from broker_jobs.watched_loop import WatchedLoop, call_soon_from_thread


@pytest.fixture
def watched() -> Iterator[asyncio.Runner]:
    with asyncio.Runner(loop_factory=WatchedLoop) as runner:
        yield runner


def _count_self_pipe_writes(loop: asyncio.AbstractEventLoop) -> list[int]:
    """How many times ``loop`` writes to its self-pipe from now on."""
    writes = [0]
    write = loop._write_to_self  # type: ignore[attr-defined]

    def counted() -> None:
        writes[0] += 1
        write()

    loop._write_to_self = counted  # type: ignore[attr-defined]
    return writes


def test_a_callback_from_a_thread_wakes_a_sleeping_loop(watched: asyncio.Runner) -> None:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        ran: asyncio.Future[str] = loop.create_future()
        # No timer and no I/O: the loop sleeps in select until the thread wakes it.
        threading.Thread(target=call_soon_from_thread, args=(loop, ran.set_result, "ran")).start()
        return await asyncio.wait_for(ran, 10)

    assert watched.run(main()) == "ran"


def test_a_busy_loop_takes_callbacks_without_a_self_pipe_write(watched: asyncio.Runner) -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        writes = _count_self_pipe_writes(loop)
        ran: list[int] = []
        queued = threading.Event()

        def queue_from_a_thread() -> None:
            for index in range(100):
                call_soon_from_thread(loop, ran.append, index)
            queued.set()

        thread = threading.Thread(target=queue_from_a_thread)
        thread.start()
        queued.wait(10)  # the loop is busy (here, not in select) meanwhile
        thread.join()
        while len(ran) < 100:
            await asyncio.sleep(0)
        return writes, ran == list(range(100))

    writes, in_order = watched.run(main())
    assert in_order
    assert writes == [0]


def test_no_callback_is_left_behind_a_sleeping_select(watched: asyncio.Runner) -> None:
    """Threads queue while the loop alternates between sleeping and working: every
    callback runs (a lost wake-up would leave the loop asleep with callbacks queued:
    no timer ends that select)."""
    threads, per_thread = 4, 2000

    async def main() -> int:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        count = 0

        def one() -> None:
            nonlocal count
            count += 1
            if count % 7 == 0:
                time.sleep(0.0001)  # busy: callbacks queue meanwhile
            if count == threads * per_thread:
                done.set()

        def queue(seed: int) -> None:
            pauses = random.Random(seed)
            for _ in range(per_thread):
                call_soon_from_thread(loop, one)
                if pauses.random() < 0.05:
                    time.sleep(pauses.random() / 1000)  # the loop falls asleep

        workers = [threading.Thread(target=queue, args=(seed,)) for seed in range(threads)]
        for thread in workers:
            thread.start()
        await asyncio.wait_for(done.wait(), 30)
        for thread in workers:
            thread.join()
        return count

    assert watched.run(main()) == threads * per_thread


def test_a_failing_callback_is_reported_and_the_next_still_runs(
    watched: asyncio.Runner,
) -> None:
    async def main() -> tuple[list[str], list[BaseException]]:
        loop = asyncio.get_running_loop()
        errors: list[BaseException] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context["exception"]))
        ran: list[str] = []
        done = asyncio.Event()

        def fail() -> None:
            raise ValueError("a bug")

        def queue() -> None:
            call_soon_from_thread(loop, fail)
            call_soon_from_thread(loop, ran.append, "next")
            call_soon_from_thread(loop, done.set)

        threading.Thread(target=queue).start()
        await asyncio.wait_for(done.wait(), 10)
        return ran, errors

    ran, errors = watched.run(main())
    assert ran == ["next"]
    assert [str(error) for error in errors] == ["a bug"]


def test_a_callback_runs_in_its_callers_context(watched: asyncio.Runner) -> None:
    """As with call_soon_threadsafe: a context variable the calling thread set is
    what the callback sees, on a busy loop and on a sleeping one alike."""
    job = contextvars.ContextVar("job", default="none")

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        done = asyncio.Event()

        def from_thread(name: str, last: bool) -> None:
            job.set(name)
            call_soon_from_thread(loop, lambda: seen.append(job.get()))
            if last:
                call_soon_from_thread(loop, done.set)

        busy = threading.Thread(target=from_thread, args=("busy", False))
        busy.start()
        busy.join()  # the loop was not in select: queued without a wake-up
        await asyncio.sleep(0)
        threading.Thread(target=from_thread, args=("asleep", True)).start()
        await asyncio.wait_for(done.wait(), 10)
        return seen

    assert watched.run(main()) == ["busy", "asleep"]
    assert job.get() == "none"


def test_any_other_loop_gets_call_soon_threadsafe() -> None:
    async def main() -> tuple[str, list[int]]:
        loop = asyncio.get_running_loop()
        writes = _count_self_pipe_writes(loop)
        ran: asyncio.Future[str] = loop.create_future()
        threading.Thread(target=call_soon_from_thread, args=(loop, ran.set_result, "ran")).start()
        return await asyncio.wait_for(ran, 10), writes

    result, writes = asyncio.run(main())
    assert result == "ran"
    assert writes == [1]


def test_a_callback_after_the_loop_closed_is_dropped() -> None:
    for factory in (WatchedLoop, asyncio.new_event_loop):
        loop = factory()
        loop.close()
        call_soon_from_thread(loop, print, "never")  # no error: the worker is gone

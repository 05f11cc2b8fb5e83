"""The handler threads (``broker_jobs.worker.execution.HandlerThreads``): no broker needed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading

import pytest

from broker_jobs.worker.execution import HandlerThreads


def test_posted_calls_run_on_the_threads_at_most_size_at_once() -> None:
    threads = HandlerThreads(3, "test-handler")
    gate = threading.Event()
    started = threading.Semaphore(0)
    names: list[str] = []
    running = peak = 0
    lock = threading.Lock()

    def call() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            names.append(threading.current_thread().name)
        started.release()
        gate.wait(timeout=30)
        with lock:
            running -= 1

    try:
        for _ in range(5):
            threads.post(call)
        for _ in range(3):
            assert started.acquire(timeout=30)
        gate.set()
        for _ in range(2):
            assert started.acquire(timeout=30)
    finally:
        gate.set()
        threads.shutdown()
    assert peak == 3
    assert {name.rsplit("_", 1)[0] for name in names} == {"test-handler"}


def test_submit_gives_the_result_or_the_error_through_run_in_executor() -> None:
    threads = HandlerThreads(2, "test-handler")

    def boom() -> None:
        raise ValueError("boom")

    async def main() -> tuple[int, BaseException | None]:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(threads, sum, [1, 2, 3])
        try:
            await loop.run_in_executor(threads, boom)
        except ValueError as error:
            return result, error
        return result, None

    try:
        result, error = asyncio.run(main())
    finally:
        threads.shutdown()
    assert result == 6
    assert isinstance(error, ValueError)


def test_a_future_cancelled_before_its_turn_never_runs() -> None:
    threads = HandlerThreads(1, "test-handler")
    gate = threading.Event()
    ran: list[str] = []
    try:
        threads.post(lambda: gate.wait(timeout=30))  # the only thread is busy
        waiting = threads.submit(ran.append, "late")
        assert waiting.cancel()
        gate.set()
    finally:
        threads.shutdown()  # waits for the threads: the cancelled call came and went
    assert ran == []
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result()


def test_nothing_is_posted_after_shutdown() -> None:
    threads = HandlerThreads(1, "test-handler")
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.post(lambda: None)


def test_post_all_runs_each_call_in_order_and_nothing_after_shutdown() -> None:
    threads = HandlerThreads(1, "test-handler")
    ran: list[int] = []
    threads.post_all([functools.partial(ran.append, index) for index in range(5)])
    threads.post_all([])  # nothing to hand over: no error
    threads.shutdown()  # waits: the calls posted before the shutdown ran
    assert ran == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="shut down"):
        threads.post_all([functools.partial(ran.append, 5)])
    assert ran == [0, 1, 2, 3, 4]

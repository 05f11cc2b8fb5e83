"""The SQLite store's own thread and its group commit (``docs/store.md``).

A commit of SQLite's with ``synchronous=FULL`` waits for the disk (an fsync:
milliseconds), and one writer at a time holds the file: a worker committing each
outcome on its own would spend its time waiting. So the worker's calls are queued
for one thread, which takes all that waits together and serves it together: the
claims first, as one (a job's start waits neither for the outcomes queued with it
nor for their fsync), then the outcomes in one transaction, one commit for all.
Each caller's future is settled only after its commit.

The store's methods do the writing; this thread only groups the calls and opens
the batch's transaction through the store (``SQLiteStore._batch``), which its
methods join.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker_jobs.store.errors import LeaseLostError

if TYPE_CHECKING:
    from broker_jobs.store.sqlite import SQLiteStore

log = logging.getLogger("broker_jobs.store.sqlite")  # the store's log

#: Methods that may share one transaction with others (they write nothing before
#: they can fail with LeaseLostError or ValueError, so one failing leaves the
#: others intact).
BATCHABLE = frozenset(
    {
        "succeed",
        "succeed_many",
        "succeed_many_keeping",
        "retry",
        "fail",
        "record_fire",
        "record_leader",
    }
)
#: Those whose commit may be synchronous=NORMAL (a loss to a power cut is harmless,
#: see ``SQLiteStore.claim``); a batch holding any other commits with FULL.
LAZY = frozenset({"record_leader"})
#: Served first, all queued ``claim_many`` calls as one (one statement for the
#: keys never seen): a job's start waits neither for the outcomes queued with it
#: nor for their fsync.
CLAIMS = frozenset({"claim", "claim_many"})

#: What a call came to: the call, whether it returned, and its result or exception.
Result = tuple["Call", bool, Any]


@dataclass(frozen=True, eq=False)  # compared by identity: args may hold large jobs
class Call:
    """A call waiting for the store's thread (see :meth:`SQLiteStore.submit`)."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    after: Callable[[Any], None] | None

    def run(self, store: SQLiteStore) -> Any:
        return getattr(store, self.name)(*self.args, **self.kwargs)


class StoreThread:
    """The thread that serves a store's queued calls, started by the first one."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards the start
        #: Held while the thread serves, and tried by ``SQLiteStore.try_claim_many``:
        #: that claim never waits for this process's writes.
        self.serving = threading.Lock()

    def submit(self, call: Call) -> None:
        """Queue ``call``, starting the thread if it is not running yet."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="broker-jobs-store", daemon=True
                    )
                    self._thread.start()
        self._queue.put(call)

    def stop(self) -> None:
        """Serve what is queued, then end the thread (unless this is that thread)."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._queue.put(None)
            thread.join()

    def _serve(self) -> None:
        while (calls := self._take_calls()) is not None:
            self._serve_calls(calls)

    def _serve_calls(self, calls: list[Call]) -> None:
        """Claims first (those that can, as one), then the outcomes in one transaction."""
        claims = [c for c in calls if c.name in CLAIMS]
        lazy = [c for c in calls if c.name in LAZY]
        durable = [c for c in calls if c.name in BATCHABLE and c.name not in LAZY]
        others = [c for c in calls if c.name not in BATCHABLE and c.name not in CLAIMS]
        many = [c for c in claims if c.name == "claim_many" and not c.kwargs]
        together = [c for c in many if c.args[1] == many[0].args[1]]  # same lease
        if together:
            self._answer(self._holding(self._claim_together, together))
        for call in claims:
            if call not in together:
                self._answer(self._holding(self._run_alone, call))
        for batch in (lazy, durable):
            if len(batch) == 1:  # its own statement(s), without BEGIN and COMMIT
                self._answer(self._holding(self._run_alone, batch[0]))
            elif batch:
                self._answer(self._holding(self._run_batch, batch))
        for call in others:
            self._answer(self._holding(self._run_alone, call))

    def _holding(self, run: Callable[[Any], list[Result]], calls: Any) -> list[Result]:
        """``run(calls)`` while holding :attr:`serving`; answered after: a claim the
        worker's loop tries meanwhile need not go the long way."""
        with self.serving:
            return run(calls)

    def _claim_together(self, calls: list[Call]) -> list[Result]:
        """The queued ``claim_many`` calls as one (one INSERT for their fresh keys)."""
        try:
            pairs = [pair for call in calls for pair in call.args[0]]
            claims = self._store.claim_many(pairs, calls[0].args[1])
        except BaseException as error:
            return [(call, False, error) for call in calls]
        results: list[Result] = []
        start = 0
        for call in calls:
            end = start + len(call.args[0])
            results.append((call, True, claims[start:end]))
            start = end
        return results

    def _run_alone(self, call: Call) -> list[Result]:
        try:
            return [(call, True, call.run(self._store))]
        except BaseException as error:
            return [(call, False, error)]

    def _run_batch(self, batch: list[Call]) -> list[Result]:
        """The calls in one transaction of the store: a call failing on its own
        (LeaseLostError, ValueError: nothing written) leaves the others; anything
        else undoes them all."""
        results: list[Result] = []
        try:
            with self._store._batch(durable=any(c.name not in LAZY for c in batch)):
                for call in batch:
                    try:
                        results.append((call, True, call.run(self._store)))
                    except (LeaseLostError, ValueError) as error:
                        results.append((call, False, error))
        except BaseException as error:
            return [(c, False, error) for c in batch]
        return results

    @staticmethod
    def _answer(results: list[Result]) -> None:
        """Run the follow-ups on this thread, then settle the callers' futures (one
        wake-up per event loop)."""
        for call, ok, value in results:
            if ok and call.after is not None:
                try:
                    call.after(value)
                except Exception:
                    log.exception("a store call's follow-up %r failed", call.after)
        by_loop: dict[Any, list[tuple[Any, bool, Any]]] = {}
        for call, ok, value in results:
            by_loop.setdefault(call.loop, []).append((call.future, ok, value))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(_settle, settled)

    def _take_calls(self) -> list[Call] | None:
        """The next call and all queued behind it; None once the store is closed."""
        call = self._queue.get()
        if call is None:
            return None
        calls = [call]
        while True:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                return calls
            if more is None:
                self._queue.put(None)  # seen again by the next take
                return calls
            calls.append(more)


def _settle(settled: list[tuple[Any, bool, Any]]) -> None:
    for future, ok, value in settled:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

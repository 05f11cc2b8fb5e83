"""The publishing of one side of ``bench.ab``, run with that side's code.

``bench.ab`` runs this file as a script (not as ``bench.ab_publish``) with the side's
tree first on ``PYTHONPATH``, so the jobs a side's worker drains were built and
encoded by that side's publisher: a change of what a job carries on the wire shows in
the worker's figures, and the steady phase's publish-to-start time includes the
side's own publish. It imports only the public ``broker_jobs`` API, which every
revision compared has.

    python bench/ab_publish.py burst URL NAMESPACE QUEUE_TYPE JOBS
    python bench/ab_publish.py steady URL NAMESPACE QUEUE_TYPE RATE SECONDS [START]
    python bench/ab_publish.py single URL NAMESPACE QUEUE_TYPE JOBS   # prints JSON
"""

from __future__ import annotations

import json
import sys
import time

from pydantic import BaseModel

from broker_jobs import App, JobRequest, Publisher, QueueOptions

#: The task and payload of ``bench.ab`` (its ``TASK`` and ``Noop``).
TASK = "bench.ab"


class Noop(BaseModel):
    n: int
    sent: float = 0.0


def burst(publisher: Publisher, jobs: int) -> None:
    """``jobs`` jobs in one pipelined batch."""
    publisher.publish_many([JobRequest(TASK, {"n": n}) for n in range(jobs)])


def steady(publisher: Publisher, rate: float, seconds: float, start: float | None = None) -> None:
    """One confirmed publish every 1/``rate`` s for ``seconds``, each carrying the
    time it was handed to the publisher; from ``start`` (``time.time()``) if given:
    two sides' publishers started with starts half a period apart take turns
    (``bench.ab_paired``)."""
    clock = time.perf_counter if start is None else time.time
    began = clock() if start is None else start
    for n in range(round(rate * seconds)):
        pause = began + n / rate - clock()
        if pause > 0:
            time.sleep(pause)
        publisher.publish(TASK, {"n": n, "sent": time.time()})


def single(publisher: Publisher, jobs: int) -> dict[str, float]:
    """``jobs`` confirmed publishes one by one (after one untimed, which connects):
    publishes a second, and this process's CPU per publish (µs)."""
    publisher.publish(TASK, {"n": -1})
    began, cpu = time.perf_counter(), time.process_time()
    for n in range(jobs):
        publisher.publish(TASK, {"n": n})
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    return {"per_s": jobs / elapsed, "cpu_us": cpu * 1e6 / jobs}


def main(argv: list[str]) -> int:
    mode, url, namespace, queue_type, *figures = argv
    app = App(namespace=namespace)
    app.declare(TASK, Noop, queue=QueueOptions(queue_type=queue_type))  # type: ignore[arg-type]
    with Publisher(url, app) as publisher:
        if mode == "burst":
            burst(publisher, int(figures[0]))
        elif mode == "single":
            print(json.dumps(single(publisher, int(figures[0]))))
        else:
            start = float(figures[2]) if len(figures) > 2 else None
            steady(publisher, float(figures[0]), float(figures[1]), start)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

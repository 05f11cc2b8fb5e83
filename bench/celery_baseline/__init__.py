"""Celery's drain rate on this machine, measured like the drain phase of bench.throughput.

The worker benchmark's aim is "at least Celery's rate on the same machine". This measures
that rate side by side: a Celery 5 worker (``-P solo -c 1`` and, for a multi-process point
of comparison, ``-P prefork -c 2``), ``task_acks_late=True``, a no-op task, persistent
messages, no result backend, in a durable quorum queue on the same broker.

Each round and variant: a fresh queue (and exchange) is declared, N tasks are published
with ``apply_async`` (untimed, no publisher confirms) until the queue holds N, then a
``celery worker`` subprocess starts. jobs/s = N / (the worker's ``worker_ready`` signal,
sent right after its ``basic.consume``, to the N-th task's completion). The same figure
measured from the subprocess's spawn (imports, connection, declarations included) is
printed too. The queue and exchange, and the native-delayed-delivery queues and exchanges
that Celery >= 5.5 declares for quorum queues (unless they existed before), are deleted
at the end of every round.

    python -m bench.celery_baseline --url amqp://guest:guest@localhost:5672/ --jobs 5000

Celery is an optional bench dependency (``pip install "celery>=5.4"``): without it this
exits with status 2. From other benchmarks: :func:`bench.celery_baseline.drain.drain_rate`
``(url, jobs)``. The last line of the output is one JSON object with every figure.

- :mod:`bench.celery_baseline.app`: the Celery app, publisher and worker alike;
- :mod:`bench.celery_baseline.drain`: one drain: its queue, its tasks, its worker process;
- :mod:`bench.celery_baseline.__main__`: the command (``python -m bench.celery_baseline``).
"""

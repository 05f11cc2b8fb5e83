"""Worker throughput and publish-to-start latency next to a raw aio-pika consumer.

Each variant consumes the same persistent jobs (published with ``Publisher``, confirmed)
from a durable quorum task queue of a fresh namespace, on the same broker, in the same
run. Two phases per variant and round:

- **drain**: N jobs are published first (untimed), then the consumer starts; jobs/s is
  N / (consumer start to the last job settled).
- **steady**: the consumer runs while another process publishes at a steady rate;
  latency is the handler's start (``time.time()``) minus the job's ``created_at``.

Rounds interleave the variants in a rotated order; the report gives medians over rounds
and the ratios worker / raw.

``--observe`` adds three variants of the SQLite worker, measured in the same rounds:
with its metrics (a :class:`WorkerMetrics` registry, as ``--metrics-port`` makes),
and with metrics and the outcome log lines at INFO, as JSON, to a file: one line per
success (``--log-successes each``), or the default summary line a second. Their cost
is reported as ratios to the plain SQLite worker.

    python -m bench.throughput --url amqp://guest:guest@localhost:5672/
    python -m bench.throughput --quick        # starts a throwaway RabbitMQ node
    python -m bench.throughput --observe --no-celery --jobs 2000 --rounds 3

The last line of the output is one JSON object with every figure.

- :mod:`bench.throughput.options`: the command line and the variants' names;
- :mod:`bench.throughput.handlers`: the app, what its handlers record, the timed stores;
- :mod:`bench.throughput.steady`: the steady phase's publisher, in its own process;
- :mod:`bench.throughput.variants`: the consumers measured: the worker's and raw aio-pika;
- :mod:`bench.throughput.rounds`: one round of every variant (and Celery's drain);
- :mod:`bench.throughput.report`: the table, the aims, the costs and the JSON line;
- :mod:`bench.throughput.__main__`: the run (``python -m bench.throughput``).
"""

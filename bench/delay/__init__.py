"""Lateness of delayed jobs: the delay ladder plus the consumer's hold.

For each job, lateness = (when the consumer starts running it) - (its ``due_at``).
Each round publishes jobs at a steady rate, in ticks of ``TICK`` seconds, with delays
drawn uniformly from [min, max] seconds (seeded), to one task of a fresh namespace;
jobs due in ``MAX_HOLD`` or more go through the delay ladder (25 quorum levels),
sooner ones straight to the task queue. The consumer runs in its own process, as a
worker would: aio-pika, manual ack, a prefetch above what the hold keeps in flight;
it decodes each message, holds it ``seconds_until_due`` with ``loop.call_later``,
then records the lateness and acks. Rounds run one after the other in fresh
namespaces; the report gives the median over rounds of each percentile.

    python -m bench.delay --url amqp://guest:guest@localhost:5672/
    python -m bench.delay --quick        # starts a throwaway RabbitMQ node


- :mod:`bench.delay.options`: the command line;
- :mod:`bench.delay.consumer`: the reference consumer, in its own process;
- :mod:`bench.delay.publishing`: the paced publisher of a round's delayed jobs;
- :mod:`bench.delay.rounds`: one round: a fresh namespace, its consumer, its jobs;
- :mod:`bench.delay.lateness`: a round's figures and the ones that must be 0;
- :mod:`bench.delay.report`: the lines, the table, the aims and the JSON line;
- :mod:`bench.delay.__main__`: the run (``python -m bench.delay``).
"""

"""Broker recovery: kill -9 the RabbitMQ node under load, time until jobs run again.

A throwaway RabbitMQ node (always: this bench kills it), two worker processes started
once with the ``broker-jobs worker`` command line and never restarted, and a publisher
thread sending a steady ``--rate`` of confirmed jobs, each with a unique key. The task's
handler is transactional: it inserts the job's key and the wall time it ran into an
``effects`` table through the store's own connection, so a job run twice shows as two
rows and a lost job as none.

Each round lets the load run steady for ``--steady`` seconds, kills the node
(``kill -9`` of beam), starts it again, and reports the time from the first moment the
AMQP port accepts a connection again ("broker up") to the first job that ran after it,
and to both workers logging that they consume again. At the end the publisher stops,
every confirmed job must run (lost: 0) and none twice (twice: 0), and the workers must
exit 0 on SIGTERM.

    python -m bench.recovery                   # 5 rounds at 200 jobs/s, ~1.5 min
    python -m bench.recovery --rounds 10 --steady 3
    python -m bench.recovery --store postgresql://postgres@127.0.0.1:5432/postgres

The last line of the output is one JSON object with every figure.

- :mod:`bench.recovery.options`: the command line;
- :mod:`bench.recovery.rounds`: the scenario: the app, the workers, each kill -9 and
  what is timed after it;
- :mod:`bench.recovery.tally`: the end: every confirmed job ran, none twice;
- :mod:`bench.recovery.report`: the lines, the summary, the aims and the JSON line;
- :mod:`bench.recovery.__main__`: the run (``python -m bench.recovery``).

The load is :class:`bench.load.Load`, the effects table :class:`bench.effects.Effects`
(shared with ``bench.faults``).
"""

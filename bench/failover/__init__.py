"""Beat failover: time from the leader's death (or pause) to the new leader's first emission.

Several beat processes (``--beats``, each running the real ``scheduler.Beat`` as
``broker-jobs beat`` does) share one SQLite store and one fresh namespace, whose app
has one task, ``bench.tick``, and one interval schedule firing every ``--interval``
seconds. Each child reports every emitted fire on its stdout (``on_emitted``: after the
publish confirm and the store's ``record_fire``), stamped with ``time.time()``.

- A **kill** round: the beat that emitted last is the leader; ``kill -9`` it at
  ``t0``. Failover = the first emission by another beat after ``t0``, minus ``t0``.
  A replacement (same identity) is started and must be running before the next round.
- A **pause** round: ``SIGSTOP`` the leader at ``t0``, failover as above (the broker
  drops the silent connection 2 to 3 heartbeats after its last byte); then ``SIGCONT``
  it: it must stand down and emit no fire later than ``t0``.

At the end, the fires emitted must form a contiguous sequence of the schedule's
instants (no gap); a fire emitted by two leaders (a duplicate, harmless thanks to the
fence key) is listed.

    python -m bench.failover --url amqp://guest:guest@localhost:5672/
    python -m bench.failover --kills 5 --pauses 1   # no URL: starts a throwaway node

The last line of the output is one JSON object with every figure.

- :mod:`bench.failover.options`: the command line;
- :mod:`bench.failover.app`: the benchmark's app, its schedule and the election's topology;
- :mod:`bench.failover.child`: one beat process (``--child``), reporting on its stdout;
- :mod:`bench.failover.beats`: the beat processes and the lines they print;
- :mod:`bench.failover.rounds`: the kill and pause rounds;
- :mod:`bench.failover.report`: the figures, the aims and what is printed;
- :mod:`bench.failover.__main__`: the run (``python -m bench.failover``).
"""

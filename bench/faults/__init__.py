"""Fault scenarios against throwaway nodes: ``python -m bench.faults``.

Each scenario runs real worker processes (``broker-jobs worker --concurrency 4``, the
command line an operator runs), a publisher of confirmed jobs with unique idempotency
keys, and two handler kinds: a transactional one, whose effect (a row of an
``effects`` table written through the store's own connection) commits with the job's
success, so a doubled effect is a bug; and a plain one, whose effect (a line appended
to a file) is at-least-once, so its re-runs are counted and reported. Then it breaks
something (worker processes, the broker, a cluster's leader, the network, the ledger's
database or disk, the broker's memory, a handler's time limit) and counts, at the end,
what every confirmed job became.

- :mod:`bench.faults.harness`: the nodes, the app, the ledger, the worker fleet, the
  loads, the drain and the tally every scenario shares;
- :mod:`bench.faults.scenarios`: the faults themselves;
- :mod:`bench.faults.__main__`: the command line and the report.

docs/reliability.md has the guarantees these check and a full run's figures.
"""

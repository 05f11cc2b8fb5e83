"""How fast the dashboard's pages answer, on the demo's data and on a big ledger.

Fills a store (SQLite by default; PostgreSQL with ``--store postgresql://...``) with
``--records`` ledger records (1,000,000 by default) through the store's own schema
(its tables, indexes and triggers), with a realistic spread of tasks, statuses and
times and a few executions per record; then serves the dashboard in-process (uvicorn
on a free port, in a thread) and times every page and JSON endpoint over real HTTP:
the first page of /jobs, a deep page through its cursor, filtered lists, a job's page,
the overview, the dead letters (the big ledger's index holds ``--dead-letters``,
100,000 by default: its dead jobs' and made-up ones). The same runs first for a
demo-sized ledger (``--demo-records``).

Beside the pages, the store queries behind them are timed on their own and, on
SQLite, their plans are printed (``EXPLAIN QUERY PLAN``: a ``SCAN`` of the records
is a query whose time grows with the ledger).

    python -m bench.dashboard                       # SQLite, 1,000,000 records
    python -m bench.dashboard --records 100000 --requests 10
    python -m bench.dashboard --store postgresql://user@localhost/db
    python -m bench.dashboard --store postgres      # a throwaway PostgreSQL node

The last line of the output is one JSON object with every figure.

- :mod:`bench.dashboard.rows`: the ledger's records and executions, made up;
- :mod:`bench.dashboard.fill`: writing them into an SQLite or PostgreSQL store;
- :mod:`bench.dashboard.letters`: the index of dead letters, filled deep;
- :mod:`bench.dashboard.timing`: timing the store's queries (and their SQLite plans);
- :mod:`bench.dashboard.claims`: what the dashboard's indexes cost a worker's claims;
- :mod:`bench.dashboard.pages`: the dashboard served in-process, its pages timed;
- :mod:`bench.dashboard.__main__`: the run (``python -m bench.dashboard``).

:func:`serving` is here too: ``scripts/dashboard_screenshots.py`` serves the dashboard
with it.
"""

from bench.dashboard.pages import serving

__all__ = ["serving"]

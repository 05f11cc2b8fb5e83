"""The peers of ``bench.compare``: raw aio-pika/pika, broker-jobs, Celery and Dramatiq.

Every peer's worker runs in its own process (group) and its no-op handler writes one
line per job to a record file (:mod:`bench.peers.common`), so the bench reads every
peer's job starts the same way: the same cost in each handler, the same clock.
"""

"""The worker daemon, one concept a module:

    daemon      Worker: sessions over a kept-up link, shutdown, burst mode, pruning
    link        the connection to the broker: failover, backoff, outage logging
    session     one connection's consuming: channel, consumers, how it ended
    prefetch_boost  each queue consumed twice while jobs run short
    in_place    deliveries taken as aiormq reads them (no task per delivery)
    protocol    the execution protocol, one delivery at a time (Runner)
    fast_path   the same protocol for the common delivery, in batches (FastPath)
    claims      what a claim's answer says: run, busy, or skip (both paths)
    settling    renew, record successes, ack, give back, leave (both paths)
    acks        when and how a recorded delivery is acked, per channel
    direct_frames  acks written to the transport at once when nothing waits
    execution   handler threads, running a handler under its limit and lease
    observer    each job's outcome line and metrics; the wrapper of handler calls
    dead_letters  a dead job's message and its reason
    delivery_limit  a job at its queue's delivery limit: a crash loop, or rescued
    ledger_gate   store calls held and retried through a ledger outage
    overrun     time limits: LimitWatch; sync handlers interrupted, then stuck
    supervisor  --processes: worker processes spawned and restarted
    levels      priority levels: which held job runs next
    delivery    a delivery's wire form and aio-pika view
    settings    WorkerSettings, ProtocolSettings
"""

from broker_jobs.worker.daemon import Worker
from broker_jobs.worker.settings import WorkerSettings

__all__ = ["Worker", "WorkerSettings"]

"""Publishing jobs: the sync (pika) and async (aio-pika) publishers and what they share.

``publisher`` and ``async_publisher`` are the two clients; ``prepare`` turns a call
into a validated, encoded, routed job and settles a batch's confirms for both;
``pika_link`` is the sync publisher's confirm-mode channel with deadlines; ``ledger``
records published jobs as queued when a publisher is given the ledger.
"""

from broker_jobs.publish.async_publisher import AsyncPublisher
from broker_jobs.publish.publisher import Publisher

__all__ = ["AsyncPublisher", "Publisher"]

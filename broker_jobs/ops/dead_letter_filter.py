"""Which dead letters an operation (list, replay, purge) takes: a
:class:`DeadLetterFilter` of reasons, an error's text, a time range and a job's id or
key. The command line's options and the dashboard's filter form both end up as one;
the ledger's index of dead letters answers one in SQL. It is the core's
(:mod:`broker_jobs.dead_letter`); this path gives it out as before."""

from __future__ import annotations

from broker_jobs.dead_letter import DeadLetterFilter

__all__ = ["DeadLetterFilter"]

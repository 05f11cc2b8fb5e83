"""Moved to :mod:`broker_jobs.ops.dead_letters` (0.1.0): this path warns."""

from broker_jobs._moved import alias

alias(__name__, "broker_jobs.ops.dead_letters")

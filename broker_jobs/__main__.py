"""``python -m broker_jobs ...``: the ``broker-jobs`` command, without its script on PATH."""

from broker_jobs.cli import main

main()

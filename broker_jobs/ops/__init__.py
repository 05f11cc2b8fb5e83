"""The operator's queries and actions, shared by the command line, the dashboard and
the exporter: ``status`` (each task's queues and ledger counts), ``dead_letters``
(read, replay, purge; its parts are the ``dead_letter_*`` modules), ``documents``
(ledger records as JSON, page cursors)."""

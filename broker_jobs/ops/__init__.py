"""The operator's queries and actions, shared by the command line, the dashboard and
the exporter: ``status`` (each task's queues and ledger counts), ``dead_letters``
(read, replay, purge), ``documents`` (ledger records as JSON, page cursors)."""

"""An example system run end to end by ``./scripts/demo`` (``python -m examples.demo.run``)."""

"""The package's version (one place: the command line, the heartbeats and
``broker_jobs.__version__`` read it; pyproject.toml's must match, tests check)."""

__version__ = "0.1.0"

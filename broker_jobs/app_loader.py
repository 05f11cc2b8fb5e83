"""Find the application's :class:`App` from a ``module:attr`` path (``--app``)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from broker_jobs.app import App
from broker_jobs.errors import ConfigurationError


def load_app(path: str) -> App:
    """Import ``module:attr`` (the attribute may be dotted) and check it is an App."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app {path!r}: use MODULE:ATTR, e.g. myproject.tasks:app")
    # Like celery and uvicorn: the project directory, where the operator runs the
    # command, is importable even when the console script's sys.path lacks it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ConfigurationError(
                f"--app {path!r}: no module named {missing!r} in the current directory or"
                " on PYTHONPATH: run from the project directory or set PYTHONPATH"
            ) from None
        raise ConfigurationError(
            f"--app {path!r}: importing {module_name!r} failed: {error}"
        ) from None
    except Exception as error:  # any import-time failure is the user's to see
        raise ConfigurationError(
            f"--app {path!r}: importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
            hint = f" (App objects there: {', '.join(apps)})" if apps else ""
            raise ConfigurationError(
                f"--app {path!r}: module {module_name!r} has no attribute {attribute!r}{hint}"
            )
        found = getattr(found, part)
    if not isinstance(found, App):
        raise ConfigurationError(
            f"--app {path!r} is a {type(found).__name__}, not a broker_jobs.App"
        )
    return found

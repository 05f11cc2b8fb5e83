"""Find the application's :class:`App` from a ``module:attr`` path (``--app``)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback
from typing import Any

from broker_jobs.app import App
from broker_jobs.errors import ConfigurationError

log = logging.getLogger(__name__)


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
        raise _import_failed(path, module_name, error) from None
    except Exception as error:  # any import-time failure is the user's to see
        raise _import_failed(path, module_name, error) from None
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


def _import_failed(path: str, module_name: str, error: BaseException) -> ConfigurationError:
    """The error of an app module that raised on import: where (the file and line
    that raised, the user's code rather than the import machinery), and the whole
    traceback at DEBUG (``--log-level debug``)."""
    log.debug("importing %s failed", module_name, exc_info=error)
    where = _where(error)
    return ConfigurationError(
        f"--app {path!r}: importing {module_name!r} failed{where}:"
        f" {type(error).__name__}: {error} (--log-level debug shows the traceback)"
    )


def _where(error: BaseException) -> str:
    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if "importlib" not in frame.filename and not frame.filename.startswith("<frozen")
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""

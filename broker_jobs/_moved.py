"""Old import paths of modules moved into packages in 0.1.0, kept for one release.

A module left at its old path calls :func:`alias`: importing it warns and hands out
the module at its new path, so both names are one module (one ``Publisher`` class,
``isinstance`` holds across them). The CHANGELOG lists every move.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make ``import old`` give module ``new``, with a DeprecationWarning."""
    warnings.warn(
        f"{old} moved to {new} in broker-jobs 0.1.0 and the old path goes in the next"
        f" release: import from {new} (or from broker_jobs, for the public API)",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)

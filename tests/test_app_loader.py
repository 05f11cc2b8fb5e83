"""``--app MODULE:ATTR``: an app module that fails on import is reported with the file
and line that raised, and its traceback at ``--log-level debug``."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from broker_jobs.app_loader import load_app
from broker_jobs.errors import ConfigurationError


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_error_raised_on_import_names_the_file_and_line_and_logs_the_traceback(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (project / "broken_app.py").write_text(
        textwrap.dedent("""
            from broker_jobs import App

            app = App(namespace="x")
            SETTINGS = {}
            TIMEOUT = SETTINGS["timeout"]
        """)
    )
    with (
        caplog.at_level(logging.DEBUG, "broker_jobs.app_loader"),
        pytest.raises(ConfigurationError) as caught,
    ):
        load_app("broken_app:app")
    message = str(caught.value)
    assert f"at {project / 'broken_app.py'}:6: KeyError: 'timeout'" in message, message
    assert "--log-level debug" in message
    [record] = caplog.records
    assert record.exc_info is not None
    assert "Traceback" in caplog.text
    assert 'TIMEOUT = SETTINGS["timeout"]' in caplog.text


def test_a_syntax_error_names_its_line(project: Path) -> None:
    (project / "typo_app.py").write_text("app = (\n")
    with pytest.raises(ConfigurationError, match=r"typo_app\.py:1: SyntaxError"):
        load_app("typo_app:app")


def test_a_missing_module_the_app_imports_names_the_importing_line(project: Path) -> None:
    (project / "needs_app.py").write_text("import json\nimport not_installed_anywhere\n")
    with pytest.raises(ConfigurationError) as caught:
        load_app("needs_app:app")
    assert f"{project / 'needs_app.py'}:2: ModuleNotFoundError" in str(caught.value)

"""The observability server (/metrics, /healthz, /readyz) and the daemons' logging
(text or JSON lines, passwords masked), without a broker."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from broker_jobs.job_context import JobContext
from broker_jobs.observe import Health, ObservabilityServer, configure_logging
from broker_jobs.observe.server import process_registry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("broker_jobs_test_things", "Things", ["task"], registry=registry).labels("a").inc(3)
    return registry


def test_metrics_and_probes_are_served_and_say_why_when_not_ready(
    registry: CollectorRegistry,
) -> None:
    clock, state = Clock(), {"ready": (False, "connecting to the broker")}
    health = Health(lambda: state["ready"], stall_after=10, clock=clock)
    with ObservabilityServer(registry, health, port=0, host="127.0.0.1") as server:
        status, text = get(server.port, "/metrics")
        assert status == 200
        assert 'broker_jobs_test_things_total{task="a"} 3.0' in text
        assert get(server.port, "/healthz") == (200, '{"ok": true, "status": "alive"}\n')
        status, body = get(server.port, "/readyz")
        assert (status, json.loads(body)) == (
            503,
            {"ok": False, "status": "connecting to the broker"},
        )
        state["ready"] = (True, "consuming")
        assert get(server.port, "/readyz")[0] == 200
        assert get(server.port, "/nothing")[0] == 404


def test_a_daemons_registry_has_the_process_metrics() -> None:
    registry = process_registry()
    for name in (
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ):
        value = registry.get_sample_value(name)
        assert value is not None, name
        assert value > 0, name
    assert registry.get_sample_value("process_cpu_seconds_total") is not None
    assert any(
        sample.name == "python_info" for metric in registry.collect() for sample in metric.samples
    )
    assert process_registry() is not registry  # one per daemon, nothing bound at import


def test_a_stalled_event_loop_fails_both_probes(registry: CollectorRegistry) -> None:
    clock = Clock()
    health = Health(lambda: (True, "consuming"), stall_after=10, clock=clock)
    with ObservabilityServer(registry, health, port=0, host="127.0.0.1") as server:
        clock.now += 9
        assert get(server.port, "/healthz")[0] == 200
        clock.now += 2  # 11 s without a beat
        status, body = get(server.port, "/healthz")
        assert status == 503
        assert "has not turned for 11.0 s" in json.loads(body)["status"]
        assert get(server.port, "/readyz")[0] == 503
        health.beat()
        assert get(server.port, "/healthz")[0] == 200


def test_a_readiness_check_that_raises_answers_not_ready(registry: CollectorRegistry) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("no state yet")

    with ObservabilityServer(registry, Health(broken), port=0, host="127.0.0.1") as server:
        status, body = get(server.port, "/readyz")
        assert status == 503
        assert "RuntimeError: no state yet" in body


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put them back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _fail_with(message: str) -> None:
    raise ValueError(message)


@pytest.mark.usefixtures("root_logging")
def test_json_logs_are_one_object_per_line_with_fields_and_no_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "json")
    log = logging.getLogger("broker_jobs.worker")
    log.info(
        "job %s failed on amqp://app:s3cret@mq1/prod",
        "j-1",
        extra={"job_id": "j-1", "task": "mail.send", "attempt": 2},
    )
    log.debug("not at info")
    try:
        _fail_with("cannot reach postgresql://app:hunter2@db/jobs")
    except ValueError:
        log.exception("the store failed")
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["message"] == "job j-1 failed on amqp://app:***@mq1/prod"
    assert (first["level"], first["logger"], first["job_id"], first["attempt"]) == (
        "INFO",
        "broker_jobs.worker",
        "j-1",
        2,
    )
    assert first["time"].endswith("+00:00")
    assert second["level"] == "ERROR"
    assert "ValueError: cannot reach postgresql://app:***@db/jobs" in second["exc_info"]
    assert "s3cret" not in err
    assert "hunter2" not in err


@pytest.mark.usefixtures("root_logging")
def test_text_logs_mask_passwords_and_keep_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "text")
    log = logging.getLogger("broker_jobs.worker")
    log.info("dropped")
    log.warning("lost amqp://u:pw@host/ at last")
    try:
        _fail_with("amqp://u:pw@host/ refused")
    except ValueError:
        log.exception("gave up")
    err = capsys.readouterr().err
    assert "WARNING broker_jobs.worker: lost amqp://u:***@host/ at last" in err
    assert "ValueError: amqp://u:***@host/ refused" in err
    assert "dropped" not in err
    assert ":pw@" not in err


@pytest.mark.usefixtures("root_logging")
def test_a_text_line_from_a_messages_values_stays_one_line_without_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "text")
    forged = "job-1\n2026-01-01 00:00:00,000 INFO broker_jobs.worker: all clear\x1b[2J\x1b]0;x\x07"
    logging.getLogger("broker_jobs.worker").info("job %s failed", forged)
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "\x1b" not in err
    assert "\x07" not in err
    assert "job-1\\n2026-01-01" in err
    assert "\\x1b[2J" in err


@pytest.mark.usefixtures("root_logging")
def test_a_handlers_text_lines_name_its_job(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "text")
    JobContext.for_test(task="mail.send", job_id="j-7", attempt=2).log.info("sent to %s", "a@b.c")
    logging.getLogger("broker_jobs.worker").info("j-8 done", extra={"job_id": "j-8"})
    lines = capsys.readouterr().err.splitlines()
    handler_line = "INFO broker_jobs.handler: sent to a@b.c [mail.send job j-7 attempt 2]"
    assert lines[0].endswith(handler_line)
    assert lines[1].endswith("INFO broker_jobs.worker: j-8 done")  # its message names it


@pytest.mark.usefixtures("root_logging")
def test_the_drivers_connection_errors_show_only_at_debug_and_as_debug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    driver = logging.getLogger("aiormq.connection")
    configure_logging("info", "text")
    driver.error("error when creating transport: %r", ConnectionRefusedError(111))
    logging.getLogger("broker_jobs.worker.link").warning("lost the broker")
    err = capsys.readouterr().err
    assert "error when creating transport" not in err
    assert "WARNING broker_jobs.worker.link: lost the broker" in err
    configure_logging("debug", "text")
    driver.error("error when creating transport: %r", ConnectionRefusedError(111))
    err = capsys.readouterr().err
    assert "DEBUG aiormq.connection: error when creating transport" in err
    assert "ERROR" not in err


def test_bad_levels_and_formats_are_refused() -> None:
    with pytest.raises(ValueError, match="log level must be one of"):
        configure_logging("loud")
    with pytest.raises(ValueError, match="log format must be one of"):
        configure_logging("info", "xml")

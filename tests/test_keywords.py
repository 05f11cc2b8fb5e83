"""No silent options: an unknown keyword to a publish entry point or a declaration is
a ``TypeError`` naming it and, where one is close, the right one. No broker: each is
refused before anything connects."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App, AsyncPublisher, JobRequest, Publisher
from broker_jobs.cli import main

#: Nothing listens here: a publish that got past its options would fail to connect.
NOWHERE = "amqp://guest:guest@127.0.0.1:1/"


class Report(BaseModel):
    name: str


def make_app() -> App:
    app = App(namespace="kw")
    app.declare("report.build", Report)
    return app


def test_publish_refuses_celerys_countdown_and_names_delay() -> None:
    publisher = Publisher(NOWHERE, make_app())
    with pytest.raises(TypeError, match=r"'countdown'; did you mean 'delay'\?"):
        publisher.publish("report.build", Report(name="x"), countdown=5)  # type: ignore[call-arg]
    publisher.close()


def test_async_publish_refuses_a_typo_and_names_the_closest_option() -> None:
    async def publish() -> None:
        publisher = AsyncPublisher(NOWHERE, make_app())
        try:
            await publisher.publish(
                "report.build",
                Report(name="x"),
                idempotency_kye="k",  # type: ignore[call-arg]
            )
        finally:
            await publisher.close()

    with pytest.raises(TypeError, match=r"'idempotency_kye'; did you mean 'idempotency_key'\?"):
        asyncio.run(publish())


def test_a_keyword_with_nothing_close_is_named_with_what_is_taken() -> None:
    publisher = Publisher(NOWHERE, make_app())
    with pytest.raises(TypeError, match=r"'routing_hint' \(it takes: attempt, delay, eta"):
        publisher.publish("report.build", {"name": "x"}, routing_hint="a")  # type: ignore[call-arg]
    publisher.close()


def test_job_request_and_publish_many_refuse_unknown_keywords() -> None:
    with pytest.raises(TypeError, match=r"JobRequest\(\) got .*'countdown'; did you mean 'delay'"):
        JobRequest("report.build", {"name": "x"}, countdown=5)  # type: ignore[call-arg]
    publisher = Publisher(NOWHERE, make_app())
    with pytest.raises(TypeError, match=r"'on_confirm'; did you mean 'on_confirmed'"):
        publisher.publish_many([], on_confirm=print)  # type: ignore[call-arg]
    publisher.close()


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda app: app.task("a.b", max_retries=3), r"'max_retries'; did you mean 'retry'"),
        (lambda app: app.task("a.b", soft_time_limit=3), r"did you mean 'time_limit'"),
        (lambda app: app.declare("a.b", Report, shard=2), r"'shard'; did you mean 'shards'"),
        (lambda app: app.schedule("s", "a.b", every=5, timezon="UTC"), r"did you mean 'timezone'"),
    ],
)
def test_declarations_refuse_unknown_keywords(declare: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        declare(App(namespace="kw"))  # type: ignore[operator]


def test_the_cli_refuses_an_unknown_publish_option() -> None:
    result = CliRunner().invoke(main, ["publish", "--countdown", "5", "report.build", "{}"])
    assert result.exit_code == 2
    assert "--countdown" in result.output

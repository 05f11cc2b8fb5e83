"""The task registry."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from broker_jobs import (
    App,
    ConfigurationError,
    PayloadValidationError,
    QueueOptions,
    QueueType,
    UnknownTaskError,
)


class Resize(BaseModel):
    url: str
    width: int


class Crop(BaseModel):
    url: str


def test_declare_and_decorator_register_tasks() -> None:
    app = App()
    app.declare("image.resize", Resize)

    @app.task("image.thumbnail", queue=QueueOptions(queue_type=QueueType.CLASSIC))
    def thumbnail(payload: Resize) -> None:
        del payload

    assert "image.resize" in app
    assert len(app) == 2
    assert app.get("image.thumbnail").handler is thumbnail
    assert app.get("image.thumbnail").payload_model is Resize
    assert app.get("image.thumbnail").queue.queue_type is QueueType.CLASSIC
    assert app.get("image.resize").handler is None


def test_unknown_task_names_the_known_ones() -> None:
    app = App()
    app.declare("image.resize", Resize)
    with pytest.raises(UnknownTaskError, match=r"'image\.crop'.*image\.resize"):
        app.get("image.crop")
    # A typo gets the name it was most likely meant to be, as a keyword's typo does.
    with pytest.raises(
        UnknownTaskError, match=r"'image\.resise' \(did you mean 'image\.resize'\?\)"
    ):
        app.get("image.resise")


def test_validation_accepts_dicts_and_models_and_names_bad_fields() -> None:
    spec = App().declare("image.resize", Resize)
    assert spec.validate({"url": "u", "width": "12"}) == Resize(url="u", width=12)
    with pytest.raises(PayloadValidationError, match="width"):
        spec.validate({"url": "u", "width": "wide"})

    class Other(BaseModel):
        x: int

    with pytest.raises(PayloadValidationError, match="expected Resize, got Other"):
        spec.validate(Other(x=1))


def test_bad_declarations_fail_loudly() -> None:
    app = App()
    declared = app.declare("image.resize", Resize)
    assert app.declare("image.resize", Resize) is declared  # the same contract: one task
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.declare("image.resize", Crop)
    with pytest.raises(ConfigurationError, match="invalid task name"):
        app.declare("image.*", Resize)
    with pytest.raises(ConfigurationError, match="invalid task name"):
        app.declare("image.resize\n", Resize)  # a regex's $ would let it through
    with pytest.raises(ConfigurationError, match="invalid namespace"):
        App(namespace="has.dots")
    with pytest.raises(ConfigurationError, match="invalid namespace"):
        App(namespace="jobs\n")

    with pytest.raises(ConfigurationError, match="annotated with a pydantic model"):

        @app.task("untyped")
        def untyped(payload) -> None:  # type: ignore[no-untyped-def]
            del payload


def test_app_topology_lists_queues_and_dead_letter_queues() -> None:
    app = App(namespace="shop")
    app.declare("mail.send", Resize)
    topology = app.topology(ladder=False)
    assert [exchange.name for exchange in topology.exchanges] == [
        "shop.work",
        "shop.dead",
        "shop.delay.out",
    ]
    assert {queue.name for queue in topology.queues} == {
        "shop.task.mail.send",
        "shop.dead.mail.send",
    }
    task_queue = next(q for q in topology.queues if q.name == "shop.task.mail.send")
    assert task_queue.arguments == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "shop.dead",
        "x-dead-letter-routing-key": "mail.send",
        "x-delivery-limit": 10,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def test_classic_queues_carry_no_quorum_only_arguments() -> None:
    app = App()
    app.declare("a", Resize, queue=QueueOptions(queue_type="classic"))  # type: ignore[arg-type]
    queue = next(q for q in app.topology().queues if q.name == "jobs.task.a")
    assert queue.arguments == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "jobs.dead",
        "x-dead-letter-routing-key": "a",
    }
    with pytest.raises(ValueError, match="delivery_limit"):
        QueueOptions(delivery_limit=0)

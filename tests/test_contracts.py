"""One contract, two services: a contracts module declares tasks (model and queue
options); the worker binds handlers to them without declaring again; typed publishing
through the handle ``declare`` returns. No broker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from broker_jobs import App, ConfigurationError, QueueOptions

ROOT = Path(__file__).resolve().parent.parent


class Resize(BaseModel):
    url: str


class Crop(BaseModel):
    url: str


def contracts() -> App:
    """What a contracts module holds: the app and its declared tasks."""
    app = App(namespace="shop")
    app.declare("image.resize", Resize, shards=2)
    return app


def test_a_handler_binds_to_the_declared_task_with_its_queue_options() -> None:
    app = contracts()

    @app.handler("image.resize", time_limit=30)
    def resize(payload: Resize) -> None: ...

    spec = app.get("image.resize")
    assert spec.handler is resize
    assert spec.queue.shards == 2  # the contract's, not restated by the worker
    assert spec.time_limit == 30
    assert len(app) == 1


def test_app_task_on_a_declared_name_with_the_same_model_binds_too() -> None:
    app = contracts()

    @app.task("image.resize")
    def resize(payload: Resize) -> None: ...

    assert app.get("image.resize").handler is resize
    assert app.get("image.resize").queue.shards == 2


def test_a_handler_of_another_model_names_both() -> None:
    app = contracts()
    with pytest.raises(ConfigurationError) as caught:

        @app.handler("image.resize")
        def resize(payload: Crop) -> None: ...

    message = str(caught.value)
    assert "test_contracts.Resize" in message
    assert "test_contracts.Crop" in message
    assert "resize" in message


def test_other_queue_options_on_the_worker_side_name_both() -> None:
    app = contracts()
    with pytest.raises(ConfigurationError, match=r"shards=2.*shards=4"):

        @app.task("image.resize", shards=4)
        def resize(payload: Resize) -> None: ...


def test_binding_an_undeclared_task_or_a_second_handler_is_refused() -> None:
    app = contracts()
    with pytest.raises(ConfigurationError, match=r"'image.crop' is not declared"):
        app.handler("image.crop")

    @app.handler("image.resize")
    def first(payload: Resize) -> None: ...

    with pytest.raises(ConfigurationError, match=r"already has a handler"):

        @app.handler("image.resize")
        def second(payload: Resize) -> None: ...


def test_the_same_declaration_twice_is_one_task_and_a_different_one_names_both() -> None:
    app = contracts()
    again = app.declare("image.resize", Resize, shards=2)
    assert again is app.get("image.resize")
    with pytest.raises(ConfigurationError, match=r"declared twice.*differently"):
        app.declare("image.resize", Resize, queue=QueueOptions(delivery_limit=3))


PROGRAM = '''
from pydantic import BaseModel
from broker_jobs import App, AsyncPublisher, JobRequest, Publisher

class Resize(BaseModel):
    url: str

class Other(BaseModel):
    n: int

app = App(namespace="shop")
resize = app.declare("image.resize", Resize)

def send(publisher: Publisher) -> None:
    publisher.publish(resize, Resize(url="x"))
    publisher.publish("image.resize", {"url": "x"})
    publisher.publish_many([JobRequest(resize, Resize(url="y"))])
    publisher.publish(resize, Other(n=1))  # line 18: the wrong model

async def send_async(publisher: AsyncPublisher) -> None:
    await publisher.publish(resize, Resize(url="x"))
    await publisher.publish(resize, Other(n=1))  # line 22: the wrong model
'''


def test_mypy_outside_the_repo_sees_the_package_and_refuses_the_wrong_model(
    tmp_path: Path,
) -> None:
    """The installed package (an editable install here) is one that mypy follows,
    with its py.typed, from a program that is not in the repo."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "prog.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in found.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["18", "22"], found.stdout

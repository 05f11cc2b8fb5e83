"""amqps:// with a private CA given as ``cafile=``: the same URL works for the sync and
async publishers, the worker and the operator's commands (pika and aiormq read TLS
options differently: ``broker_jobs/amqp/tls.py``), a wrong CA is refused with a clear
error, and options that would work for one driver only or turn verification off are
refused. A node of its own with a TLS listener (about 6 s)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from broker_jobs import App, AsyncPublisher, BrokerConnectionError, ConfigurationError, Publisher
from broker_jobs.cli import main
from broker_jobs.store import SQLiteStore
from broker_jobs.store.memory import MemoryStore
from broker_jobs.testing.rabbit_node import RabbitNode
from broker_jobs.testing.tls import make_ca, make_server_certificates
from broker_jobs.urls import BrokerURLs
from tests.support import Broker, run_burst_worker

pytestmark = pytest.mark.broker


class Note(BaseModel):
    text: str


@pytest.fixture(scope="module")
def tls_node() -> Iterator[RabbitNode]:
    node = RabbitNode.create(prefix="bjtls")
    node.with_tls(make_server_certificates(node.base_dir / "tls"))
    node.start()
    try:
        yield node
    finally:
        node.cleanup()


def test_one_amqps_url_with_cafile_serves_publishers_worker_and_commands(
    tls_node: RabbitNode, tmp_path: Path
) -> None:
    url = tls_node.tls_url
    app = App(namespace="tls")
    ran: list[str] = []

    @app.task("note.add")
    def add(payload: Note) -> None:
        ran.append(payload.text)

    with Publisher(url, app) as publisher:  # pika
        publisher.publish("note.add", Note(text="sync"))

    async def publish_async() -> None:
        async with AsyncPublisher(url, app) as publisher:  # aio-pika
            await publisher.publish("note.add", Note(text="async"))

    asyncio.run(publish_async())
    outcomes = run_burst_worker(Broker(url), app, MemoryStore())  # aiormq
    assert sorted(ran) == ["async", "sync"]
    assert outcomes["succeeded"] == 2
    ledger = tmp_path / "ledger.db"
    SQLiteStore(ledger).close()
    status = CliRunner().invoke(
        main,
        ["status", "--url", url, "--namespace", "tls", "--task", "note.add",
         "--store", f"sqlite:///{ledger}", "--json"],
    )  # fmt: skip
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["tasks"][0]["queue"]["messages"] == 0


def test_a_wrong_ca_is_refused_by_every_driver_and_nothing_falls_back(
    tls_node: RabbitNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other_ca, _key = make_ca(tmp_path_factory.mktemp("other"), "other")
    url = tls_node.tls_url.split("?")[0] + f"?cafile={other_ca}"
    with pytest.raises(BrokerConnectionError, match=r"(?i)certificate"):
        Publisher(url, namespace="tls").connect()

    async def connect_async() -> None:
        await AsyncPublisher(url, namespace="tls").connect()

    with pytest.raises(BrokerConnectionError, match=r"(?i)certificate"):
        asyncio.run(connect_async())


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqps://h/?no_verify_ssl=1", "always verified"),
        ("amqps://h/?ssl_options=%7B%7D", "cafile="),
        ("amqp://h/?cafile=/ca.pem", "needs an amqps://"),
        ("amqps://h/?cafile=/no/such/ca.pem", "no such file"),
        ("amqps://h/?cafile=/etc/hostname&cafile=/etc/hostname", "given twice"),
    ],
)
def test_tls_options_for_one_driver_only_or_none_are_refused(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        BrokerURLs.parse(url)


def test_a_cafile_that_is_no_certificate_and_an_unknown_option_are_configuration_errors(
    tmp_path: Path,
) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="TLS files"):
        Publisher(f"amqps://guest:guest@127.0.0.1:1/?cafile={garbage}", namespace="t").connect()
    with pytest.raises(ConfigurationError, match="verify"):
        Publisher("amqp://guest:guest@127.0.0.1:1/?verify=none", namespace="t").connect()

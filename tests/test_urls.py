"""Credentials never leave the process: URL validation and masking."""

from __future__ import annotations

import pytest

from broker_jobs import ConfigurationError, mask_url
from broker_jobs.urls import BrokerURL, mask_text


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("amqp://app:s3cr3t@rabbit:5672/prod") == "amqp://app:***@rabbit:5672/prod"
    assert mask_url("amqps://app:p%40ss@rabbit/") == "amqps://app:***@rabbit/"
    assert mask_url("amqp://rabbit/") == "amqp://rabbit/"


def test_mask_text_hides_passwords_inside_messages() -> None:
    text = "failed: amqp://u:pw@h:1/v and amqps://x:y@z/"
    assert mask_text(text) == "failed: amqp://u:***@h:1/v and amqps://x:***@z/"


def test_broker_url_parts_and_masked_repr() -> None:
    url = BrokerURL("amqp://app:s3cr3t@rabbit:5673/prod%2Fa")
    assert (url.host, url.port, url.vhost) == ("rabbit", 5673, "prod/a")
    assert BrokerURL("amqps://h/").port == 5671
    assert BrokerURL("amqp://h").vhost == "/"
    assert "s3cr3t" not in repr(url)
    assert "s3cr3t" not in str(url)


@pytest.mark.parametrize(
    "bad",
    ["http://u:secret@h/", "rabbit:5672", "amqp://u:secret@/vhost", "amqp://u:secret@h:port/"],
)
def test_bad_urls_are_refused_masked(bad: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        BrokerURL(bad)
    assert "secret" not in str(caught.value)

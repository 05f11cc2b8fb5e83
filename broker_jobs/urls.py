"""AMQP URLs: validation and masking.

Every URL that reaches a log line or an error message goes through :func:`mask_url`
first, so a password never leaves the process.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from broker_jobs.errors import ConfigurationError

_SCHEMES = {"amqp": 5672, "amqps": 5671}


@dataclass(frozen=True)
class BrokerURL:
    """A validated AMQP URL. ``str()`` and ``repr()`` show it masked."""

    url: str

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in _SCHEMES:
            raise ConfigurationError(
                f"unsupported broker URL {mask_url(self.url)!r}: use amqp://user:password@"
                "host:5672/vhost, or amqps:// for TLS"
            )
        if not parts.hostname:
            raise ConfigurationError(f"broker URL {mask_url(self.url)!r} names no host")
        try:
            _ = parts.port
        except ValueError as error:
            raise ConfigurationError(f"broker URL {mask_url(self.url)!r}: {error}") from None

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or _SCHEMES[parts.scheme]

    @property
    def vhost(self) -> str:
        path = urlsplit(self.url).path
        return unquote(path[1:]) if len(path) > 1 else "/"

    @property
    def masked(self) -> str:
        return mask_url(self.url)

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"BrokerURL({self.masked!r})"


def mask_url(url: str) -> str:
    """``amqp://user:secret@host/`` -> ``amqp://user:***@host/``; other text unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


_URL_PASSWORD = re.compile(r"(amqps?://[^:/@\s]*):[^@\s]*@")


def mask_text(text: str) -> str:
    """Mask the password of every AMQP URL inside ``text`` (driver messages, reprs)."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


@dataclass(frozen=True)
class BrokerURLs:
    """The AMQP URLs of one broker: a single node, or several nodes of a cluster.

    Clients connect to the first node that answers, in the order given, and on a
    lost connection try the others (the node that was lost last). Build one with
    :meth:`parse` from a URL, a comma-separated list of URLs, or a sequence of
    either; a comma inside a password must be written ``%2C``.
    """

    urls: tuple[BrokerURL, ...]

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigurationError(
                "no broker URL given: use amqp://user:password@host:5672/vhost"
            )

    @classmethod
    def parse(cls, value: str | BrokerURL | BrokerURLs | Sequence[str | BrokerURL]) -> BrokerURLs:
        if isinstance(value, BrokerURLs):
            return value
        items = [value] if isinstance(value, str | BrokerURL) else list(value)
        urls: list[BrokerURL] = []
        for item in items:
            if isinstance(item, BrokerURL):
                urls.append(item)
                continue
            urls.extend(BrokerURL(part.strip()) for part in item.split(",") if part.strip())
        return cls(tuple(urls))

    @property
    def first(self) -> BrokerURL:
        return self.urls[0]

    def after(self, url: BrokerURL | None) -> tuple[BrokerURL, ...]:
        """The URLs to try after losing ``url``: the others in order, ``url`` last."""
        if url is None or url not in self.urls:
            return self.urls
        at = self.urls.index(url)
        return self.urls[at + 1 :] + self.urls[: at + 1]

    @property
    def masked(self) -> str:
        return ", ".join(url.masked for url in self.urls)

    def __iter__(self) -> Iterator[BrokerURL]:
        return iter(self.urls)

    def __len__(self) -> int:
        return len(self.urls)

    def __str__(self) -> str:
        return self.masked

    def __repr__(self) -> str:
        return f"BrokerURLs({self.masked!r})"

"""AMQP URLs: validation and masking.

Every URL that reaches a log line or an error message goes through :func:`mask_url`
first, so a password never leaves the process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from broker_jobs.errors import ConfigurationError

_SCHEMES = {"amqp": 5672, "amqps": 5671}


@dataclass(frozen=True)
class BrokerURL:
    """A validated AMQP URL. ``str()`` and ``repr()`` show it masked."""

    url: str

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url)
        except ValueError as error:  # an unclosed IPv6 bracket
            # Not shown: what cannot be split cannot be masked for sure either.
            raise ConfigurationError(
                f"a broker URL cannot be read ({error}): use"
                " amqp://user:password@host:5672/vhost, an IPv6 host in brackets: [::1]"
            ) from None
        if parts.scheme not in _SCHEMES:
            raise ConfigurationError(
                f"unsupported broker URL {mask_url(self.url)!r}: use amqp://user:password@"
                "host:5672/vhost, or amqps:// for TLS"
            )
        if not parts.hostname:
            raise ConfigurationError(f"broker URL {mask_url(self.url)!r} names no host")
        if "://" in parts.path or "://" in parts.query:
            # Another URL after a separator that did not split (http://, a typo):
            # not shown, since mask_url only masks this URL's own password.
            raise ConfigurationError(
                f"broker URL for host {parts.hostname!r} holds another URL after its host:"
                " separate broker URLs with commas, each starting amqp:// or amqps://"
            )
        if "," in parts.hostname:
            raise ConfigurationError(
                f"broker URL {mask_url(self.url)!r}: a host cannot contain a comma; give each"
                " node a URL of its own: amqp://user:password@host1/,amqp://user:password@host2/"
            )
        try:
            _ = parts.port
        except ValueError:
            # Not the parser's text: it quotes what it took for the port, which is part
            # of the password when the password holds a "/", "#" or "?".
            raise ConfigurationError(
                f"broker URL for host {parts.hostname!r}: what follows the host is not a port"
                " number; in a password, write / as %2F, # as %23, ? as %3F, @ as %40 and a"
                " space as %20"
            ) from None
        check_tls_query(parts.scheme.lower(), parts.query)
        if "@" in parts.path:
            # The rest of a list whose next URL lacks its scheme, or a password's "@"
            # unescaped: not shown, since it may hold a password.
            raise ConfigurationError(
                f"broker URL for host {parts.hostname!r}: its vhost holds an '@': start each"
                " URL of a list with amqp:// or amqps://, and write @ in a password as %40"
            )

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or _SCHEMES[parts.scheme]

    @property
    def user(self) -> str:
        return unquote(urlsplit(self.url).username or "")

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


#: The query options of an ``amqps`` URL that set its TLS (``broker_jobs/amqp/tls.py``).
TLS_OPTIONS = ("cafile", "certfile", "keyfile")
#: Query options refused, and why.
REFUSED = {
    "ssl_options": "pika's own form, which the worker's driver ignores: use cafile=,"
    " certfile= and keyfile=",
    "no_verify_ssl": "the broker's certificate is always verified: give its CA with"
    " cafile=/path/ca.pem",
}


def check_tls_query(scheme: str, query: str) -> None:
    """Refuse what :data:`REFUSED` names, and TLS options on a plain ``amqp`` URL
    (``broker_jobs/amqp/tls.py`` gives pika the TLS of the others)."""
    given = parse_qs(query)
    for option, why in REFUSED.items():
        if option in given:
            raise ConfigurationError(f"broker URL option {option}= is not supported: {why}")
    tls = [option for option in TLS_OPTIONS if option in given]
    if tls and scheme != "amqps":
        raise ConfigurationError(
            f"broker URL option {tls[0]}= sets TLS, which needs an amqps:// URL"
        )
    for option in tls:
        values = given[option]
        if len(values) > 1:  # the two drivers would take different ones
            raise ConfigurationError(f"broker URL option {option}= is given twice: give it once")
        if not os.path.isfile(values[0]):
            raise ConfigurationError(
                f"broker URL option {option}={values[0]}: no such file (a path on this host)"
            )


def mask_url(url: str) -> str:
    """``amqp://user:secret@host/`` -> ``amqp://user:***@host/``; other text unchanged.
    Text that does not split as such a URL (``user:secret@host``, ``amqp:/user:s@host``,
    a password with an unescaped ``/``, an unclosed ``[``) has whatever stands between
    a ``:`` and an ``@`` masked. A list of URLs (separated by commas) has each masked."""
    if _URL_SEPARATOR.search(url):
        return ",".join(_mask_one(part) for part in _URL_SEPARATOR.split(url))
    return _mask_one(url)


def _mask_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return _LOOSE_PASSWORD.sub(r"\1:***@", url)
    if parts.password is None:
        # An "@" beyond the host part: a password with an unescaped "/" or a URL
        # without "//" (not split as a URL would be), masked loosely.
        return (
            url if "@" in parts.netloc or "@" not in url else _LOOSE_PASSWORD.sub(r"\1:***@", url)
        )
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


#: The longest user name and password a mask looks across. Masking runs on every log
#: line, text from messages included: an unbounded ``[^@]*`` tried from each place
#: of a long line without an ``@`` is quadratic (a 40 KB key held a worker 15 s).
_PART = "{0,1024}"
_URL_PASSWORD = re.compile(rf"(amqps?://[^:/@\s]{_PART}):[^@\s]{_PART}@", re.IGNORECASE)
#: A ``user:password@`` anywhere: what a text that is not a well-formed URL may hold
#: (from the start of a run of user-name characters only: linear, as above).
_LOOSE_PASSWORD = re.compile(rf"((?<![^:/@\s])[^:/@\s]{_PART}):[^@\s]{_PART}@")


def mask_text(text: str) -> str:
    """Mask the password of every AMQP URL inside ``text`` (driver messages, reprs)."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


#: A comma followed by the next URL's scheme: where a list of URLs is split.
_URL_SEPARATOR = re.compile(r",(?=\s*amqps?://)", re.IGNORECASE)
#: Stripped from both ends of each URL of a list.
_AROUND = ", \t\r\n"


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
    def parse(cls, value: AnyBrokerURLs) -> BrokerURLs:
        """``value``: a URL, URLs separated by commas, or a sequence of either.

        A comma separates two URLs only where the next one starts (``amqp://`` or
        ``amqps://``): a piece of a password is never taken for a URL of its own,
        and so never shown unmasked in an error. Commas and spaces around the URLs
        are ignored.
        """
        if isinstance(value, BrokerURLs):
            return value
        items = [value] if isinstance(value, str | BrokerURL) else list(value)
        urls: list[BrokerURL] = []
        for item in items:
            if isinstance(item, BrokerURL):
                urls.append(item)
            elif isinstance(item, str):
                parts = (part.strip(_AROUND) for part in _URL_SEPARATOR.split(item))
                urls.extend(BrokerURL(part) for part in parts if part)
            else:
                raise ConfigurationError(
                    f"a broker URL must be a string, not {type(item).__name__}"
                )
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

    def starting_at(self, url: BrokerURL | None) -> BrokerURLs:
        """The same URLs, ``url`` first and the others after it in turn: the order
        for a second connection to the node a client is connected to."""
        if url is None or url not in self.urls:
            return self
        at = self.urls.index(url)
        return BrokerURLs(self.urls[at:] + self.urls[:at])

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


#: What clients take as their broker: a URL, URLs separated by commas, a sequence
#: of URLs, or :class:`BrokerURLs`.
AnyBrokerURLs = str | BrokerURL | BrokerURLs | Sequence[str | BrokerURL]

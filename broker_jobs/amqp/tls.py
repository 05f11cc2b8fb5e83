"""TLS of ``amqps://`` URLs, read alike by every connection of broker-jobs.

aiormq (the worker, the async publisher, beat) reads ``cafile``, ``certfile`` and
``keyfile`` from an ``amqps`` URL's query; pika (the sync publisher, the operator's
commands) reads none of them and takes a ``ssl_options`` dict instead, which aiormq
ignores. So a private CA given one way worked for half of the processes. These three
options are the documented ones (docs/operations.md, "TLS"): pika is given an
``ssl.SSLContext`` made from them here, and the options that would work for one
driver only, or turn verification off, are refused with a message saying what to
write instead.
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pika

from broker_jobs.errors import ConfigurationError
from broker_jobs.urls import TLS_OPTIONS


def tls_context(url: str) -> ssl.SSLContext | None:
    """The context of an ``amqps`` URL: the system's CAs, or its ``cafile``, and its
    client certificate when it gives one; None for ``amqp``."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "amqps":
        return None
    given = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    try:
        context = ssl.create_default_context(cafile=given.get("cafile"))
        if "certfile" in given:
            context.load_cert_chain(given["certfile"], given.get("keyfile"))
    except (OSError, ssl.SSLError) as error:
        raise ConfigurationError(
            f"the TLS files of broker URL for host {parts.hostname!r} cannot be used: {error}"
        ) from None
    return context


def pika_parameters(url: str) -> pika.URLParameters:
    """pika's parameters for ``url``, with its TLS from :func:`tls_context` (the
    options pika does not know taken out of the query)."""
    parts = urlsplit(url)
    kept = [(k, v) for k, vs in parse_qs(parts.query).items() if k not in TLS_OPTIONS for v in vs]
    try:
        parameters = pika.URLParameters(urlunsplit(parts._replace(query=urlencode(kept))))
    except ValueError as error:  # an option pika does not know, or a bad value of one
        raise ConfigurationError(
            f"broker URL for host {parts.hostname!r}: {error}; TLS takes cafile=, certfile="
            " and keyfile=, and the other options are pika's (heartbeat=, ...)"
        ) from None
    context = tls_context(url)
    if context is not None:
        parameters.ssl_options = pika.SSLOptions(context, server_hostname=parts.hostname)
    return parameters
